"""SIGHUP: read the settings file again and apply what can change while the daemon runs.

Reloaded: notification targets and subscriptions, the readiness limit, the
time zone, the currency, the alert user, the Slurm-down backoff ceiling and
the node release timings. Everything else (database, socket, policy, tick
intervals, pools, the listener's address) is read once at start: a change
there is logged as needing a restart, and the running values stay. A file
that no longer loads changes nothing: the error is logged and the daemon
goes on with what it had.
"""

from __future__ import annotations

import logging
from dataclasses import fields, replace
from typing import Any

from broker.config import Settings

log = logging.getLogger(__name__)

RELOADABLE = (
    "notify",
    "timezone",
    "currency",
    "hook_user",
    "backoff_max_seconds",
    "node_idle_seconds",
    "node_sweep_grace_seconds",
)
METRICS_RELOADABLE = ("ready_tick_age_seconds",)


def merge(old: Settings, new: Settings) -> tuple[Settings, list[str], list[str]]:
    """(the settings to run with, names applied, names that need a restart)."""
    applied: list[str] = []
    restart: list[str] = []
    changes: dict[str, Any] = {}
    for f in fields(Settings):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a == b:
            continue
        if f.name in RELOADABLE:
            changes[f.name] = b
            applied.append(f.name)
        elif f.name == "metrics":
            kept = replace(a, **{k: getattr(b, k) for k in METRICS_RELOADABLE})
            if kept != a:
                applied.append("metrics.ready_tick_age_seconds")
                changes["metrics"] = kept
            if kept != b:
                restart.append("metrics.listen")
        else:
            restart.append(f.name)
    return replace(old, **changes), applied, restart


def reload_settings(old: Settings, load: Any) -> Settings:
    """``load()`` the settings again and merge; on any error keep ``old`` and log why."""
    from broker.errors import BrokerError

    try:
        new = load()
    except BrokerError as exc:
        log.error("reload refused, keeping the running settings: %s%s", exc.message,
                  f" (hint: {exc.hint})" if exc.hint else "")
        return old
    merged, applied, restart = merge(old, new)
    if applied:
        log.warning("settings reloaded: %s", ", ".join(applied))
    else:
        log.warning("settings reloaded: nothing that can change at run time changed")
    if restart:
        log.warning("changed in the file but read only at start (restart the daemon to apply): %s",
                    ", ".join(restart))
    return merged
