"""`gbroker report`: spend per group, user, kind, partition, pool or GPU type, as a table, CSV or JSON; burn-down charts."""

from __future__ import annotations

import click

from broker.cli.main import Context
from broker.cli.output import client_of, print_json
from broker.errors import SpecError

pass_ctx = click.make_pass_decorator(Context)


@click.command("report")
@click.option("--semester", "semester_name", help="Semester [default: the one in force].")
@click.option("--by", type=click.Choice(["group", "user", "kind", "partition", "pool", "gpu"]), default="group",
              show_default=True, help="Rows per group, user, job kind, Slurm partition, pool, or GPU type.")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="A table to read, CSV for a spreadsheet, or JSON (as --json).")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, writable=True), metavar="FILE.png",
              help="Also draw the budget burn-down per group, with the forecast, into FILE.png.")
@pass_ctx
def report(ctx: Context, semester_name: str | None, by: str, fmt: str, as_json: bool, plot_path: str | None) -> None:
    """Spend, GPU-hours, spot share, money saved against all on-demand and lost to reclaims.

    \b
    Examples:
      gbroker report --semester 2026-fall --by group
      gbroker report --by user --format csv > spend.csv
      gbroker report --by pool
      gbroker report --plot burn.png

    Users see their own groups; admins see all.
    """
    from broker.report.render import report_csv, report_table

    if as_json and fmt not in ("table", "json"):
        raise SpecError(f"--json and --format {fmt} ask for two formats", hint="give one of them")

    client = client_of(ctx)
    data = client.report(semester=semester_name, by=by).raw
    if as_json or fmt == "json":
        print_json(data)
    elif fmt == "csv":
        click.echo(report_csv(data), nl=False)
    else:
        click.echo(report_table(data))
    if plot_path:
        from broker.report.plot import plot_burndown

        n = plot_burndown(client.burndown(semester=semester_name), plot_path)
        click.echo(f"burn-down of {n} group(s) written to {plot_path}", err=True)
