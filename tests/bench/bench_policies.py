"""Benchmark: every policy on every spot trace we ship, W = 48 h.

1-node traces: W/D in {0.6, 0.8, 0.9}, d in {0.05, 0.2} h. Multi-node traces:
the same with N = 4 and N = 16 where the trace offers that many instances:
18 settings. Fixed prices (spot $0.918/h, on-demand $3.06/h): the trace-price
oracle is never used here.

The traces are split in two halves for tuning (``half_of``): in each trace
folder, sorted by name, the 1st, 3rd, ... file is in half A (where constants
are tuned) and the 2nd, 4th, ... in half B (held out). Every summary is
printed for A, B and all.

    PYTHONPATH=. python tests/bench/bench_policies.py [--starts 100] [--workers 2] [--seed 0]
        [--policies NAME,...] [--half A|B|all] [--json out.json]

A policy may be given as ``name@key=value;key=value`` to try constructor
arguments (``broker.sim.single.policy_of``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from collections import defaultdict
from pathlib import Path

from broker.sim.single import Sample, Setting, _Worker, never_beaten, summarize
from broker.sim.trace import Trace, group_of, load_traces

ROOT = Path(__file__).resolve().parents[3] / "shared/traces/spot"
DEFAULT = ["greedy", "uniform-progress", "gepa", "gbroker-markov", "gbroker", "omniscient"]
W = 48 * 3600

_STATE: dict = {}


def half_of(traces: list[Trace]) -> dict[str, str]:
    """Trace name -> "A" (tuning half) or "B" (held out): alternate within each folder."""
    by_group: dict[str, list[str]] = defaultdict(list)
    for t in traces:
        by_group[group_of(t)].append(t.name)
    out = {}
    for names in by_group.values():
        for i, n in enumerate(sorted(names)):
            out[n] = "A" if i % 2 == 0 else "B"
    return out


def settings_of(traces: list[Trace]) -> list[tuple[Setting, list[int]]]:
    combos = []
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
    return combos


def _init(traces: list[Trace], names: list[str], settings: list[Setting], starts: int, seed: int) -> None:
    _STATE.update(traces=traces, names=names, settings=settings, starts=starts, seed=seed, workers={})


def _worker(si: int) -> _Worker:
    w = _STATE["workers"].get(si)
    if w is None:
        w = _Worker(_STATE["traces"], _STATE["names"], _STATE["settings"][si], _STATE["starts"], _STATE["seed"])
        _STATE["workers"] = {si: w}
    return w


def _run(task: tuple[int, int, int]) -> tuple[int, Sample]:
    si, k, off = task
    return si, _worker(si).run(k, off)


def run(traces: list[Trace], names: list[str], combos: list[tuple[Setting, list[int]]],
        starts: int, seed: int, workers: int) -> dict[int, list[Sample]]:
    settings = [c[0] for c in combos]
    tasks = []
    for si, (s, ks) in enumerate(combos):
        w = _Worker(traces, [], s, starts, seed)
        for k in ks:
            tasks += [(si, k, off) for off in w.offsets(k)]
    # Group work by trace and changeover so that each process reuses its tables.
    tasks.sort(key=lambda t: (t[1], settings[t[0]].nodes, settings[t[0]].changeover_s, t[0], t[2]))
    results: dict[int, list[Sample]] = defaultdict(list)
    if workers <= 1:
        _init(traces, names, settings, starts, seed)
        for task in tasks:
            si, smp = _run(task)
            results[si].append(smp)
        return results
    ctx = mp.get_context("fork")
    with ctx.Pool(workers, initializer=_init, initargs=(traces, names, settings, starts, seed)) as pool:
        for si, smp in pool.imap(_run, tasks, chunksize=25):
            results[si].append(smp)
    return results


def gap(rows: dict[str, dict], name: str) -> float:
    return rows[name]["gap_to_optimal_mean"]


def mean_gaps(results: dict[int, list[Sample]], names: list[str], keep) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Mean over settings of each policy's mean gap, on the samples ``keep`` accepts."""
    per: dict[str, list[float]] = defaultdict(list)
    for si in sorted(results):
        smps = [x for x in results[si] if keep(x)]
        if not smps:
            continue
        for r in summarize(smps, names):
            per[r["policy"]].append(r["gap_to_optimal_mean"])
    return {n: sum(v) / len(v) for n, v in per.items()}


