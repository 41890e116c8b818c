"""`greedy`: spot whenever spot is there, with the paper's safety net.

The greedy policy of "Can't Be Late" (Wu et al., NSDI 2024): run on spot
whenever the whole gang can have it, wait otherwise, and switch to on-demand
for good once the time left no longer covers the work left plus a changeover
(plus one step, because the next chance to act is a step away).

- no deadline: there is no safety net; spot when available, else wait;
- not interruptible: on-demand;
- cannot checkpoint: the safety net counts all the work as at risk, so the job
  is moved to on-demand while there is still time to run it from the start.

`greedy-no-safety-net` is the same without the net; it can miss deadlines and
exists to show what the net is worth.
"""

from __future__ import annotations

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
from policies.rules import NEVER_CHANGES_S, decision_of, placed, safety_form, spot_usable


@register
class GreedyPolicy(Policy):
    name = "greedy"
    description = "spot whenever available; on-demand for good when the deadline leaves no slack"
    safety_net = True

    def place(self, job: JobView, market: MarketView) -> Placement:
        if not job.interruptible:
            return Placement(Capacity.ONDEMAND, "not interruptible", NEVER_CHANGES_S)
        net = safety_form(job, market) if self.safety_net else None
        if net is not None and net[0] < 0:
            return placed(Capacity.ONDEMAND, "safety net: no slack left", [])
        if spot_usable(job, market):
            return placed(Capacity.SPOT, "spot available", [net])
        return placed(Capacity.NONE, "waiting for spot", [net])

    def on_preempt(
        self, job: JobView, history: Sequence[AttemptView], market: MarketView
    ) -> Decision:
        return decision_of(self.place(job, market))


@register
class GreedyNoSafetyNetPolicy(GreedyPolicy):
    name = "greedy-no-safety-net"
    description = "spot whenever available, never on-demand (can miss deadlines)"
    safety_net = False

