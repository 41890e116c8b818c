"""`gbroker config check`: load a settings file as the daemon would, and print what it resolves to."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from typing import Any

import click

from broker.cli.main import Context

pass_ctx = click.make_pass_decorator(Context)

SECRET_FIELDS = ("db_url",)


@click.group("config")
def config() -> None:
    """The daemon's settings file."""


@config.command("check")
@click.argument("path", required=False, metavar="[FILE]")
@click.option("--json", "as_json", is_flag=True, help="Print the resolved settings as JSON.")
@pass_ctx
def check(ctx: Context, path: str | None, as_json: bool) -> None:
    """Check FILE (default: --config, $GBROKER_CONFIG or /etc/gbroker/gbroker.toml) and print the resolved
    settings: defaults < file < environment (a GBROKER_ variable it does not know is noted). A FILE named here, with --config or in $GBROKER_CONFIG must
    exist; the default may be missing (the daemon then runs on defaults and the environment). Beyond the file's own keys it
    checks what the daemon checks at start: the policy, hook_user, the node provider and its settings, and
    (run as root) the dashboard proxy's secret file. Exits 0 when the daemon would accept it; else prints what is
    wrong and how to fix it, and exits with the configuration error's code."""
    from broker.config import DEFAULT_CONFIG_PATH, env_notes, load_settings

    named = path or ctx.config_path
    target = named or os.environ.get("GBROKER_CONFIG") or str(DEFAULT_CONFIG_PATH)
    settings = load_settings(named)  # a ConfigError becomes "gbroker: error: ... hint: ..." and its exit code
    notes = start_checks(settings) + env_notes()
    resolved = resolved_dict(settings)
    if as_json:
        click.echo(json.dumps({"file": target, "ok": True, "notes": notes, "settings": resolved},
                              indent=2, sort_keys=True))
        return
    exists = os.path.exists(target)
    click.echo(f"{target}: ok" + ("" if exists else " (no such file: defaults and environment only)"))
    for note in notes:
        click.echo(f"  note: {note}")
    for key, value in resolved.items():
        click.echo(f"  {key} = {json.dumps(value, sort_keys=True)}")


def start_checks(settings: Any) -> list[str]:
    """What the daemon checks only when it starts, checked now (each raises its ConfigError);
    returns what could not be checked from here, to be said, not skipped in silence."""
    from broker.nodes.providers.base import checked_class
    from broker.wiring import check_hook_user, make_policy

    make_policy(settings)
    notes = [w for w in [check_hook_user(settings)] if w]
    if settings.node_provider:
        checked_class(settings.node_provider, settings.provider_settings())
    if settings.web.trust_proxy_header and settings.metrics.enabled:  # as the daemon: read only with the dashboard
        if os.geteuid() == 0:
            from broker.web.app import read_proxy_secret

            read_proxy_secret(settings.web.proxy_secret_file)
        else:
            notes.append(f"[web] proxy_secret_file {settings.web.proxy_secret_file} not checked: "
                         "it is readable by root alone; run gbroker config check as root to check it")
    return notes


def resolved_dict(settings: Any) -> dict[str, Any]:
    """The settings as plain data, the database password and webhook secrets hidden."""
    out: dict[str, Any] = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if f.name == "db_url":
            value = _redact(value)
        elif f.name == "node_provider_settings":
            value = json.loads(value)
        elif f.name == "pools":
            value = [p.name for p in settings.catalog().pools]
            out["pools"] = value
            continue
        elif f.name == "notify":
            value = {
                "targets": {t.name: t.public() for t in value.targets},
                "subscriptions": [asdict(s) for s in value.subscriptions],
                "tick_seconds": value.tick_seconds, "max_tries": value.max_tries,
                "backoff_seconds": value.backoff_seconds, "backoff_max_seconds": value.backoff_max_seconds,
                "timeout_seconds": value.timeout_seconds,
            }
        elif f.name == "metrics":
            value = ({"listen": f"{value.host}:{value.port}" if ":" not in value.host else f"[{value.host}]:{value.port}",
                      "allow_remote": value.allow_remote, "ready_tick_age_seconds": value.ready_tick_age_seconds}
                     if value.enabled else {"listen": "off"})
        elif f.name == "web":
            value = asdict(value)
        elif isinstance(value, tuple):
            value = [asdict(v) if hasattr(v, "__dataclass_fields__") else v for v in value]
        out[f.name] = value
    return out


def _redact(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
