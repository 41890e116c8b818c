"""`ondemand`: always on-demand. The cost baseline every saving is measured against.

No deadline, non-interruptible, cannot checkpoint: all the same, on-demand at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.rules import NEVER_CHANGES_S
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


@register
class OnDemandPolicy(Policy):
    name = "ondemand"
    description = "always on-demand (the cost baseline)"

    def place(self, job: JobView, market: MarketView) -> Placement:
        return Placement(Capacity.ONDEMAND, "always on-demand", recheck_s=NEVER_CHANGES_S)

    def on_preempt(
        self, job: JobView, history: Sequence[AttemptView], market: MarketView
    ) -> Decision:
        return Decision(Action.MOVE_ONDEMAND, "always on-demand")
