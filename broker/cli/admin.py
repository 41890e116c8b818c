"""Admin commands: semesters, groups, quotas, the price book, budgets.

Thin: parse, ask the daemon, print. The daemon checks that the caller is an
admin (root or a member of the configured admin group) from the uid the
kernel reports; the CLI does not decide anything.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from broker.cli.main import Context
from broker.cli.params import WHOLE
from broker.cli.output import print_json, print_table
from broker.errors import SpecError

pass_ctx = click.make_pass_decorator(Context)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _count(value: str, flag: str) -> int | None:
    """'8' -> 8, 'none' -> None (no limit)."""
    if value.lower() in ("none", "unlimited", "-"):
        return None
    if not (value.isascii() and value.isdigit()):
        raise SpecError(f"{flag}: expected a number of GPUs or 'none', got {value!r}")
    return int(value)


# -- semester -----------------------------------------------------------------------
@click.group()
def semester() -> None:
    """Semesters: the periods budgets are set for (they never overlap)."""


@semester.command("add")
@click.argument("name")
@click.option("--start", required=True, metavar="DATE", help="First day, from local midnight in the settings' timezone, e.g. 2026-09-01.")
@click.option("--end", required=True, metavar="DATE", help="Last day, inclusive (to midnight in the settings' timezone), e.g. 2027-01-31.")
@json_option
@pass_ctx
def semester_add(ctx: Context, name: str, start: str, end: str, as_json: bool) -> None:
    """Add a semester, e.g. `gbroker semester add 2026-fall --start 2026-09-01 --end 2027-01-31`."""
    sem = ctx.call("semester_add", name=name, start=start, end=end)
    if as_json:
        print_json(sem)
    else:
        click.echo(f"Semester {sem['name']}: {sem['starts_at']} .. {sem['ends_at']} (end exclusive)")


@semester.command("list")
@json_option
@pass_ctx
def semester_list(ctx: Context, as_json: bool) -> None:
    """List semesters."""
    sems = ctx.call("semester_list")
    if as_json:
        print_json(sems)
        return
    print_table([[s["name"], s["starts_at"], s["ends_at"], "*" if s["current"] else ""] for s in sems],
                ["SEMESTER", "STARTS", "ENDS (EXCLUSIVE)", "NOW"])


# -- group ----------------------------------------------------------------------------
@click.group()
def group() -> None:
    """Research groups: a name, the Slurm account jobs are charged to, and members."""


@group.command("add")
@click.argument("name")
@click.option("--account", help="Slurm account [default: the group name].")
@click.option("--member", "members", multiple=True, metavar="USER", help="A member (repeatable).")
@json_option
@pass_ctx
def group_add(ctx: Context, name: str, account: str | None, members: tuple[str, ...], as_json: bool) -> None:
    """Add a group, e.g. `gbroker group add vision --member alice --member bob`."""
    g = ctx.call("group_add", name=name, account=account, members=list(members))
    _print_groups([g], as_json)


@group.command("members")
@click.argument("name")
@click.option("--add", "add", multiple=True, metavar="USER", help="Add a member (repeatable).")
@click.option("--remove", "remove", multiple=True, metavar="USER", help="Remove a member (repeatable).")
@json_option
@pass_ctx
def group_members(ctx: Context, name: str, add: tuple[str, ...], remove: tuple[str, ...], as_json: bool) -> None:
    """Add or remove members of a group."""
    g = ctx.call("group_members", name=name, add=list(add), remove=list(remove))
    _print_groups([g], as_json)


@group.command("list")
@json_option
@pass_ctx
def group_list(ctx: Context, as_json: bool) -> None:
    """List groups (yours; admins: all)."""
    _print_groups(ctx.call("group_list"), as_json)


def _limit(v: Any) -> str:
    return "-" if v is None else str(v)


def _print_groups(groups: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print_json(groups)
        return
    print_table(
        [[g["name"], g["account"], ",".join(g["members"]), _limit(g["max_gpus"]), _limit(g["max_ondemand_gpus"]),
          _limits(g.get("limits") or {})]
         for g in groups],
        ["GROUP", "ACCOUNT", "MEMBERS", "MAX GPUS", "MAX ON-DEMAND", "LIMITS"],
    )


def _limits(limits: dict[str, Any]) -> str:
    """{'class:spot': 12, 'gpu:a100': 4} -> 'spot=12 a100=4' ('-' for none)."""
    return " ".join(f"{key.partition(':')[2]}={value}" for key, value in limits.items()) or "-"


# -- quota --------------------------------------------------------------------------------
@click.group()
def quota() -> None:
    """Quotas: the most GPUs a group may have queued or running at once."""


@quota.command("set")
@click.argument("group_name", metavar="GROUP")
@click.option("--gpus", metavar="N|none", help="GPUs at once, in total.")
@click.option("--ondemand-gpus", metavar="N|none", help="GPUs at once on on-demand.")
@click.option("--class-gpus", multiple=True, metavar="CLASS=N|none",
              help="GPUs at once on a capacity class (owned, reserved, spot, ondemand); repeatable.")
@click.option("--type-gpus", multiple=True, metavar="TYPE=N|none",
              help="GPUs at once of a GPU type (a100, l4, ...); repeatable.")
@json_option
@pass_ctx
def quota_set(ctx: Context, group_name: str, gpus: str | None, ondemand_gpus: str | None,
              class_gpus: tuple[str, ...], type_gpus: tuple[str, ...], as_json: bool) -> None:
    """Set a group's quota, e.g. `gbroker quota set vision --gpus 16 --ondemand-gpus 4
    --class-gpus spot=12 --type-gpus a100=4` ('none' = no limit). A limit not given stays as it was."""
    args: dict[str, Any] = {}
    if gpus is not None:
        args["max_gpus"] = _count(gpus, "--gpus")
    if ondemand_gpus is not None:
        args["max_ondemand_gpus"] = _count(ondemand_gpus, "--ondemand-gpus")
    limits: dict[str, int | None] = {}
    for kind, flag, items in (("class", "--class-gpus", class_gpus), ("gpu", "--type-gpus", type_gpus)):
        for item in items:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise SpecError(f"{flag}: expected NAME=N or NAME=none, got {item!r}", hint=f"e.g. {flag} spot=16"
                                if kind == "class" else f"e.g. {flag} a100=8")
            key = f"{kind}:{name.strip().lower()}"
            if key in limits:
                raise SpecError(f"{flag} {name.strip()} is given twice", hint="give each limit once")
            limits[key] = _count(value.strip(), flag)
    if limits:
        args["limits"] = limits
    if not args:
        raise SpecError("give --gpus, --ondemand-gpus, --class-gpus and/or --type-gpus",
                        hint="e.g. gbroker quota set vision --gpus 16")
    g = ctx.call("quota_set", group=group_name, **args)
    _print_groups([g], as_json)


@quota.command("list")
@json_option
@pass_ctx
def quota_list(ctx: Context, as_json: bool) -> None:
    """Quotas and GPUs in use now."""
    rows = ctx.call("quota_list")
    if as_json:
        print_json(rows)
        return
    print_table(
        [[g["name"], f"{g['in_use_gpus']}/{_limit(g['max_gpus'])}",
          f"{g['in_use_ondemand_gpus']}/{_limit(g['max_ondemand_gpus'])}", _limits_in_use(g)] for g in rows],
        ["GROUP", "GPUS IN USE/MAX", "ON-DEMAND IN USE/MAX", "PER CLASS/TYPE IN USE/MAX"],
    )


def _limits_in_use(group: dict[str, Any]) -> str:
    """Each per-class and per-type limit with its use: 'spot=3/16 a100=0/8' ('-' for none)."""
    used = group.get("in_use_by", {})
    return " ".join(f"{key.partition(':')[2]}={used.get(key, 0)}/{value}"
                    for key, value in group.get("limits", {}).items()) or "-"


# -- price -----------------------------------------------------------------------------------
@click.group()
def price() -> None:
    """The price book: price per GPU-hour per partition and capacity, from a date on."""


@price.command("set")
@click.argument("partition")
@click.option("--capacity", type=click.Choice(["owned", "reserved", "spot", "ondemand"]), required=True,
              help="The capacity class the price is for.")
@click.option("--price", "amount", required=True, metavar="AMOUNT", help="Per GPU-hour, e.g. 0.918.")
@click.option("--from", "effective", default="now", show_default=True, metavar="WHEN",
              help="When it takes effect: 2026-09-01, 2026-09-01T08:00:00Z, now, +10m (a date or a time "
                   "without an offset is UTC).")
@json_option
@pass_ctx
def price_set(ctx: Context, partition: str, capacity: str, amount: str, effective: str, as_json: bool) -> None:
    """Add a price, e.g. `gbroker price set spot --capacity spot --price 0.918 --from 2026-09-01`.

    PARTITION may be '*' for every partition of that capacity without its own price.
    """
    _print_import(ctx.call("price_set", partition=partition, capacity=capacity, price=amount, effective=effective),
                  as_json)


@price.command("import")
@click.argument("csv_file", type=click.Path(exists=True, dir_okay=False))
@json_option
@pass_ctx
def price_import(ctx: Context, csv_file: str, as_json: bool) -> None:
    """Import prices from CSV: partition,capacity,price_per_gpu_hour,effective_from (see docs/BUDGETS.md).

    All rows or none; rows already in the book are skipped, so importing the same file twice is safe.
    """
    try:
        text = Path(csv_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read {csv_file}: {exc}", hint="check the path; the file must be UTF-8") from None
    _print_import(ctx.call("price_import", csv_text=text), as_json)


def _print_import(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(result)
        return
    for p in result["added"]:
        click.echo(f"added {p['partition']} ({p['capacity']}): {p['price']} per GPU-hour from {p['effective_from']}")
    if result["unchanged"]:
        click.echo(f"{result['unchanged']} price(s) already in the book, unchanged")


@price.command("list")
@json_option
@pass_ctx
def price_list(ctx: Context, as_json: bool) -> None:
    """The price book ('*' marks the prices in force now)."""
    rows = ctx.call("price_list")
    if as_json:
        print_json(rows)
        return
    print_table([[p["partition"], p["capacity"], p["price"], p["effective_from"], "*" if p["in_force"] else ""]
                 for p in rows], ["PARTITION", "CAPACITY", "PER GPU-HOUR", "FROM", "NOW"])


# -- budget ------------------------------------------------------------------------------------
@click.group()
def budget() -> None:
    """Budgets: money per group per semester, alerts, and what happens at 100 %."""


@budget.command("set")
@click.argument("group_name", metavar="GROUP")
@click.option("--semester", "semester_name", required=True, help="Semester name, e.g. 2026-fall.")
@click.option("--amount", metavar="AMOUNT", help="Budget, e.g. 12000 or 12000.50 (needed for a new budget).")
@click.option("--thresholds", metavar="PCTS",
              help="Alert at these percentages of spend [new budget: 50,80,100].")
@click.option("--at-limit-pending", type=click.Choice(["hold", "keep"]),
              help="At the limit: hold pending jobs in Slurm (released when raised) or keep them queued "
                   "[new budget: hold].")
@click.option("--at-limit-running", type=click.Choice(["finish", "cancel"]),
              help="At 100 % spent: let running jobs finish, or cancel them [new budget: finish].")
@click.option("--alert-command", metavar="COMMAND",
              help="Run on an alert (absolute path and arguments; details on stdin as JSON). '' clears it.")
@click.option("--alert-url", metavar="URL", help="POST alerts as JSON to this URL. '' clears it.")
@json_option
@pass_ctx
def budget_set(
    ctx: Context, group_name: str, semester_name: str, amount: str | None, thresholds: str | None,
    at_limit_pending: str | None, at_limit_running: str | None, alert_command: str | None,
    alert_url: str | None, as_json: bool,
) -> None:
    """Set or change a budget, e.g. `gbroker budget set vision --semester 2026-fall --amount 12000`.

    New submissions that would pass the budget are always refused. On an existing budget an option left
    out stays as it was.
    """
    args: dict[str, Any] = {"group": group_name, "semester": semester_name, "amount": amount,
                            "thresholds": thresholds, "alert_url": alert_url}
    if at_limit_pending is not None:
        args["hold_pending"] = at_limit_pending == "hold"
    if at_limit_running is not None:
        args["cancel_running"] = at_limit_running == "cancel"
    if alert_command is not None:
        try:
            args["alert_command"] = shlex.split(alert_command)
        except ValueError as exc:
            raise SpecError(f"--alert-command {alert_command!r} cannot be split into arguments ({exc})",
                            hint="close every quote; the command is split as a shell would, but no shell runs it") \
                from None
    b = ctx.call("budget_set", **args)
    if as_json:
        print_json(b)
        return
    click.echo(f"Budget of {b['group']} in {b['semester']}: {b['amount']} (spent {b['spent']}, "
               f"reserved {b['reserved']}, left {b['left']}); alerts at {b['thresholds']} %")
    pending = "hold pending jobs" if b["hold_pending"] else "keep pending jobs queued"
    running = "cancel running jobs" if b["cancel_running"] else "let running jobs finish"
    click.echo(f"  at the limit: refuse new jobs, {pending}, {running}")
    if b.get("held_now"):
        click.echo(f"  {b['group']} is at its limit: {b['held_now']} of its waiting jobs held now")


@budget.command("show")
@click.option("--semester", "semester_name", help="Semester [default: the one in force].")
@click.option("--window", "window_days", type=float, default=7.0, show_default=True, metavar="DAYS",
              help="Burn rate over this many recent days.")
@json_option
@pass_ctx
def budget_show(ctx: Context, semester_name: str | None, window_days: float, as_json: bool) -> None:
    """Where each group stands: spent, reserved, left, burn rate and forecast (yours; admins: all)."""
    from broker.report.render import budget_table

    data = ctx.call("budget_list", semester=semester_name, window_days=window_days)
    if as_json:
        print_json(data)
    else:
        click.echo(budget_table(data["budgets"], data["semester"]))


@budget.command("ledger")
@click.option("--semester", "semester_name", help="Only this semester.")
@click.option("--group", "group_name", help="Only this group.")
@click.option("--job", "job_id", type=WHOLE, help="Only this gbroker job.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="A table to read, CSV for a spreadsheet, or JSON.")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@pass_ctx
def budget_ledger(ctx: Context, semester_name: str | None, group_name: str | None, job_id: int | None,
                  fmt: str, as_json: bool) -> None:
    """The ledger lines themselves: one per run and price period (yours; admins: all)."""
    from broker.report.render import ledger_csv, ledger_table

    if as_json and fmt not in ("table", "json"):
        raise SpecError(f"--json and --format {fmt} ask for two formats", hint="give one of them")
    lines = ctx.call("ledger", semester=semester_name, group=group_name, job_id=job_id)
    if fmt == "json" or as_json:
        print_json(lines)
    elif fmt == "csv":
        click.echo(ledger_csv(lines), nl=False)
    else:
        click.echo(ledger_table(lines))
