"""`gbroker`: the default policy. A changeover-aware slack rule with the
exact safety net on top.

Measured on the traces we ship (docs/SIMULATOR.md), a rule that follows the
availability of spot and spends slack by a simple share beats the
model-based table (`gbroker-markov`), whose two-state model of a
heavy-tailed market misjudges both short windows and long outages. The rule
starts from the published GEPA rule (`gepa`) and adds what a changeover
costs:

1. spot whenever the whole gang can have it, from waiting or after a
   reclaim;
2. in an outage, stay on on-demand if already on it;
3. waiting in an outage: on-demand once the slack left is under
   ``od_slack_ratio`` (12 %) of the work left, otherwise wait;
4. from on-demand back to spot at once, unless round trips are scarce: a
   round trip (on-demand to spot and back) spends two changeovers of slack,
   and when the slack left pays for fewer round trips than the spot windows
   expected in the time left (observed windows per hour times the hours
   left, ``scarce_factor``), the job leaves on-demand only for a window
   that has already lasted ``prove_changeovers`` (2) changeovers: most
   windows are short, and an old window tends to last (heavy tails).

Options kept for experiments (off by default): ``return_ratio`` (leave
on-demand only while the slack after a round trip stays above that share
of the work) and ``leave_ratio`` (stop on-demand in an outage while the
slack is above that share). The constants were tuned on half A of the
traces and are reported on the held-out half B as well (docs/SIMULATOR.md,
"Tuning, in and out of sample").

Several pools (``place_pools``): the job keeps its pool while it has spot;
otherwise it takes the pool with spot whose current window has lasted
longest (``pool_choice="age"``: windows are heavy-tailed, old ones tend to
last; ``"rate"``, the pool reclaimed least, was the default before), so a
reclaim in one pool resumes in another at once. A job on on-demand leaves it
for the pool with the oldest window (``pool_rule="prove"``), at once, or,
when round trips are scarce or at least ``pool_short_share`` (30 %) of the
observed windows were shorter than the proof, only once that window has
lasted ``pool_prove_changeovers`` (3) changeovers: the proof is spent on
on-demand, so it costs money but no slack. Chosen on half A of the pool sets
and checked on the held-out half B (docs/SIMULATOR.md, "Leaving on-demand
over several pools"). A job waiting with every pool out, where at least
``pool_old_short_share`` (60 %) of the observed windows were shorter than
that proof, goes to on-demand once the slack is under ``pool_old_ratio``
(20 %) of the work left when the outage has lasted ``pool_old_changeovers``
(2) changeovers (12 % before that, and in markets of longer windows): spot
that comes back in short windows is worth less waiting for
(``pool_old_ratio=None``: off). ``pool_rule="follow"`` is the single-pool rule on the
chosen pool; ``pool_rule="choosy"`` (off; measured worse) instead ranks the
pools by the observed chance that the current window lasts ``pool_horizon``
changeovers more, waits for a likelier window while the slack is above
``pool_wait_share`` of the work, and with ``pool_od_k`` leaves on-demand only
for such a window.

Other jobs, as before (``policies.gbroker_markov``): not interruptible:
on-demand; no deadline: spot when available, else wait, on-demand after
``patience_s`` without spot; cannot checkpoint: spot only while a full rerun
still fits and reclaims are rare next to the work; a group whose budget
cannot pay for on-demand: the cheapest route the deadline allows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policies.base import (
    AttemptView,
    Capacity,
    Decision,
    JobView,
    MarketView,
    Placement,
    PoolPlacement,
    register,
)
from policies.gbroker_markov import GBrokerMarkovPolicy
from policies.rules import (
    NEVER_CHANGES_S,
    decision_of,
    placed,
    safety_form,
    share,
    slack_share_form,
    spot_usable,
)


MIN_WINDOWS = 8
"""Observed windows (all pools together) before their share shorter than a proof is trusted."""


@register
class GBrokerPolicy(GBrokerMarkovPolicy):
    name = "gbroker"
    description = "spot when there; changeover-aware return from on-demand; slack share rule in outages; exact safety net"

    def __init__(
        self,
        od_slack_ratio: float = 0.12,
        prove_changeovers: float = 2.0,
        selective: bool = True,
        scarce_factor: float = 1.0,
        return_ratio: float | None = None,
        leave_ratio: float | None = None,
        patience_s: int = 12 * 3600,
        pool_choice: str = "age",
        pool_rule: str = "prove",
        pool_wait_k: float = 0.7,
        pool_wait_share: float = 0.25,
        pool_horizon: float = 2.0,
        pool_od_k: float | None = None,
        pool_prove_changeovers: float = 3.0,
        pool_short_share: float = 0.3,
        pool_old_ratio: float | None = 0.2,
        pool_old_changeovers: float = 2.0,
        pool_old_short_share: float = 0.6,
    ) -> None:
        super().__init__(patience_s=patience_s, prove_changeovers=prove_changeovers)
        self.pool_choice = pool_choice
        self.pool_rule = pool_rule
        self.pool_wait_k = pool_wait_k
        self.pool_od_k = pool_od_k
        self.pool_wait_share = pool_wait_share
        self.pool_horizon = pool_horizon
        self.pool_prove_changeovers = pool_prove_changeovers
        self.pool_short_share = pool_short_share
        self.pool_old_ratio = None if pool_old_ratio is None else share(pool_old_ratio)
        self.pool_old_changeovers = pool_old_changeovers
        self.pool_old_short_share = pool_old_short_share
        self.selective = selective
        self.scarce_factor = scarce_factor
        self.od_ratio = share(od_slack_ratio)
        self.return_ratio = None if return_ratio is None else share(return_ratio)
        self.leave_ratio = None if leave_ratio is None else share(leave_ratio)

    def place(self, job: JobView, market: MarketView) -> Placement:
        first = self._settled_first(job, market)
        if isinstance(first, Placement):
            return first
        spot, net = first
        if job.current is Capacity.ONDEMAND:
            return self._from_ondemand(job, market, spot, net)
        if spot:
            return placed(Capacity.SPOT, "spot available", [net])
        form = slack_share_form(job, self.od_ratio)
        if form[0] < 0:
            return placed(Capacity.ONDEMAND, "outage: slack under its share of the work left", [net, form])
        return placed(Capacity.NONE, "outage: slack to spare, wait", [net, form])

    def _from_ondemand(self, job: JobView, market: MarketView, spot: bool, net: tuple[int, int, int]) -> Placement:
        if not spot:
            if self.leave_ratio is not None:
                leave = slack_share_form(job, self.leave_ratio)
                if leave[0] >= 0:
                    return placed(Capacity.NONE, "outage with slack to spare: stop on-demand, wait", [net, leave])
                return placed(Capacity.ONDEMAND, "outage: stay on on-demand", [net, leave])
            return placed(Capacity.ONDEMAND, "outage: stay on on-demand", [net])
        forms = [net]
        if self.return_ratio is not None:
            back = slack_share_form(job, self.return_ratio, 3)
            forms.append(back)
            if back[0] < 0:
                return placed(Capacity.ONDEMAND, "a round trip to spot would eat the slack left", forms)
        prove = self.prove_s(job)
        if self.selective and not self._round_trips_scarce(job, market):
            prove = 0
        up = market.spot_up_s
        if prove > 0 and up is not None and up < prove:
            p = placed(Capacity.ONDEMAND, "spot window too young to leave on-demand for", forms)
            return Placement(p.capacity, p.reason, max(1, min(p.recheck_s or NEVER_CHANGES_S, prove - up)))
        return placed(Capacity.SPOT, "spot back, slack for a round trip: spot", forms)

    def place_pools(self, job: JobView, markets: Sequence[MarketView]) -> PoolPlacement:
        if self.pool_rule == "prove" and len(markets) >= 2 and job.current is Capacity.ONDEMAND:
            return self._leave_ondemand(job, markets)
        if self.pool_old_ratio is not None and len(markets) >= 2 and job.current is Capacity.NONE:
            waited = self._outage_of_every_pool(job, markets)
            if waited is not None:
                return waited
        if (
            self.pool_rule != "choosy"
            or len(markets) < 2
            or not job.interruptible
            or job.deadline_s is None
            or not job.checkpointable
            or job.budget_left_micros is not None
        ):
            return super().place_pools(job, markets)
        up = [k for k, m in enumerate(markets) if spot_usable(job, m)]
        if not up or (job.current is Capacity.SPOT and job.pool in up):
            return super().place_pools(job, markets)
        net = safety_form(job, markets[0], 1)
        assert net is not None
        if net[0] < 0:
            return PoolPlacement(Capacity.ONDEMAND, None, "safety net: no slack left", NEVER_CHANGES_S)
        d = job.changeover_s
        h = int(self.pool_horizon * d)
        surv = {k: self._survival(markets[k], h) for k in up}
        best = max(up, key=lambda k: (surv[k], markets[k].spot_up_s or 0, -markets[k].spot_price_micros, -k))
        m = markets[best]
        work = max(1, job.work_left_s)
        slack = (job.time_left_s or 0) - job.work_left_s - d
        sh = slack / work
        if job.current is Capacity.ONDEMAND:
            pl = self.place(job, m)
            if pl.capacity is Capacity.SPOT:
                if self.pool_od_k is not None and surv[best] < self.pool_od_k:
                    return PoolPlacement(Capacity.ONDEMAND, None, "no pool's window likely to pay a round trip", 1)
                return PoolPlacement(Capacity.SPOT, best, pl.reason, 1)
            return PoolPlacement(pl.capacity, None, pl.reason, 1)
        if sh < self.pool_wait_share or surv[best] >= self.pool_wait_k:
            return PoolPlacement(Capacity.SPOT, best, "the window likeliest to last", 1)
        return PoolPlacement(Capacity.NONE, None, "only windows likely to end soon: slack to spare, wait", 1)

    def _leave_ondemand(self, job: JobView, markets: Sequence[MarketView]) -> PoolPlacement:
        """``pool_rule="prove"``: a job on on-demand with spot back in some pool.

        It looks at the pool whose current window is oldest (heavy tails: an
        old window tends to last) and leaves on-demand for it at once, unless
        a round trip is likely to be wasted: when round trips are scarce (the
        single-pool test, on that pool's market) or when at least
        ``pool_short_share`` of the windows observed in all pools (8 or more)
        were shorter than the proof, the window must first have lasted
        ``pool_prove_changeovers`` changeovers. Waiting for the proof costs no
        slack: the job keeps running on on-demand meanwhile.
        """
        k = self.choose_pool(job, markets)
        first = self._settled_first(job, markets[k])
        up = [j for j, m in enumerate(markets) if spot_usable(job, m)]
        if isinstance(first, Placement) or not up:
            return super().place_pools(job, markets)
        best = max(up, key=lambda j: (markets[j].spot_up_s or 0, -markets[j].spot_reclaim_rate_per_hour, -j))
        prove = int(self.pool_prove_changeovers * job.changeover_s)
        age = markets[best].spot_up_s or 0
        if age < prove and self._proof_needed(job, markets, markets[best], prove):
            return PoolPlacement(Capacity.ONDEMAND, None, "no pool's spot window old enough to leave on-demand for")
        return PoolPlacement(Capacity.SPOT, best, "spot back in the pool with the oldest window: spot")

    def _outage_of_every_pool(self, job: JobView, markets: Sequence[MarketView]) -> PoolPlacement | None:
        """Waiting with every pool out, where most observed windows are short.

        When at least ``pool_old_short_share`` (60 %) of the windows observed
        in all pools (8 or more) were shorter than the proof
        (``pool_prove_changeovers``), spot returns mostly in windows too short
        to pay for their changeover, so an outage of every pool that has
        lasted ``pool_old_changeovers`` (2) changeovers is worth less waiting:
        on-demand once the slack left is under ``pool_old_ratio`` (20 %) of
        the work left instead of the usual 12 %. A younger outage, or a
        market of long windows: None (the usual rule).
        """
        assert self.pool_old_ratio is not None
        if any(spot_usable(job, m) for m in markets) or any(m.spot_down_s is None for m in markets):
            return None
        first = self._settled_first(job, markets[self.choose_pool(job, markets)])
        if isinstance(first, Placement):
            return None
        ws = [x for m in markets for x in m.spot_windows_s]
        proof = self.pool_prove_changeovers * job.changeover_s
        if len(ws) < MIN_WINDOWS or sum(x < proof for x in ws) < self.pool_old_short_share * len(ws):
            return None
        _, net = first
        down = min(m.spot_down_s or 0 for m in markets)
        old_s = int(self.pool_old_changeovers * job.changeover_s)
        ratio = self.pool_old_ratio if down >= old_s else self.od_ratio
        form = slack_share_form(job, ratio)
        if form[0] < 0:
            p = placed(Capacity.ONDEMAND, "every pool out for a while, windows mostly short: "
                       "slack under its share of the work left", [net, form])
            return PoolPlacement(Capacity.ONDEMAND, None, p.reason, p.recheck_s)
        p = placed(Capacity.NONE, "every pool out: slack to spare, wait", [net, form])
        recheck = p.recheck_s if down >= old_s else max(1, min(p.recheck_s or NEVER_CHANGES_S, old_s - down))
        return PoolPlacement(Capacity.NONE, None, p.reason, recheck)

    def _proof_needed(self, job: JobView, markets: Sequence[MarketView], market: MarketView, prove: int) -> bool:
        if self._round_trips_scarce(job, market):
            return True
        ws = [x for m in markets for x in m.spot_windows_s]
        return len(ws) >= MIN_WINDOWS and sum(x < prove for x in ws) >= self.pool_short_share * len(ws)

    def _survival(self, market: MarketView, h: int) -> float:
        """Chance that the pool's current window lasts ``h`` more seconds: the
        share of its observed windows longer than the current age that lasted
        ``h`` beyond it (at least 4 of them), else memoryless at the observed
        reclaim rate."""
        age = market.spot_up_s or 0
        ws = market.spot_windows_s
        longer = [x for x in ws if x > age]
        if len(longer) >= 4:
            return sum(x - age >= h for x in longer) / len(longer)
        _, rate = GBrokerMarkovPolicy._observed(market)
        return math.exp(-rate * h / 3600)

    def choose_pool(self, job: JobView, markets: Sequence[MarketView]) -> int:
        """Several pools: the job's own pool while it has spot (a move costs a
        changeover); else, among the pools with spot, the one least often
        reclaimed (``pool_choice="rate"``), or whose current window has lasted
        longest (``"age"``: windows are heavy-tailed, old ones tend to last),
        or with the highest uptime share times mean observed window length
        (``"value"``, the ADRS "availability-aware expected value" ranking),
        then the cheapest."""
        if self.pool_choice not in ("age", "value"):
            return super().choose_pool(job, markets)
        up = [k for k, m in enumerate(markets) if m.spot_available >= job.nodes]
        if job.current is Capacity.SPOT and job.pool in up:
            return job.pool  # type: ignore[return-value]
        if up and self.pool_choice == "value":
            return max(up, key=lambda k: (self._window_value(markets[k]), -k))
        if up:
            return min(up, key=lambda k: (-(markets[k].spot_up_s or 0), markets[k].spot_price_micros, k))
        return super().choose_pool(job, markets)

    @staticmethod
    def _window_value(market: MarketView) -> float:
        """Uptime share times the mean observed window (s); the rate model without windows."""
        up, rate = GBrokerMarkovPolicy._observed(market)
        ws = market.spot_windows_s
        mean = sum(ws) / len(ws) if ws else 3600 / max(rate, 1e-3)
        return up * mean

    def _round_trips_scarce(self, job: JobView, market: MarketView) -> bool:
        """Fewer round trips to spot are affordable than spot windows are to come.

        A round trip (on-demand to spot and back) spends two changeovers of
        slack. The windows to come are the observed windows per hour (the
        reclaim rate per hour of uptime times the uptime share) over the
        time left; without observations, the prior.
        """
        left = job.time_left_s or 0
        slack = left - job.work_left_s - job.changeover_s
        if job.changeover_s <= 0:
            return False
        trips = slack / (2 * job.changeover_s)
        up, rate = GBrokerMarkovPolicy._observed(market)
        windows = rate * up * left / 3600
        return trips < self.scarce_factor * windows

    def on_preempt(
        self, job: JobView, history: Sequence[AttemptView], market: MarketView
    ) -> Decision:
        return decision_of(self.place(job, market))
