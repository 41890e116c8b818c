"""A lab week: owned nodes, spot and on-demand, a week of mixed jobs.

A seeded week (168 h) of render, simulation and fine-tune jobs, with and
without deadlines, more on weekdays and in working hours. The cluster owns
some nodes; jobs that find owned nodes free take them, the rest are placed
by the policy on spot (the capacity of one 16-node trace, shared by the
jobs; reclaims drawn at random) or on-demand. Owned nodes cost a fixed
price per node-hour for the whole week, busy or not. Compared:

- all on-demand (no owned nodes, policy ``ondemand``);
- owned only, sized for the peak (every job starts at arrival; the cost is
  the owned nodes for the week, nothing else);
- owned nodes sized for the baseline (or the median) plus on-demand, or
  plus spot and on-demand under each policy;
- no owned nodes, spot and on-demand.

    PYTHONPATH=. python tests/bench/bench_labweek.py [--seed 0] [--owned-price 1.2]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from broker.sim.trace import load_traces
from broker.sim.workload import WorkloadJob, run_workload

ROOT = Path(__file__).resolve().parents[3] / "shared/traces/spot"
TRACE = ROOT / "availability/16-node/aws-08-27-2023/us-east-2b_v100_1.json"
WEEK_H = 168
POLICIES = ["ondemand", "greedy", "uniform-progress", "gepa", "gbroker"]


def lab_week(seed: int) -> list[WorkloadJob]:
    """About 130 jobs: renders (1 node, 1-4 h, checkpoint per frame, most due
    next morning), simulations (2-4 nodes, 4-16 h, a third cannot
    checkpoint, a sixth cannot be interrupted) and fine-tunes (4-8 nodes,
    8-24 h, checkpointed, half with a deadline)."""
    rng = random.Random(f"labweek:{seed}")
    jobs: list[WorkloadJob] = []
    for day in range(7):
        weekday = day < 5
        for kind, per_day in (("render", 12 if weekday else 4), ("simulation", 4 if weekday else 1),
                              ("fine-tune", 2 if weekday else 1)):
            for _ in range(per_day):
                at = day * 24 + (rng.uniform(8, 19) if weekday or rng.random() < 0.5 else rng.uniform(0, 24))
                if kind == "render":
                    nodes, work = 1, rng.uniform(1, 4)
                    deadline = work * rng.uniform(1.5, 3) + 2 if rng.random() < 0.8 else None
                    ckpt, intr = True, True
                elif kind == "simulation":
                    nodes, work = rng.choice((2, 2, 4)), rng.uniform(4, 16)
                    deadline = work * rng.uniform(1.3, 2.5) if rng.random() < 0.6 else None
                    ckpt, intr = rng.random() >= 1 / 3, rng.random() >= 1 / 6
                else:
                    nodes, work = rng.choice((4, 8)), rng.uniform(8, 24)
                    deadline = work * rng.uniform(1.3, 2) if rng.random() < 0.5 else None
                    ckpt, intr = True, True
                jobs.append(WorkloadJob(f"{kind}{len(jobs)}", kind, nodes, 1, round(at * 3600), round(work * 3600),
                                        None if deadline is None else round(deadline * 3600), intr, ckpt))
    return sorted(jobs, key=lambda j: j.arrival_s)


def demand_profile(jobs: list[WorkloadJob], d_s: int) -> list[int]:
    """Nodes busy in each hour if every job ran at arrival (what owned-only needs)."""
    hours = max(WEEK_H, max(-(-(j.arrival_s + j.work_s + d_s) // 3600) for j in jobs))
    busy = [0] * hours
    for j in jobs:
        for h in range(j.arrival_s // 3600, -(-(j.arrival_s + j.work_s + d_s) // 3600)):
            busy[h] += j.nodes
    return busy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--owned-price", type=float, default=1.20, help="USD per owned node-hour (amortised)")
    ap.add_argument("--spot-price", type=float, default=0.918)
    ap.add_argument("--ondemand-price", type=float, default=3.06)
    ap.add_argument("--changeover-hours", type=float, default=0.1)
    args = ap.parse_args()
    started = time.monotonic()
    jobs = lab_week(args.seed)
    d = round(args.changeover_hours * 3600)
    trace = load_traces([TRACE])[0]
    busy = sorted(demand_profile(jobs, d)[:WEEK_H])
    peak, median, base = busy[-1], busy[len(busy) // 2], busy[len(busy) // 4]
    sp, od, ow = (round(x * 1_000_000) for x in (args.spot_price, args.ondemand_price, args.owned_price))
    work_h = sum(j.work_s * j.nodes for j in jobs) / 3600
    print(f"# command: PYTHONPATH=. python tests/bench/bench_labweek.py --seed {args.seed} --owned-price "
          f"{args.owned_price} --spot-price {args.spot_price} --ondemand-price {args.ondemand_price} "
          f"--changeover-hours {args.changeover_hours}\n")
    print(f"{len(jobs)} jobs ({sum(j.kind == 'render' for j in jobs)} render, "
          f"{sum(j.kind == 'simulation' for j in jobs)} simulation, {sum(j.kind == 'fine-tune' for j in jobs)} "
          f"fine-tune; {sum(j.deadline_s is not None for j in jobs)} with a deadline), {work_h:.0f} node-hours of "
          f"work; demand if all run at arrival: peak {peak} nodes, median {median}, 25th percentile {base}; "
          f"spot: {trace.name.rsplit('/', 1)[-1]} (up to {max(trace.counts)} nodes)\n")
    rows = []
    all_od = None
    for owned, label in ((0, "none"), (base, f"baseline ({base}, 25th pct)"), (median, f"median ({median})")):
        for name in POLICIES:
            if owned and name == "greedy":
                continue
            out = run_workload(trace, jobs, [name], sp, od, d, args.seed, owned, ow, WEEK_H)["summary"][0]
            if owned == 0 and name == "ondemand":
                all_od = out["cost_usd"]
            rows.append((label, name, out))
    assert all_od is not None
    peak_cost = peak * WEEK_H * args.owned_price
    print("| owned nodes | overflow policy | total $ | vs all on-demand | vs owned-only for the peak | "
          "owned $ (fixed) | owned node-h | spot node-h | on-demand node-h | deadlines met | reclaims |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    print(f"| peak ({peak}) | - (owned only) | {peak_cost:.0f} | {peak_cost / all_od - 1:+.1%} | +0.0% | "
          f"{peak_cost:.0f} | {work_h + d / 3600 * sum(j.nodes for j in jobs):.0f} | 0 | 0 | all | 0 |")
    for label, name, o in rows:
        print(f"| {label} | {name} | {o['cost_usd']:.0f} | {o['cost_usd'] / all_od - 1:+.1%} | "
              f"{o['cost_usd'] / peak_cost - 1:+.1%} | {o['owned_fixed_usd']:.0f} | {o['owned_gpu_hours']:.0f} | "
              f"{o['spot_gpu_hours']:.0f} | {o['ondemand_gpu_hours']:.0f} | {o['deadlines_met']}/{o['deadlines']} | "
              f"{o['reclaims']} |", flush=True)
    print(f"\n({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
