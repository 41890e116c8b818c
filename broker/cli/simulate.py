"""`gbroker simulate`: replay spot traces to compare placement policies.

Single-job mode (the default) runs one job of W hours with a deadline of D
hours from many start offsets of each trace; workload mode (``--workload``)
runs a file of jobs on a cluster whose spot capacity follows one trace.
The policies are the very objects the daemon uses.
"""

from __future__ import annotations

import json
import sys
import time
from decimal import Decimal, InvalidOperation

import click

from broker.errors import SpecError
from broker.amount import MICROS_PER_UNIT
from broker.cli.params import WHOLE, PolicyOption


def _hours_to_s(h: float, what: str, allow_zero: bool = False) -> int:
    if h < 0 or (h == 0 and not allow_zero):
        raise click.BadParameter(f"{what} must be {'>= 0' if allow_zero else '> 0'} hours, got {h}")
    return int(round(Decimal(str(h)) * 3600))


def _price(text: str, what: str) -> int:
    try:
        d = Decimal(text)
    except InvalidOperation:
        raise click.BadParameter(f"{what}: not a price in USD per instance-hour: {text!r}") from None
    if not d.is_finite() or d < 0:
        raise click.BadParameter(f"{what}: a price must be a number >= 0, got {text!r}")
    return int((d * MICROS_PER_UNIT).to_integral_value())


@click.command("simulate")
@click.option("--trace", "traces", multiple=True, required=True, metavar="PATH",
              help="Spot trace JSON file, or a folder searched for *.json. Repeat for more.")
@click.option("--policy", "policy_list", default="greedy,uniform-progress,gbroker,omniscient",
              show_default=True, metavar="NAME[,NAME...]",
              cls=PolicyOption, help="Policies to compare, of: {policies}.")
@click.option("--work-hours", type=float, default=48.0, show_default=True, help="W: hours of work.")
@click.option("--deadline-hours", type=float,
              help="D: hours from submission to the deadline (needed except with --workload).")
@click.option("--changeover-hours", type=float, default=0.2, show_default=True,
              help="d: hours lost each time the job starts on a new instance (incl. work since the last checkpoint).")
@click.option("--spot-price", default="0.918", show_default=True, help="USD per instance-hour on spot.")
@click.option("--ondemand-price", default="3.06", show_default=True, help="USD per instance-hour on on-demand.")
@click.option("--oracle-trace-prices", "oracle_trace_prices", is_flag=True,
              help="ORACLE, not a fair comparison: hand every policy the mean of the trace's own spot "
                   "prices over the job's future window, where the trace has prices.")
@click.option("--nodes", type=WHOLE, default=1, show_default=True,
              help="Instances the job needs at once (a gang is reclaimed when any node is).")
@click.option("--starts", type=WHOLE, default=100, show_default=True, help="Start offsets per trace.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for start offsets (reproducible).")
@click.option("--workers", type=WHOLE, default=1, show_default=True, help="Processes to use.")
@click.option("--pools", "pools", is_flag=True,
              help="Several spot pools: the traces (time-aligned, one per pool) are the pools of one job; "
                   "--spot-price may list one price per pool (comma-separated).")
