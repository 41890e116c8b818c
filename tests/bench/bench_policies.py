"""Benchmark: every policy on every spot trace we ship, W = 48 h.

1-node traces: W/D in {0.6, 0.8, 0.9}, d in {0.05, 0.2} h. Multi-node traces:
the same with N = 4 and N = 16 where the trace offers that many instances.
Prints one table per setting group and the time taken.

    PYTHONPATH=. python tests/bench/bench_policies.py [--starts 100] [--workers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from collections import defaultdict
from pathlib import Path

from broker.sim.single import Setting, _Worker, never_beaten, summarize
from broker.sim.trace import Trace, group_of, load_traces

ROOT = Path(__file__).resolve().parents[3] / "shared/traces/spot"
NAMES = ["greedy", "uniform-progress", "gbroker", "omniscient"]
W = 48 * 3600

_STATE: dict = {}


def _init(traces: list[Trace], settings: list[Setting], starts: int, seed: int) -> None:
    _STATE.update(traces=traces, settings=settings, starts=starts, seed=seed, workers={})


def _worker(si: int) -> _Worker:
    w = _STATE["workers"].get(si)
    if w is None:
        w = _Worker(_STATE["traces"], NAMES, _STATE["settings"][si], _STATE["starts"], _STATE["seed"])
        _STATE["workers"] = {si: w}
    return w


def _run(task: tuple[int, int, int]):  # type: ignore[no-untyped-def]
    si, k, off = task
    return si, _worker(si).run(k, off)


def _wins_over_up(samples: list) -> tuple[int, int]:  # type: ignore[type-arg]
    """On how many of the samples' traces gbroker's mean gap is not above Uniform Progress's; of how many."""
    per_trace = defaultdict(list)
    for x in samples:
        per_trace[x.trace].append(x)
    wins = 0
    for ts in per_trace.values():
        ss = {r["policy"]: r for r in summarize(ts, NAMES)}
        wins += ss["gbroker"]["gap_to_optimal_mean"] <= ss["uniform-progress"]["gap_to_optimal_mean"]
    return wins, len(per_trace)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json")
    args = ap.parse_args()
    started = time.monotonic()
    traces = load_traces([ROOT])
    combos = []  # (setting, trace indices)
    for nodes in (1, 4, 16):
        for ratio in (0.6, 0.8, 0.9):
            for d in (180, 720):
                s = Setting(W, round(W / ratio), d, 918_000, 3_060_000, nodes=nodes)
                if nodes == 1:
                    ks = [k for k, t in enumerate(traces) if t.capacity == 1]
                else:
                    ks = [k for k, t in enumerate(traces) if t.capacity >= nodes and t.capacity > 1]
                if ks:
                    combos.append((s, ks))
    settings = [c[0] for c in combos]
    tasks = []
    for si, (s, ks) in enumerate(combos):
        w = _Worker(traces, NAMES, s, args.starts, args.seed)
        for k in ks:
            tasks += [(si, k, off) for off in w.offsets(k)]
    # Group work by trace and changeover so that each process reuses its tables.
    tasks.sort(key=lambda t: (t[1], settings[t[0]].nodes, settings[t[0]].changeover_s, t[0], t[2]))
    ctx = mp.get_context("fork")
    results: dict[int, list] = defaultdict(list)
    with ctx.Pool(args.workers, initializer=_init, initargs=(traces, settings, args.starts, args.seed)) as pool:
        for si, sample in pool.imap(_run, tasks, chunksize=25):
            results[si].append(sample)
    elapsed = time.monotonic() - started

    rows_out = []
    bad = []
    print(f"# command: PYTHONPATH=. python tests/bench/bench_policies.py --starts {args.starts} --workers {args.workers} --seed {args.seed}")
    print(f"# {len(tasks)} samples, {elapsed:.0f} s on {args.workers} processes\n")
    hdr = "| group | N | W/D | d (h) | traces | greedy gap | UP gap | gbroker gap | gbroker cost/OD | UP cost/OD | gbroker met | gbroker < UP |"
    print(hdr)
    print("|" + "---|" * 12)
    for si, (s, _ks) in enumerate(combos):
        by_group: dict[str, list] = defaultdict(list)
        for smp in results[si]:
            by_group[group_of(next(t for t in traces if t.name == smp.trace))].append(smp)
        bad += never_beaten(results[si])
        for group, smps in sorted(by_group.items()):
            summ = {r["policy"]: r for r in summarize(smps, NAMES)}
            wins, n_traces = _wins_over_up(smps)
            g, u, o = summ["greedy"], summ["uniform-progress"], summ["gbroker"]
            ratio = s.work_s / s.deadline_s
            print(
                f"| {group.replace('spot/', '')} | {s.nodes} | {ratio:.1f} | {s.changeover_s / 3600:g} | {n_traces} | "
                f"{100 * g['gap_to_optimal_mean']:.1f}% | {100 * u['gap_to_optimal_mean']:.1f}% | "
                f"{100 * o['gap_to_optimal_mean']:.1f}% | {o['cost_ratio_mean']:.3f} | {u['cost_ratio_mean']:.3f} | "
                f"{100 * o['deadline_met']:.0f}% | {wins}/{n_traces} |"
            )
            rows_out.append({"group": group, "setting": s.describe(), "summary": list(summ.values()),
                             "per_trace_wins": wins, "traces": n_traces})
    print("\nPer setting, all traces of that gang size together:\n")
    print("| N | W/D | d (h) | traces | greedy gap | UP gap | gbroker gap | greedy cost/OD | UP cost/OD "
          "| gbroker cost/OD | optimum cost/OD | gbroker < UP (traces) |")
    print("|" + "---|" * 12)
    for si, (s, ks) in enumerate(combos):
        summ = {r["policy"]: r for r in summarize(results[si], NAMES)}
        wins, n_traces = _wins_over_up(results[si])
        g, u, o, b = (summ[n] for n in ("greedy", "uniform-progress", "gbroker", "omniscient"))
        best = min(("greedy", "uniform-progress", "gbroker"), key=lambda n: summ[n]["gap_to_optimal_mean"])
        cells = {n: f"{100 * summ[n]['gap_to_optimal_mean']:.1f}%" for n in ("greedy", "uniform-progress", "gbroker")}
        cells[best] = f"**{cells[best]}**"
        print(
            f"| {s.nodes} | {s.work_s / s.deadline_s:.1f} | {s.changeover_s / 3600:g} | {len(ks)} | "
            f"{cells['greedy']} | {cells['uniform-progress']} | {cells['gbroker']} | "
            f"{g['cost_ratio_mean']:.3f} | {u['cost_ratio_mean']:.3f} | {o['cost_ratio_mean']:.3f} | "
            f"{b['cost_ratio_mean']:.3f} | {wins}/{n_traces} |"
        )
    print("\nBy trace set (every setting, every sample):\n")
    print("| trace set | samples | greedy gap | UP gap | gbroker gap |")
    print("|---|---|---|---|---|")
    for label, prefix in (("availability/*", "spot/availability"), ("preemption/*", "spot/preemption")):
        smps = [x for si in results for x in results[si] if x.trace.startswith(prefix)]
        summ = {r["policy"]: r for r in summarize(smps, NAMES)}
        print(f"| {label} | {len(smps)} | " + " | ".join(
            f"{100 * summ[n]['gap_to_optimal_mean']:.1f}%" for n in ("greedy", "uniform-progress", "gbroker")) + " |")
    allrows = {n: [] for n in NAMES}
    for si in results:
        for r in summarize(results[si], NAMES):
            allrows[r["policy"]].append(r)
    print()
    for n in NAMES:
        rs = allrows[n]
        print(f"{n:18s} mean gap over settings {100 * sum(r['gap_to_optimal_mean'] for r in rs) / len(rs):.1f}%  "
              f"deadlines met {100 * min(r['deadline_met'] for r in rs):.0f}% (worst setting)")
    print(f"\noptimum beaten on {len(bad)} samples; {elapsed:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows_out, "seconds": elapsed, "samples": len(tasks)}, indent=1))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
