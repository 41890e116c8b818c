"""`gbroker node ...`: Slurm's power hooks, the node list and the node cost report.

Thin like the rest of the CLI (no ORM). The hooks (`resume`, `suspend`,
`resume-fail`) hand the node names to the daemon, which records the node
events and calls the provider. When the daemon does not answer they call the
provider themselves, with the steps the daemon uses (``broker.nodes.power``),
and append what they did to the node journal, which the daemon ingests on its
next tick: a hook never fails because the daemon is down, and no billing
event is lost.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from typing import Any

import click

from broker.cli.main import Context
from broker.cli.output import duration, print_json, print_table
from broker.errors import DaemonUnavailable, SlurmError

pass_ctx = click.make_pass_decorator(Context)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")

HOOK_TIMEOUT_SECONDS = 120.0
"""How long a hook waits for the daemon before doing the work itself."""
OPS = {"resume": "node_resume", "suspend": "node_suspend", "resume_fail": "node_resume_fail"}



@click.group()
def node() -> None:
    """Cloud nodes: Slurm's Resume/SuspendProgram hooks, node list, idle node cost."""


# -- hooks ----------------------------------------------------------------------------


def _hook(ctx: Context, action: str, hostlists: tuple[str, ...], as_json: bool) -> None:
    from broker.client import call
    from broker.nodes.providers.hooks import expand_hostlists, new_key

    names = expand_hostlists(hostlists)
    key = new_key()
    try:
        result = call(ctx.socket, OPS[action], timeout=HOOK_TIMEOUT_SECONDS, nodes=names, key=key)
        result["via"] = "daemon"
    except DaemonUnavailable as exc:
        if os.geteuid() != 0:
            raise  # only Slurm's hooks (root) may act without the daemon's say
        click.echo(f"gbroker node {action.replace('_', '-')}: daemon unavailable ({exc.message}); "
                   "calling the provider directly and journaling", err=True)
        result = _direct(ctx, action, names, key)
        result["via"] = "journal"
    if as_json:
        print_json(result)
    else:
        for name in names:
            if name in result.get("failed", {}):
                click.echo(f"{name}: FAILED: {result['failed'][name]}")
            elif action == "resume":
                click.echo(f"{name}: {result.get('resumed', {}).get(name) or 'requested'} ({result['via']})")
            else:
                click.echo(f"{name}: suspended ({result['via']})")
    if result.get("failed"):
        sys.exit(8)


def _direct(ctx: Context, action: str, names: list[str], key: str) -> dict[str, Any]:
    """The daemon is down: do the provider's part here and journal it for billing (``broker.nodes.power``)."""
    from broker.config import load_settings
    from broker.nodes import power
    from broker.nodes.providers import hooks
    from broker.slurm.cli_backend import CliBackend

    settings = load_settings(ctx.config_path)
    provider = hooks.make_provider(settings)
    at = datetime.now(UTC)
    if action != "resume":
        # An error exits non-zero: nothing was terminated, nothing to journal.
        return power.suspend_unattended(settings, provider, action, names, key, at)
    return power.resume_unattended(settings, provider, CliBackend(), names, key, at,
                                   facts_warn=_facts_warning, down_warn=_down_warning)


def _facts_warning(exc: SlurmError) -> None:
    click.echo(f"gbroker node: cannot read node partitions from Slurm ({exc.message}); using defaults", err=True)


def _down_warning(names: list[str], exc: SlurmError) -> None:
    click.echo(f"gbroker node: could not mark {', '.join(names)} down: {exc.message}", err=True)


@node.command("resume")
@click.argument("hostlist", nargs=-1, required=True)
@json_option
@pass_ctx
def resume(ctx: Context, hostlist: tuple[str, ...], as_json: bool) -> None:
    """ResumeProgram: make instances exist for HOSTLIST (e.g. spot[1-2]). Safe to run twice."""
    _hook(ctx, "resume", hostlist, as_json)


@node.command("suspend")
@click.argument("hostlist", nargs=-1, required=True)
@json_option
@pass_ctx
def suspend(ctx: Context, hostlist: tuple[str, ...], as_json: bool) -> None:
    """SuspendProgram: terminate the instances behind HOSTLIST and stop billing them."""
    _hook(ctx, "suspend", hostlist, as_json)


@node.command("resume-fail")
@click.argument("hostlist", nargs=-1, required=True)
@json_option
@pass_ctx
def resume_fail(ctx: Context, hostlist: tuple[str, ...], as_json: bool) -> None:
    """ResumeFailProgram: Slurm gave up on HOSTLIST booting; terminate what half-booted."""
    _hook(ctx, "resume_fail", hostlist, as_json)


# -- views ----------------------------------------------------------------------------


@node.command("list")
@json_option
@pass_ctx
def node_list(ctx: Context, as_json: bool) -> None:
    """Nodes of the managed partitions: power, capacity, price, idle since, users."""
    rows = ctx.call("node_list")
    if as_json:
        print_json(rows)
        return
    print_table(
        [
            (r["node"], ",".join(r["partitions"]), r["state"], r["capacity"],
             r.get("price", ""),
             duration(r["billed_s"]) if r["resumed_at"] else "", (r["idle_since"] or "")[11:19],
             ",".join(r["users"]), r["note"] or r["reason"])
            for r in rows
        ],  # fmt: skip
        ["NODE", "PARTITIONS", "STATE", "CAPACITY", "PRICE", "BILLED", "IDLE SINCE", "USERS", "NOTE"],
    )


@node.command("report")
@click.option("--since", metavar="WHEN",
              help="Start: 2026-09-01, an ISO time, or -7d/-12h (a date or a time without an offset is UTC).")
@click.option("--until", metavar="WHEN", help="End, in the same forms (default now).")
@json_option
@pass_ctx
def report(ctx: Context, since: str | None, until: str | None, as_json: bool) -> None:
    """Billed node time per partition: node-hours, busy and idle node-hours, idle cost."""
    data = ctx.call("node_report", since=since, until=until)
    if as_json:
        print_json(data)
        return
    click.echo(f"Node time from {data['since'] or 'the start'} to {data['until']}")
    print_table(
        [
            (r["partition"], r["sessions"], r["node_hours"], r["busy_hours"], r["idle_hours"], r["cost"],
             r["idle_cost"], f"{r['unpriced_s']}s" if r["unpriced_s"] else "")
            for r in data["partitions"]
        ],  # fmt: skip
        ["PARTITION", "POWER-UPS", "NODE-H", "BUSY NODE-H", "IDLE NODE-H", "COST", "IDLE COST", "UNPRICED"],
    )


@node.command("tick")
@json_option
@pass_ctx
def tick(ctx: Context, as_json: bool) -> None:
    """Run the node manager once now (release, sweep, interruptions); admins only."""
    data = ctx.call("node_tick")
    if as_json:
        print_json(data)
        return
    for key in ("released", "powered_up", "terminated", "marked_down", "interrupted"):
        if data.get(key):
            click.echo(f"{key.replace('_', ' ')}: {', '.join(data[key])}")
    if data.get("error"):
        click.echo(f"error: {data['error']}")



