"""`uniform-progress`: the policy of "Can't Be Late" (Wu et al., NSDI 2024).

Expected progress ep(t) = t * W / D (a straight line from 0 at submission to
the whole work W at the deadline D); cp(t) = work done. The paper's rules:

1. Uniform progress: when idle and cp(t) < ep(t), switch to on-demand and
   stay there to catch up.
2. Taking risks / exploitation: switch to spot whenever it is available (even
   when behind), and stay on spot until it is reclaimed.
3. Hysteresis: on on-demand, stay until cp(t) >= ep(t + 2d); then move to spot
   when it is available. (On on-demand with no spot, keep on-demand.)
4. Safety net: when idle or on on-demand and the time left is less than the
   work left plus 2d, on-demand until the end.

The simulator decides once a step, so the safety net also covers the spot
case exactly: a job stays off on-demand for one more step only while, were
its spot node reclaimed at the end of that step, on-demand would still finish
in time (the paper's code rounds to whole steps to the same end).

- no deadline: no line to keep up with, so spot when available, else wait;
- not interruptible: on-demand;
- cannot checkpoint: the safety net counts all the work as at risk.
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
from policies.rules import (
    NEVER_CHANGES_S,
    Form,
    decision_of,
    placed,
    safety_form,
    spot_usable,
)


@register
class UniformProgressPolicy(Policy):
    name = "uniform-progress"
    description = "Uniform Progress (NSDI 2024): keep up with a straight progress line; spot when available"

    def place(self, job: JobView, market: MarketView) -> Placement:
        if not job.interruptible:
            return Placement(Capacity.ONDEMAND, "not interruptible", NEVER_CHANGES_S)
        spot = spot_usable(job, market)
        if job.deadline_s is None or job.deadline_s <= 0:
            if spot:
                return Placement(Capacity.SPOT, "no deadline: spot when available", NEVER_CHANGES_S)
            return Placement(Capacity.NONE, "no deadline: wait for spot", NEVER_CHANGES_S)

        net1 = safety_form(job, market, 1)
        net2 = safety_form(job, market, 2)
        assert net1 is not None and net2 is not None
        if net1[0] < 0:
            return placed(Capacity.ONDEMAND, "safety net: no slack left", [])
        if job.current is not Capacity.SPOT and net2[0] < 0:
            return placed(Capacity.ONDEMAND, "safety net: less than 2 changeovers of slack", [])

        behind = self._behind(job, 0)
        if job.current is Capacity.ONDEMAND:
            hysteresis = self._behind(job, 2 * job.changeover_s)
            if not spot:
                return placed(Capacity.ONDEMAND, "on on-demand, no spot", [net1, net2, hysteresis])
            if hysteresis[0] < 0:
                return placed(
                    Capacity.ONDEMAND, "hysteresis: not yet ahead of ep(t + 2d)", [net1, net2, hysteresis]
                )
            return placed(Capacity.SPOT, "ahead of the line: back to spot", [net1, net2, hysteresis])
        if spot:
            return placed(Capacity.SPOT, "spot available", [net1, net2])
        if behind[0] < 0:
            return placed(Capacity.ONDEMAND, "behind the uniform-progress line", [net1, net2, behind])
        return placed(Capacity.NONE, "ahead of the line: wait for spot", [net1, net2, behind])

    def on_preempt(
        self, job: JobView, history: Sequence[AttemptView], market: MarketView
    ) -> Decision:
        return decision_of(self.place(job, market))

    @staticmethod
    def _behind(job: JobView, ahead_s: int) -> Form:
        """cp(t) - ep(t + ahead), scaled by D to stay in integers: >= 0 means on or ahead of the line."""
        d = job.deadline_s
        assert d is not None
        w = job.work_s
        value = job.done_s * d - (job.elapsed_s + ahead_s) * w
        return (value, -w, d - w)


@register
class UniformProgressRoundRobinPolicy(UniformProgressPolicy):
    """Uniform Progress over several pools, the ADRS multi-region baseline:
    the job keeps its pool while that pool has spot; when it has none, the
    job looks at the next pools in turn (after its last one) and takes the
    first with spot. With one pool it is Uniform Progress."""

    name = "uniform-progress-rr"
    description = "Uniform Progress; over several pools, round-robin to the next pool with spot"

    def choose_pool(self, job: JobView, markets: Sequence[MarketView]) -> int:
        n = len(markets)
        start = 0 if job.pool is None else job.pool
        if job.pool is not None and markets[start].spot_available >= job.nodes:
            return start
        for step in range(1, n + 1):
            k = (start + step) % n
            if markets[k].spot_available >= job.nodes:
                return k
        return (start + 1) % n if job.pool is not None else 0