def label(name: str) -> str:
    return name.replace("uniform-progress", "UP")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(DEFAULT))
    ap.add_argument("--half", choices=("A", "B", "all"), default="all", help="run only this half of the traces")
    ap.add_argument("--json")
    args = ap.parse_args()
    names = list(dict.fromkeys([*(n.strip() for n in args.policies.split(",") if n.strip()), "omniscient"]))
    online = [n for n in names if n != "omniscient"]
    started = time.monotonic()
    traces = load_traces([ROOT])
    halves = half_of(traces)
    if args.half != "all":
        traces = [t for t in traces if halves[t.name] == args.half]
    combos = settings_of(traces)
    results = run(traces, names, combos, args.starts, args.seed, args.workers)
    elapsed = time.monotonic() - started
    n_samples = sum(len(v) for v in results.values())

    print(f"# command: PYTHONPATH=. python tests/bench/bench_policies.py --starts {args.starts} "
          f"--workers {args.workers} --seed {args.seed} --half {args.half} --policies {args.policies}")
    print(f"# {n_samples} samples, {elapsed:.0f} s on {args.workers} processes")
    print("# half A (tuning): " + ", ".join(sorted(n for n, h in halves.items() if h == "A")))
    print("# half B (held out): " + ", ".join(sorted(n for n, h in halves.items() if h == "B")) + "\n")

    bad: list[str] = []
    print("Per setting, all traces of that gang size together (gap = mean of cost / optimum - 1):\n")
    print("| N | W/D | d (h) | traces | " + " | ".join(f"{label(n)} gap" for n in online)
          + " | optimum cost/OD | " + " | ".join(f"{label(n)} met" for n in online) + " |")
    print("|" + "---|" * (5 + 2 * len(online)))
    for si, (s, ks) in enumerate(combos):
        summ = {r["policy"]: r for r in summarize(results[si], names)}
        bad += never_beaten(results[si])
        best = min(online, key=lambda n: gap(summ, n))
        cells = [f"{100 * gap(summ, n):.1f}%" if n != best else f"**{100 * gap(summ, n):.1f}%**" for n in online]
        met = [f"{100 * summ[n]['deadline_met']:.0f}%" for n in online]
        print(f"| {s.nodes} | {s.work_s / s.deadline_s:.1f} | {s.changeover_s / 3600:g} | {len(ks)} | "
              + " | ".join(cells) + f" | {summ['omniscient']['cost_ratio_mean']:.3f} | " + " | ".join(met) + " |")

    print("\nPer trace group and setting:\n")
    print("| group | N | W/D | d (h) | " + " | ".join(f"{label(n)} gap" for n in online) + " |")
    print("|" + "---|" * (4 + len(online)))
    group_rows = []
    for si, (s, _ks) in enumerate(combos):
        by_group: dict[str, list[Sample]] = defaultdict(list)
        for smp in results[si]:
            by_group[smp.trace.rsplit("/", 1)[0]].append(smp)
        for group, smps in sorted(by_group.items()):
            summ = {r["policy"]: r for r in summarize(smps, names)}
            print(f"| {group.replace('spot/', '')} | {s.nodes} | {s.work_s / s.deadline_s:.1f} | "
                  f"{s.changeover_s / 3600:g} | " + " | ".join(f"{100 * gap(summ, n):.1f}%" for n in online) + " |")
            group_rows.append({"group": group, "setting": s.describe(), "summary": list(summ.values())})

    print("\nPer trace group, mean over its settings:\n")
    print("| group | settings | " + " | ".join(f"{label(n)} gap" for n in online) + " |")
    print("|" + "---|" * (2 + len(online)))
    per_group: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in group_rows:
        for r in row["summary"]:
            per_group[row["group"]][r["policy"]].append(r["gap_to_optimal_mean"])
    group_means = {g: {n: sum(v) / len(v) for n, v in d.items()} for g, d in per_group.items()}
    for g, d in sorted(group_means.items()):
        print(f"| {g.replace('spot/', '')} | {len(per_group[g][online[0]])} | "
              + " | ".join(f"{100 * d[n]:.1f}%" for n in online) + " |")

    print("\nMean gap over the settings, by half of the traces:\n")
    print("| policy | half A (tuning) | half B (held out) | all traces |")
    print("|---|---|---|---|")
    by_half = {h: mean_gaps(results, names, (lambda x, h=h: h == "all" or halves[x.trace] == h)) for h in ("A", "B", "all")}
    for n in online:
        print(f"| {n} | " + " | ".join(f"{100 * by_half[h][n]:.2f}%" if n in by_half[h] else "-" for h in ("A", "B", "all")) + " |")

    worst_met = {n: min(r["deadline_met"] for si in results for r in summarize(results[si], names) if r["policy"] == n)
                 for n in online}
    print()
    for n in online:
        print(f"{n:24s} mean gap over settings {100 * by_half['all'][n]:.2f}%  "
              f"deadlines met {100 * worst_met[n]:.0f}% (worst setting)")
    if {"gbroker", "uniform-progress"} <= set(online):
        g_all, u_all = by_half["all"]["gbroker"], by_half["all"]["uniform-progress"]
        print(f"\ngbroker / UP gap: {g_all / u_all:.2f} (target <= 0.45); gbroker mean gap "
              f"{100 * g_all:.2f}% (target <= 5 %)")
    refs = [n for n in ("gbroker-markov", "gepa") if n in online]
    if "gbroker" in online and refs:
        worse = [g for g, d in group_means.items() if d["gbroker"] > min(d[r] for r in refs) + 1e-12]
        print(f"trace groups where gbroker is above the best of {', '.join(refs)}: "
              f"{', '.join(w.replace('spot/', '') for w in worse) or 'none'}")
    print(f"\noptimum beaten on {len(bad)} samples; {elapsed:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"groups": group_rows, "by_half": by_half, "seconds": elapsed, "samples": n_samples}, indent=1))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
