"""The LEVI entry of the ADRS multi-region leaderboard, in our several-pool benchmark.

LEVI's published rule (``solutions/cant_be_late_multi/LEVI``), restated with
the shared safety net in place of its own 5 % margin:

1. spot whenever some pool has it for the whole gang (the default
   ``place_pools`` picks the pool);
2. no spot anywhere: on-demand when behind Uniform Progress (work done below
   W x elapsed / D);
3. otherwise wait while the slack is over max(1 h, 5 % of D), else on-demand.

It is registered here, for this run only, and ``bench_pools.main`` runs with
the arguments given:

    PYTHONPATH=. python tests/bench/adrs_multi/levi_pools.py --changeovers 720 \
        --policies uniform-progress-best-pool,gepa,levi,gbroker
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_pools  # noqa: E402

from policies.base import AttemptView, Capacity, Decision, JobView, MarketView, Placement, Policy, register  # noqa: E402
from policies.rules import decision_of, safety_form, spot_usable  # noqa: E402


@register
class LeviPolicy(Policy):
    name = "levi"
    description = "LEVI (ADRS multi-region): spot anywhere; on-demand when behind UP or slack < max(1 h, 5 % of D)"

    def __init__(self, min_slack_h: float = 1.0, min_slack_share: float = 0.05) -> None:
        self.min_slack_s = min_slack_h * 3600
        self.share = min_slack_share

    def place(self, job: JobView, market: MarketView) -> Placement:
        if not job.interruptible or job.deadline_s is None:
            return Placement(Capacity.ONDEMAND if not job.interruptible else
                             Capacity.SPOT if spot_usable(job, market) else Capacity.NONE, "no rule")
        net = safety_form(job, market, 1)
        if net is not None and net[0] < 0:
            return Placement(Capacity.ONDEMAND, "safety net: no slack left")
        if spot_usable(job, market):
            return Placement(Capacity.SPOT, "spot available")
        W, D, t, done = job.work_s, job.deadline_s, job.elapsed_s, job.done_s
        if done * D < W * t:
            return Placement(Capacity.ONDEMAND, "outage: behind Uniform Progress")
        if (D - t) - (W - done) > max(self.min_slack_s, self.share * D):
            return Placement(Capacity.NONE, "outage: ahead, slack to spare, wait")
        return Placement(Capacity.ONDEMAND, "outage: little slack")

    def on_preempt(self, job: JobView, history: Sequence[AttemptView], market: MarketView) -> Decision:
        return decision_of(self.place(job, market))


if __name__ == "__main__":
    bench_pools.main()
