"""gbroker on the ADRS leaderboard's own multi-region benchmark.

``problems/cant_be_late_multi`` of UCB-ADRS/ADRS-Leaderboard scores
multi-region spot policies in its own simulator: W = 48 h, D = 52 h,
d = 0.2 h, 9 v100_1 regions (195 s steps, per-region spot prices,
on-demand $3.06/h), 6 scenarios of 2 to 9 regions, every job starting at the
trace's first step; the score is (146.88 - mean scenario cost) /
(146.88 - 46.71) x 100. Two tables:

1. ``their simulator``: every published entry (``solutions/cant_be_late_multi``)
   and gbroker (through ``adrs_multi/gbroker_strategy.py``) run by the
   leaderboard's evaluator, one trace at a time, as the leaderboard scores
   them. Their model lets a job on spot move to another region's spot without
   the changeover and bills all spot time at the first-step price of the
   region the job ends in.
2. ``our simulator``: the same traces, prices and scenarios in
   ``broker.sim.pools`` (every move pays d, each pool billed at its own
   price), with the exact multi-pool optimum, so every policy has a gap to
   the best possible cost.

Needs a checkout of the leaderboard with its datasets downloaded
(``download_datasets.sh``) and a Python with its simulator's packages
(configargparse numpy tqdm pyyaml filelock wandb); run with that Python:

    PYTHONPATH=. /path/to/adrs-venv/bin/python tests/bench/bench_adrs_multi.py \
        --adrs /path/to/ADRS-Leaderboard [--workers 2] [--only ours|theirs]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from broker.amount import MICROS_PER_UNIT
from broker.sim.engine import SimJob
from broker.sim.feed import SpotFeed
from broker.sim.pools import run_pools
from broker.sim.pools_optimum import solve_pools
from broker.sim.single import policy_of
from broker.sim.trace import Trace

HERE = Path(__file__).resolve().parent
STRATEGY = HERE / "adrs_multi" / "gbroker_strategy.py"
ENTRIES = ["baseline", "LEVI", "openevolve", "shinkaevolve", "gepa"]
OURS = ["ondemand", "uniform-progress-rr", "gepa", "gbroker"]
OD_USD = 3.06


def load_evaluator(problem: Path) -> ModuleType:
    sys.path.insert(0, str(problem))
    spec = importlib.util.spec_from_file_location("adrs_evaluator", problem / "evaluator.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    logging.disable(logging.WARNING)
    return mod


def program_of(entry: str, adrs: Path, ev: ModuleType) -> str:
    """The strategy file the evaluator runs for a published entry (its
    ``Solution.solve`` writes or names it) or for gbroker."""
    if entry == "gbroker":
        return str(STRATEGY)
    sol = ev.load_solution_module(adrs / "solutions/cant_be_late_multi" / entry / "resources/solution.py")
    out = sol.Solution().solve(str(ev.DEFAULT_SPEC))
    if isinstance(out, dict) and "program_path" in out:
        return str(out["program_path"])
    code = out["code"] if isinstance(out, dict) else out
    if "\n" not in code and Path(code).is_file():
        return str(code)
    f = tempfile.NamedTemporaryFile("w", suffix=f"_{entry}.py", delete=False)
    f.write(code)
    f.close()
    return f.name


def theirs_one(args: tuple[str, str]) -> tuple[str, list[float]]:
    entry, adrs = args
    ev = load_evaluator(Path(adrs) / "problems/cant_be_late_multi")
    prog = program_of(entry, Path(adrs), ev)
    costs = []
    for sc in ev.FULL_TEST_SCENARIOS:
        total = 0.0
        for tf in sc["traces"]:
            files = [os.path.join(ev.DATA_PATH, r, tf) for r in sc["regions"]]
            res = ev.run_simulation(prog, files)
            if res["status"] != "success":
                raise SystemExit(f"{entry}, {sc['name']} {tf}: {res.get('error')}\n{res.get('stderr', '')}")
            total += res["cost"]
        costs.append(total / len(sc["traces"]))
    return entry, costs


def score(mean_usd: float) -> float:
    od, spot = OD_USD * 48, 0.9731 * 48
    return max(0.0, min(1.0, (od - mean_usd) / (od - spot))) * 100


def trace_of(path: str) -> tuple[Trace, int]:
    """A leaderboard trace (``data`` 1 = preempted) as ours, and its first-step price."""
    d = json.loads(Path(path).read_text())
    counts = tuple(0 if x else 1 for x in d["data"])
    return Trace(Path(path).parent.name, int(d["metadata"]["gap_seconds"]), counts), round(d["prices"][0] * MICROS_PER_UNIT)


def ours_scenario(ev: ModuleType, sc: dict) -> dict[str, list[tuple[int, bool]]]:  # type: ignore[type-arg]
    W, D, d = 48 * 3600, 52 * 3600, int(0.2 * 3600)
    od = round(OD_USD * MICROS_PER_UNIT)
    job = SimJob(W, D, d)
    out: dict[str, list[tuple[int, bool]]] = {n: [] for n in ["omniscient", *OURS]}
    for tf in sc["traces"]:
        loaded = [trace_of(os.path.join(ev.DATA_PATH, r, tf)) for r in sc["regions"]]
        traces = [t for t, _ in loaded]
        prices = [p for _, p in loaded]
        g = traces[0].gap_s
        need = -(-D // g)
        horizon = -(-(D + W + 2 * d) // g)
        feeds = [SpotFeed(t, 1, horizon + 1) for t in traces]
        feasible, opt = solve_pools([f.avail[:need] for f in feeds], g, W, D, d, prices, od)
        out["omniscient"].append((opt, feasible))
        for name in OURS:
            o = run_pools(policy_of(name), job, feeds, 0, prices, od, horizon)
            out[name].append((o.cost_us, o.met))
    return out


def usd(cost_rate_s: float) -> float:
    return cost_rate_s / 3600 / MICROS_PER_UNIT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--adrs", type=Path, required=True, help="checkout of UCB-ADRS/ADRS-Leaderboard")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", choices=["ours", "theirs"])
    a = ap.parse_args()
    problem = a.adrs / "problems/cant_be_late_multi"
    ev = load_evaluator(problem)
    names = [s["name"] for s in ev.FULL_TEST_SCENARIOS]
    head = " ".join(f"{n[:14]:>14}" for n in names)

    if a.only != "theirs":
        t0 = time.perf_counter()
        print("our simulator (every move pays d), mean cost $ per scenario, gap to the exact optimum")
        print(f"{'policy':<20} {head} {'mean $':>8} {'score':>6} {'gap':>7} {'met':>6}")
        per = [ours_scenario(ev, sc) for sc in ev.FULL_TEST_SCENARIOS]
        for name in ["omniscient", *OURS]:
            means = [usd(sum(c for c, _ in p[name]) / len(p[name])) for p in per]
            gaps = [c / o - 1 for p in per for (c, _), (o, _) in zip(p[name], p["omniscient"], strict=True)]
            met = sum(m for p in per for _, m in p[name])
            n = sum(len(p[name]) for p in per)
            mean = sum(means) / len(means)
            cols = " ".join(f"{m:>14.2f}" for m in means)
            print(f"{name:<20} {cols} {mean:>8.2f} {score(mean):>6.2f} {100 * sum(gaps) / len(gaps):>6.2f}% {met:>3}/{n}")
        print(f"({time.perf_counter() - t0:.0f} s)\n")

    if a.only != "ours":
        t0 = time.perf_counter()
        print("their simulator and evaluator, mean cost $ per scenario")
        print(f"{'entry':<20} {head} {'mean $':>8} {'score':>6}")
        jobs = [(e, str(a.adrs)) for e in [*ENTRIES, "gbroker"]]
        with mp.get_context("spawn").Pool(a.workers) as pool:
            rows = dict(pool.map(theirs_one, jobs))
        for e, _ in jobs:
            costs = rows[e]
            mean = sum(costs) / len(costs)
            cols = " ".join(f"{c:>14.2f}" for c in costs)
            print(f"{e:<20} {cols} {mean:>8.2f} {score(mean):>6.2f}")
        print(f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
