"""`simple`: the rule of thumb the broker starts from.

Non-interruptible or multi-node jobs go to on-demand, everything else to spot.
After ``max_spot_reclaims`` reclaims a job moves to on-demand for good. Like
every policy that promises a deadline, it moves a job to on-demand when the
shared safety net says one more step off on-demand could miss the deadline.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import (
    Action,
    AttemptView,
    Capacity,
    Decision,
    JobView,
    MarketView,
    Placement,
    Policy,
    register,
)
from policies.rules import needs_ondemand


@register
class SimplePolicy(Policy):
    name = "simple"
    description = "non-interruptible or multi-node -> on-demand, else spot; on-demand after N reclaims"

    def __init__(self, max_spot_reclaims: int = 3) -> None:
        self.max_spot_reclaims = max_spot_reclaims

    def place(self, job: JobView, market: MarketView) -> Placement:
        if not job.interruptible:
            return Placement(Capacity.ONDEMAND, "not interruptible")
        if job.nodes > 1:
            return Placement(Capacity.ONDEMAND, "multi-node gang")
        if job.reclaims >= self.max_spot_reclaims:
            return Placement(Capacity.ONDEMAND, f"reclaimed {job.reclaims} times")
        if needs_ondemand(job, market):
            return Placement(Capacity.ONDEMAND, "safety net: the deadline leaves no slack")
        return Placement(Capacity.SPOT, "interruptible single-node job")

    def on_preempt(
        self, job: JobView, history: Sequence[AttemptView], market: MarketView
    ) -> Decision:
        if job.reclaims >= self.max_spot_reclaims:
            return Decision(Action.MOVE_ONDEMAND, f"reclaimed {job.reclaims} times")
        if needs_ondemand(job, market):
            return Decision(Action.MOVE_ONDEMAND, "safety net: the deadline leaves no slack")
        return Decision(Action.RESUME_SPOT, "reclaims below the limit")
