"""Diagnostic: what knowing the length of the spot windows is worth over several pools.

A policy that reads the trace's future (not a fair policy: an oracle): after
a reclaim it takes the pool whose current window will last longest if that
is at least ``--x`` changeovers, else waits while the slack is above 12 % of
the work, else on-demand; from on-demand it leaves only for a window that
will last ``--xo`` changeovers. Everything else is gbroker's. Printed
against gbroker on the tuning half (A) or the held-out half (B) of
``bench_pools.py``, d = 0.2 h, seed 1.

    PYTHONPATH=. python tests/bench/diag_pools_oracle.py [--half A] [--x 2] [--xo 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pools import W, half_of, pool_sets  # noqa: E402

from broker.sim.engine import SimJob  # noqa: E402
from broker.sim.pools import OPTIMUM, PoolSetting, PoolWorker, align, run_pools  # noqa: E402
from broker.sim.single import policy_of  # noqa: E402
from policies.base import Capacity, PoolPlacement  # noqa: E402
from policies.rules import safety_form, share, slack_share_form  # noqa: E402

def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--x", type=float, default=2)
    ap.add_argument("--xo", type=float, default=3)
    ap.add_argument("--half", choices=("A", "B", "all"), default="A")
    ap.add_argument("--ratios", default="0.6,0.8,0.9")
    ap.add_argument("--starts", type=int, default=10)
    a = ap.parse_args()
    base = policy_of("gbroker")

    class Oracle:
        name = "oracle"

        def __init__(self, feeds, off):  # type: ignore[no-untyped-def]
            self.feeds, self.off = feeds, off

        def place_pools(self, job, markets):  # type: ignore[no-untyped-def]
            g = self.feeds[0].gap_s
            i = self.off + job.elapsed_s // g
            up = [k for k, m in enumerate(markets) if m.spot_available >= job.nodes]
            if (job.current is Capacity.SPOT and job.pool in up) or not up:
                return base.place_pools(job, markets)
            if safety_form(job, markets[0], 1)[0] < 0:
                return PoolPlacement(Capacity.ONDEMAND, None, "", 1)

            def rem(k: int) -> int:
                f, j = self.feeds[k], i
                while j < len(f.avail) and f.avail[j]:
                    j += 1
                return (j - i) * g

            best = max(up, key=rem)
            left, d = rem(best), job.changeover_s
            if job.current is Capacity.ONDEMAND:
                ok = left >= a.xo * d
                return PoolPlacement(Capacity.SPOT if ok else Capacity.ONDEMAND, best if ok else None, "", 1)
            if left >= a.x * d:
                return PoolPlacement(Capacity.SPOT, best, "", 1)
            if slack_share_form(job, share(0.12))[0] >= 0:
                return PoolPlacement(Capacity.NONE, None, "", 1)
            return PoolPlacement(Capacity.ONDEMAND, None, "", 1)

    for label, nodes, traces in pool_sets():
        if a.half != "all" and half_of(label) != a.half:
            continue
        traces = align(traces)
        for r in map(float, a.ratios.split(",")):
            s = PoolSetting(W, round(W / r), 720, tuple(918_000 for _ in traces), 3_060_000, nodes)
            w = PoolWorker(traces, ["gbroker", OPTIMUM], s, a.starts, 1)
            gs, gb = [], []
            for off in w.offsets:
                smp = w.run(off)
                job = SimJob(s.work_s, s.deadline_s, s.changeover_s, nodes=s.nodes)
                o = run_pools(Oracle(w.feeds, off), job, w.feeds, off, s.spot_micros, s.ondemand_micros,  # type: ignore[arg-type]
                              w.horizon, use_hints=False)
                assert o.met
                gs.append(o.cost_us / smp.optimum_us - 1)
                gb.append(smp.results["gbroker"].cost_us / smp.optimum_us - 1)
            print(f"{label} N={nodes} W/D={r}: gbroker {100 * sum(gb) / len(gb):.1f}%  "
                  f"oracle {100 * sum(gs) / len(gs):.1f}%", flush=True)


if __name__ == "__main__":
    main()
