"""`omniscient`: replays the offline optimum computed for one known trace.

It is the lower bound of the simulator, never a policy for the daemon: the
plan comes from `broker.sim.optimum`, which sees the whole future of the spot
trace. Built with ``from_name("omniscient", plan=...)``; without a plan it
refuses to place anything.

A plan is a sorted tuple of runs ``(start_s, end_s, capacity)`` measured from
submission; outside every run the job waits.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from policies.base import (
    AttemptView,
    Capacity,
    Decision,
    JobView,
    MarketView,
    Placement,
    Policy,
    register,
)
from policies.rules import NEVER_CHANGES_S, decision_of

Run = tuple[int, int, Capacity]


@register
class OmniscientPolicy(Policy):
    name = "omniscient"
    description = "offline optimum for a known trace (simulator only: the lower bound)"

    def __init__(self, plan: Sequence[Run] | None = None) -> None:
        if plan is None:
            raise ValueError(
                "omniscient needs the future: it is built by the simulator "
                "(gbroker simulate) with the plan of one trace, not by the daemon"
            )
        self.plan: tuple[Run, ...] = tuple(sorted(plan))
        self._starts = [r[0] for r in self.plan]

    def place(self, job: JobView, market: MarketView) -> Placement:
        t = job.elapsed_s
        i = bisect.bisect_right(self._starts, t) - 1
        if i >= 0 and self.plan[i][0] <= t < self.plan[i][1]:
            start, end, cap = self.plan[i]
            return Placement(cap, f"plan: {cap.value} until {end} s", end - t)
        nxt = self._starts[i + 1] if i + 1 < len(self._starts) else None
        wait = NEVER_CHANGES_S if nxt is None else nxt - t
        return Placement(Capacity.NONE, "plan: wait", wait)

    def on_preempt(
        self, job: JobView, history: Sequence[AttemptView], market: MarketView
    ) -> Decision:
        return decision_of(self.place(job, market))
