"""`gepa`: the rule published on the ADRS leaderboard for this problem.

The single-region "cant_be_late" policy found by GEPA (see "Barbarians at the
Gate: How AI is Upending Systems Research", 2025), restated in our terms:

1. spot whenever the whole gang can have it (from waiting, from spot, and
   from on-demand alike);
2. in an outage, stay on on-demand if already on it;
3. from waiting (or after a reclaim), go to on-demand once the slack left is
   under a fifth of the work left (``od_slack_ratio``), otherwise wait.

Slack is the time left minus the work left and one changeover. The
published code's own last line of defence (on-demand once the slack is
under 3 minutes) is replaced by the shared exact safety net of
``policies.rules``, as for every policy here.

- no deadline: spot when available, else wait (no slack to measure);
- not interruptible: on-demand;
- cannot checkpoint: the slack counts all the work as at risk.
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
    decision_of,
    placed,
    safety_form,
    share,
    slack_share_form,
    spot_usable,
)


@register
class GepaPolicy(Policy):
    name = "gepa"
    description = "published GEPA rule: spot when there; keep on-demand in an outage; on-demand once slack < work/5"

    def __init__(self, od_slack_ratio: float = 0.2) -> None:
        self.ratio = share(od_slack_ratio)

    def place(self, job: JobView, market: MarketView) -> Placement:
        if not job.interruptible:
            return Placement(Capacity.ONDEMAND, "not interruptible", NEVER_CHANGES_S)
        spot = spot_usable(job, market)
        if job.deadline_s is None:
            if spot:
                return Placement(Capacity.SPOT, "no deadline: spot when available", NEVER_CHANGES_S)
            return Placement(Capacity.NONE, "no deadline: wait for spot", NEVER_CHANGES_S)
        net = safety_form(job, market, 1)
        assert net is not None
        if net[0] < 0:
            return placed(Capacity.ONDEMAND, "safety net: no slack left", [])
        if spot:
            return placed(Capacity.SPOT, "spot available", [net])
        if job.current is Capacity.ONDEMAND:
            return placed(Capacity.ONDEMAND, "outage: stay on on-demand", [net])
        form = slack_share_form(job, self.ratio)
        if form[0] < 0:
            return placed(Capacity.ONDEMAND, "outage: slack under the share of work left", [net, form])
        return placed(Capacity.NONE, "outage: slack to spare, wait", [net, form])

    def on_preempt(
        self, job: JobView, history: Sequence[AttemptView], market: MarketView
    ) -> Decision:
        return decision_of(self.place(job, market))
