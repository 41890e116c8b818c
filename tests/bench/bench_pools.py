"""Benchmark over several spot pools: the time-aligned zones of the dev traces.

Pool sets: the 4 zones of preemption/1-node/aws-04-22-2023 (N = 1), the 3
zones of availability/16-node/aws-08-27-2023 (N = 4 and N = 16), and the 2
zones of each instance type in availability/1-node/aws-10-26-2022 (N = 1).
W = 48 h, W/D in {0.6, 0.8, 0.9}, d in {0.05, 0.2} h, spot $0.918/h in every
pool, on-demand $3.06/h. Every policy is measured against the exact
multi-pool optimum; "saving" is 1 - cost / cost of Uniform Progress on the
best single pool of that sample (chosen in hindsight).

    PYTHONPATH=. python tests/bench/bench_pools.py [--starts 30] [--workers 2] [--seed 0] [--policies ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

from broker.sim.pools import BEST_POOL_UP, PoolSetting, align, optimum_beaten, simulate_pools, summarize_pools
from broker.sim.trace import load_traces

ROOT = Path(__file__).resolve().parents[3] / "shared/traces/spot"
DEFAULT = ["ondemand", BEST_POOL_UP, "uniform-progress-rr", "gepa", "gbroker"]
W = 48 * 3600
RATIOS = (0.6, 0.8, 0.9)
"""W/D of every setting."""


def pool_setting(ratio: float, d: int, pools: int, nodes: int) -> PoolSetting:
    """One setting of the benchmark: W = 48 h at this W/D and changeover, spot $0.918/h in every pool."""
    return PoolSetting(W, round(W / ratio), d, tuple(918_000 for _ in range(pools)), 3_060_000, nodes)


def meets_target(row: dict, up_row: dict) -> bool:  # type: ignore[type-arg]
    """The issue's target for one setting: gap <= 10 % and <= half of best-pool UP's, every deadline met."""
    g = row["gap_to_optimal_mean"]
    return g <= 0.10 and g <= up_row["gap_to_optimal_mean"] / 2 and row["deadline_met"] == 1.0


HALF_A = {"aws-04-22-2023 v100, 4 zones", "aws-10-26-2022 k80_8, 2 zones", "aws-10-26-2022 v100_8, 2 zones"}
"""The tuning half (gbroker's pool constants were chosen on these pool sets
only); half B is the 16-node zones (N = 4 and 16) and the k80_1 and v100_1
pairs. The halves share no trace."""


def half_of(label: str) -> str:
    return "A" if label in HALF_A else "B"


def extra_sets() -> list[tuple[str, int, list]]:  # type: ignore[type-arg]
    """Zone sets of the dev traces not in the issue's list, never used for tuning."""
    return [
        ("aws-04-19-2023 intel, 3 zones", 1, load_traces([ROOT / "preemption/1-node/aws-04-19-2023"])),
        ("aws-08-03-2023 4-node, 3 zones", 4, load_traces([ROOT / "preemption/4-node/aws-08-03-2023"])),
    ]


