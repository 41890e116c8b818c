"""Calibration against "Can't Be Late" (NSDI 2024): W = 48 h, W/D = 0.8, d = 0.2 h,
on-demand $3.06/h, spot $0.918/h. Paper: greedy 30.8 on-demand h / 17.2 spot h,
Uniform Progress 25.1 / 22.9, omniscient 20.7 / 27.4.

    PYTHONPATH=. python tests/bench/bench_calibration.py [--starts 100]

Hours are paid hours (changeovers included); the paper's add up to about W.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from broker.sim.single import Setting, simulate, summarize
from broker.sim.trace import load_traces

ROOT = Path(__file__).resolve().parents[3] / "shared/traces/spot"
AVAIL = ROOT / "availability/1-node/aws-10-26-2022"
SETS = {
    "V100 availability traces": sorted(AVAIL.glob("*v100*.json")),
    "all 1-node availability traces (V100 + K80)": sorted(AVAIL.glob("*.json")),
    "V100 preemption traces": sorted((ROOT / "preemption/1-node/aws-04-22-2023").glob("*.json")),
}
PAPER = {"greedy": (30.8, 17.2), "uniform-progress": (25.1, 22.9), "omniscient": (20.7, 27.4)}
NAMES = ["greedy", "uniform-progress", "gepa", "gbroker-markov", "gbroker", "omniscient"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    W = 48 * 3600
    s = Setting(W, 60 * 3600, 720, 918_000, 3_060_000)
    for title, files in SETS.items():
        traces = load_traces(files)
        rows = summarize(simulate(traces, NAMES, s, starts=args.starts, seed=0, workers=args.workers), NAMES)
        print(f"\n{title}: {len(files)} traces, {args.starts} starts each")
        print("| policy | on-demand h | spot h | paper OD h / spot h | cost / all-on-demand | gap to optimum |")
        print("|---|---|---|---|---|---|")
        for r in rows:
            p = PAPER.get(r["policy"])
            ps = f"{p[0]} / {p[1]}" if p else "-"
            print(f"| {r['policy']} | {r['ondemand_hours_mean']:.1f} | {r['spot_hours_mean']:.1f} | {ps} | "
                  f"{r['cost_ratio_mean']:.3f} | {100 * r['gap_to_optimal_mean']:.1f}% |")


if __name__ == "__main__":
    main()