@click.option("--workload", type=click.Path(exists=True, dir_okay=False),
              help="Workload mode: a JSON or CSV file of jobs, run on the capacity of one trace.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def simulate(
    traces: tuple[str, ...],
    policy_list: str,
    work_hours: float,
    deadline_hours: float | None,
    changeover_hours: float,
    spot_price: str,
    ondemand_price: str,
    oracle_trace_prices: bool,
    nodes: int,
    starts: int,
    seed: int,
    workers: int,
    pools: bool,
    workload: str | None,
    as_json: bool,
) -> None:
    """Compare placement policies on spot traces (costs, deadlines, spot and on-demand hours).

    Three modes: one job on each trace (the default; needs --deadline-hours), one job over several
    pools (--pools), and a file of jobs on one trace (--workload). An option that the chosen mode does
    not use is refused rather than ignored.
    """
    from broker.sim.trace import load_traces
    from policies import names as policy_names

    mode = "--workload" if workload else "--pools" if pools else None
    unused = {"--workload": ("work_hours", "deadline_hours", "nodes", "starts", "workers", "pools",
                             "oracle_trace_prices"),
              "--pools": ("oracle_trace_prices",)}.get(mode or "", ())
    ctx = click.get_current_context()
    given = [p.opts[0] for p in ctx.command.params
             if p.name in unused and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE]
    if given:
        raise click.UsageError(f"{', '.join(given)}: not used with {mode}; leave {'it' if len(given) == 1 else 'them'}"
                               f" out" + (" (each job of the file has its own size and deadline)"
                                          if mode == "--workload" else ""))
    names = [n.strip() for n in policy_list.split(",") if n.strip()]
    unknown = [n for n in names if n.partition("@")[0] not in policy_names()]
    if unknown:
        raise click.BadParameter(
            f"unknown policy {', '.join(unknown)}; choose from: {', '.join(policy_names())}",
            param_hint="--policy",
        )
    if nodes < 1:
        raise click.BadParameter("--nodes must be at least 1")
    if starts < 1:
        raise click.BadParameter("--starts must be at least 1")
    spot_prices = [_price(x.strip(), "--spot-price") for x in spot_price.split(",") if x.strip()]
    if not spot_prices or (len(spot_prices) > 1 and not pools):
        raise click.BadParameter("one price (or, with --pools, one per pool)", param_hint="--spot-price")
    sp = spot_prices[0]
    od = _price(ondemand_price, "--ondemand-price")
    d_s = _hours_to_s(changeover_hours, "--changeover-hours", allow_zero=True)
    try:
        loaded = load_traces(traces)
    except SpecError as exc:
        raise click.ClickException(str(exc)) from None
    started = time.monotonic()

    if workload:
        from broker.sim.workload import load_workload, run_workload

        if len(loaded) != 1:
            raise click.BadParameter("workload mode runs on exactly one trace file", param_hint="--trace")
        try:
            jobs = load_workload(workload)
        except SpecError as exc:
            raise click.ClickException(str(exc)) from None
        out = run_workload(loaded[0], jobs, names, sp, od, d_s, seed=seed)
        out["seconds"] = round(time.monotonic() - started, 2)
        if as_json:
            click.echo(json.dumps(out, indent=2))
        else:
            from broker.sim.report import workload_table

            click.echo(workload_table(out))
        return

    if deadline_hours is None:
        raise click.BadParameter("give --deadline-hours (or --workload FILE)", param_hint="--deadline-hours")
    if pools:
        _pools(loaded, names, work_hours, deadline_hours, d_s, spot_prices, od, nodes, starts, seed, workers,
               as_json, started)
        return
    from broker.sim.single import Setting, never_beaten, simulate as run, summarize

    w_s = _hours_to_s(work_hours, "--work-hours")
    dl_s = _hours_to_s(deadline_hours, "--deadline-hours")
    usable = [t for t in loaded if t.capacity >= nodes]
    skipped = [t.name for t in loaded if t.capacity < nodes]
    if not usable:
        raise click.ClickException(
            f"no trace offers {nodes} instances at once (largest: {max(t.capacity for t in loaded)}); lower --nodes"
        )
    setting = Setting(w_s, dl_s, d_s, sp, od, nodes=nodes, oracle_trace_prices=oracle_trace_prices)
    samples = run(usable, names, setting, starts=starts, seed=seed, workers=workers)
    summary = summarize(samples, names)
    problems = never_beaten(samples)
    out = {
        "summary": summary,
        "samples": len(samples),
        "setting": setting.describe(),
        "traces": [
            {"name": t.name, "gap_seconds": t.gap_s, "hours": round(t.hours, 1),
             "replayed_cyclically": t.wraps(-(-dl_s // t.gap_s))}
            for t in usable
        ],
        "skipped_traces": skipped,
        "optimum_beaten": problems,
        "seconds": round(time.monotonic() - started, 2),
    }
    if as_json:
        click.echo(json.dumps(out, indent=2))
    else:
        from broker.sim.report import summary_table

        click.echo(summary_table(out))
    if problems:
        click.echo(f"error: a policy beat the offline optimum on {len(problems)} samples", err=True)
        sys.exit(1)


def _pools(loaded, names, work_hours, deadline_hours, d_s, spot_prices, od, nodes, starts, seed, workers,  # type: ignore[no-untyped-def]
           as_json, started) -> None:
    from broker.sim.pools import (
        BEST_POOL_UP, PoolSetting, align, optimum_beaten, pool_market_names, simulate_pools, summarize_pools,
    )

    try:
        traces = align(loaded)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if len(spot_prices) == 1:
        spot_prices = spot_prices * len(traces)
    if len(spot_prices) != len(traces):
        raise click.BadParameter(f"{len(spot_prices)} prices for {len(traces)} pools", param_hint="--spot-price")
    if min(t.capacity for t in traces) < 1 or max(t.capacity for t in traces) < nodes:
        raise click.ClickException(f"no pool offers {nodes} instances at once; lower --nodes")
    names = [BEST_POOL_UP if n == "uniform-progress" else n for n in names]
    names = [n for n in names if n != "omniscient"] + ["omniscient"]
    setting = PoolSetting(_hours_to_s(work_hours, "--work-hours"), _hours_to_s(deadline_hours, "--deadline-hours"),
                          d_s, tuple(spot_prices), od, nodes)
    try:
        samples = simulate_pools(traces, names, setting, starts=starts, seed=seed, workers=workers)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    pool_names = pool_market_names(traces)
    problems = optimum_beaten(samples)
    out = {
        "summary": summarize_pools(samples, names, pool_names),
        "samples": len(samples),
        "pools": [{"name": t.name, "spot_price_usd": p / MICROS_PER_UNIT, "hours": round(t.hours, 1)}
                  for t, p in zip(traces, spot_prices, strict=True)],
        "setting": {"work_hours": work_hours, "deadline_hours": deadline_hours, "changeover_hours": d_s / 3600,
                    "nodes": nodes, "ondemand_price_usd": od / MICROS_PER_UNIT},
        "optimum_beaten": problems,
        "seconds": round(time.monotonic() - started, 2),
    }
    if as_json:
        click.echo(json.dumps(out, indent=2))
    else:
        from broker.sim.report import pools_table

        click.echo(pools_table(out))
    if problems:
        click.echo(f"error: a policy beat the offline optimum on {len(problems)} samples", err=True)
        sys.exit(1)