def pool_sets() -> list[tuple[str, int, list]]:  # type: ignore[type-arg]
    out = []
    out.append(("aws-04-22-2023 v100, 4 zones", 1, load_traces([ROOT / "preemption/1-node/aws-04-22-2023"])))
    z16 = load_traces([ROOT / "availability/16-node/aws-08-27-2023"])
    out.append(("aws-08-27-2023 16-node, 3 zones", 4, z16))
    out.append(("aws-08-27-2023 16-node, 3 zones", 16, z16))
    one = load_traces([ROOT / "availability/1-node/aws-10-26-2022"])
    for kind in ("k80_1", "k80_8", "v100_1", "v100_8"):
        out.append((f"aws-10-26-2022 {kind}, 2 zones", 1, [t for t in one if t.name.endswith(f"_{kind}.json")]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--starts", type=int, default=30)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(DEFAULT))
    ap.add_argument("--sets", choices=("all", "A", "B", "extra"), default="all",
                    help="all: the 7 pool sets of the issue; A / B: its tuning / held-out half; extra: 2 more zone sets")
    ap.add_argument("--changeovers", default="180,720", help="changeover d in seconds, comma-separated")
    args = ap.parse_args()
    if args.sets == "extra":
        sets = extra_sets()
    else:
        sets = [x for x in pool_sets() if args.sets == "all" or half_of(x[0]) == args.sets]
    changeovers = [int(x) for x in args.changeovers.split(",")]
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    names = list(dict.fromkeys([*names, "omniscient"]))
    online = [n for n in names if n != "omniscient"]
    started = time.monotonic()
    print(f"# command: PYTHONPATH=. python tests/bench/bench_pools.py --starts {args.starts} "
          f"--workers {args.workers} --seed {args.seed} --sets {args.sets} --changeovers {args.changeovers} "
          f"--policies '{args.policies}'\n")
    halves: dict[tuple[str, int], list[tuple[float, bool]]] = defaultdict(list)
    print("| pool set | N | W/D | d (h) | " + " | ".join(f"{n} gap" for n in online)
          + " | optimum saving | gbroker saving | gbroker met | gbroker gap <= 10 % and <= UP-best / 2 |")
    print("|" + "---|" * (8 + len(online)))
    bad: list[str] = []
    per_set: dict[str, list[dict]] = defaultdict(list)  # type: ignore[type-arg]
    failures = 0
    n_samples = 0
    for label, nodes, traces in sets:
        traces = align(traces)
        for ratio in RATIOS:
            for d in changeovers:
                s = pool_setting(ratio, d, len(traces), nodes)
                samples = simulate_pools(traces, names, s, starts=args.starts, seed=args.seed, workers=args.workers)
                n_samples += len(samples)
                bad += optimum_beaten(samples)
                rows = {r["policy"]: r for r in summarize_pools(samples, names, [t.name for t in traces])}
                per_set[f"{label}, N={nodes}"].append(rows)
                gb = rows.get("gbroker")
                ok = "-"
                if gb is not None and BEST_POOL_UP in rows:
                    g = gb["gap_to_optimal_mean"]
                    good = meets_target(gb, rows[BEST_POOL_UP])
                    failures += not good
                    half = "extra" if args.sets == "extra" else half_of(label)
                    halves[(half, d)].append((g, good))
                    ok = "yes" if good else "**no**"
                print(f"| {label} | {nodes} | {ratio} | {d / 3600:g} | "
                      + " | ".join(f"{100 * rows[n]['gap_to_optimal_mean']:.1f}%" for n in online)
                      + f" | {100 * rows['omniscient']['saving_vs_best_pool_up_mean']:.1f}%"
                      + (f" | {100 * gb['saving_vs_best_pool_up_mean']:.1f}% | {100 * gb['deadline_met']:.0f}% | {ok} |"
                         if gb is not None else " | - | - | - |"), flush=True)
    print("\nPer pool set, mean over its 6 settings:\n")
    print("| pool set | " + " | ".join(f"{n} gap" for n in online) + " | " +
          " | ".join(f"{n} saving vs best-pool UP" for n in online if n != BEST_POOL_UP) + " | optimum saving |")
    print("|" + "---|" * (2 + 2 * len(online)))
    for label, rs in per_set.items():
        def m(n: str, key: str, rs: list = rs) -> float:  # type: ignore[type-arg]
            return sum(r[n][key] for r in rs) / len(rs)
        print(f"| {label} | " + " | ".join(f"{100 * m(n, 'gap_to_optimal_mean'):.1f}%" for n in online) + " | "
              + " | ".join(f"{100 * m(n, 'saving_vs_best_pool_up_mean'):.1f}%" for n in online if n != BEST_POOL_UP)
              + f" | {100 * m('omniscient', 'saving_vs_best_pool_up_mean'):.1f}% |")
    if halves:
        print("\ngbroker by half (A: tuning, B: held out) and changeover:\n")
        print("| half | d (h) | settings | gbroker mean gap | settings meeting the target |")
        print("|---|---|---|---|---|")
        for (half, d), xs in sorted(halves.items()):
            print(f"| {half} | {d / 3600:g} | {len(xs)} | {100 * sum(g for g, _ in xs) / len(xs):.2f}% | "
                  f"{sum(ok for _, ok in xs)} |")
    elapsed = time.monotonic() - started
    print(f"\n{n_samples} samples; settings where gbroker misses a target: {failures}; "
          f"optimum beaten on {len(bad)} samples; {elapsed:.0f} s")
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
