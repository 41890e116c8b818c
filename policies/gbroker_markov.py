"""`gbroker-markov`: the model-based policy (the default until the rule of
``policies.gbroker`` replaced it), with the exact safety net on top.

Uniform Progress spends slack at one fixed pace whatever the market does.
gbroker instead asks, at every decision, what is cheapest in expectation
given what it has observed of *this* partition: the share of time spot was
available for a gang of this size and how often it was reclaimed. Those two
numbers fit a two-state model of the market (``policies.markov``); a table of
best actions over (work left, time left, mode, spot up or down) is computed
once per model and reused. The table trades off the three levers the paper
names: waiting for spot (spends slack), on-demand (spends money), and
changeovers (spend both).

Then the rules that hold whatever the model says:
- the safety net (``policies.rules``): never spend a step off on-demand when
  a reclaim at its end could make the deadline unreachable, so gbroker never
  misses a deadline the optimum meets;
- not interruptible: on-demand;
- cannot checkpoint: spot only while the whole job could still be redone on
  on-demand in time, and only when the work left is short next to the
  observed time between reclaims (otherwise the rerun costs more than spot saves);
- no deadline: spot when available, otherwise wait; after ``patience_s``
  without spot (default: the larger of 12 hours and the work left) on-demand,
  back to spot when it returns. Nothing waits forever;
- pacing: waiting may not spend the slack much faster than evenly over the
  job's window (``pace_margin``), because a wrong model would otherwise burn
  early the slack that later spot windows need;
- a group whose remaining budget cannot pay for the job on on-demand gets
  the cheapest route the deadline allows: spot whenever there is slack.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

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
from policies.empirical import mean_s, residual_s, residual_stable_s
from policies.markov import ONDEMAND, SPOT, WAIT, TableKey, build, step_probabilities
from policies.rules import (
    NEVER_CHANGES_S,
    Form,
    decision_of,
    placed,
    safety_form,
    spot_usable,
    stable_for,
    work_at_risk_s,
)

PRIOR_UPTIME = 0.6
PRIOR_RECLAIMS_PER_HOUR = 0.3
MIN_LOOKBACK_S = 6 * 3600
"""Less history than this and the prior is blended in."""
HINT_STEPS = 24
"""How far ahead (in table steps) a placement promises to stay the same."""

_CAP = {WAIT: Capacity.NONE, SPOT: Capacity.SPOT, ONDEMAND: Capacity.ONDEMAND}


TABLE_REACH_S = 48 * 3600


def _round_up(x: int, unit: int) -> int:
    unit = max(1, unit)
    return -(-x // unit) * unit


def _quantise_log(x: float, factor: float = 1.25) -> float:
    return factor ** round(math.log(max(x, 1e-4)) / math.log(factor))


@register
class GBrokerMarkovPolicy(Policy):
    name = "gbroker-markov"
    description = "model-based: fits the observed spot market, picks the cheapest expected action, exact safety net"

    def __init__(
        self,
        step_target_s: int = 360,
        min_step_s: int = 360,
        patience_s: int = 12 * 3600,
        prove_changeovers: float = 2.0,
        empirical: bool = False,
        residual_factor: float = 2.0,
        condition: str = "window",
        pace_margin: float | None = 0.35,
        follow_spot: bool = False,
    ) -> None:
        """``empirical``: condition the model on the age of the current spot
        window (``condition="window"``), outage (``"outage"``) or both, using
        the observed lengths in ``MarketView.spot_windows_s`` /
        ``spot_outages_s`` (``policies.empirical``); expected times left are
        quantised to powers of ``residual_factor``. Off by default: on the
        benchmark it lowers the mean gap but not on most settings (see
        docs/SIMULATOR.md).

        ``pace_margin``: how far ahead of an even pace (as a share of the
        job's whole slack) waiting may spend slack before the job goes to
        on-demand (``_paced``); None turns pacing off.

        ``follow_spot``: the table decides only what to do from waiting in
        an outage and whether to leave on-demand for spot; spot is taken
        whenever it is there from waiting or spot, and on-demand is kept
        through an outage (the GEPA rule's two moves)."""
        self.follow_spot = follow_spot
        self.condition = condition
        self.pace_margin = pace_margin
        self.empirical = empirical
        self.residual_factor = residual_factor
        self.step_target_s = step_target_s
        self.min_step_s = min_step_s
        self.patience_s = patience_s
        self.prove_changeovers = prove_changeovers

    def prove_s(self, job: JobView) -> int:
        """How long a spot window must have lasted before on-demand is left for it."""
        return int(self.prove_changeovers * job.changeover_s)

    # -- the decision -------------------------------------------------------
    def _settled_first(self, job: JobView, market: MarketView) -> Placement | tuple[bool, Form]:
        """What both gbroker rules decide before their own: a job that cannot be
        interrupted, has no deadline, no slack, no checkpoints or too little budget.
        Otherwise (whether spot is usable, the safety net's form) for the rule itself."""
        if not job.interruptible:
            return Placement(Capacity.ONDEMAND, "not interruptible", NEVER_CHANGES_S)
        spot = spot_usable(job, market)
        if job.deadline_s is None:
            return self._no_deadline(job, market, spot)
        net = safety_form(job, market, 1)
        assert net is not None
        if net[0] < 0:
            return placed(Capacity.ONDEMAND, "safety net: no slack left", [])
        if not job.checkpointable:
            return self._no_checkpoint(job, market, spot, net)
        if (
            job.budget_left_micros is not None
            and job.budget_left_micros < market.ondemand_price_micros * job.gpus * job.work_left_s // 3600
        ):
            cap = Capacity.SPOT if spot else Capacity.NONE
            return placed(cap, "budget too small for on-demand: cheapest route", [net])
        return spot, net

    def place(self, job: JobView, market: MarketView) -> Placement:
        first = self._settled_first(job, market)
        if isinstance(first, Placement):
            return first
        spot, net = first

        if self.follow_spot:
            if spot and job.current is not Capacity.ONDEMAND:
                return placed(Capacity.SPOT, "spot available", [net])
            if not spot and job.current is Capacity.ONDEMAND:
                return placed(Capacity.ONDEMAND, "outage: stay on on-demand", [net])
        table, delta = self._table(job, market)
        age_stable = self._conditional_stable_s(market)
        left = job.time_left_s
        assert left is not None
        lv = left // delta
        r = -(-job.work_left_s // delta)
        mode = {Capacity.SPOT: "spot", Capacity.ONDEMAND: "ondemand"}.get(job.current, "idle")
        act = table.action(mode, spot, lv, r)
        if act == SPOT and not spot:
            act = WAIT
        hint = self._hint(table, mode, spot, act, lv, r, left, delta)
        stable = stable_for([net])
        if stable is not None:
            hint = min(hint, stable)
        if age_stable is not None:
            hint = min(hint, age_stable)
        if (
            act == SPOT
            and job.current is Capacity.ONDEMAND
            and market.spot_up_s is not None
            and market.spot_up_s < self.prove_s(job)
        ):
            # Many spot windows are shorter than a changeover: leave on-demand
            # only for a window that has already lasted a while.
            act = ONDEMAND
            hint = min(hint, self.prove_s(job) - market.spot_up_s)
        act, hint, paced = self._paced(job, act, hint)
        cap = _CAP[act]
        reason = "slack spent ahead of pace: on-demand" if paced else f"expected cheapest: {cap.value}"
        return Placement(cap, reason, max(1, hint))

    def _paced(self, job: JobView, act: int, hint: int) -> tuple[int, int, bool]:
        """Do not spend slack much faster than evenly over the job's window.

        The table's market model can be wrong: outages have long tails, and
        waiting on the model early can burn the slack that later, better spot
        windows would need (the job is then stuck on on-demand to the end).
        Waiting is allowed while the slack spent so far (elapsed - done) is
        below the even pace (the whole slack spread over the deadline) plus
        ``pace_margin`` of the whole slack; past that the job runs on
        on-demand, and leaves it to wait again only once it is back under the
        pace by half the margin. Returns (action, hint, paced).
        """
        if self.pace_margin is None or act != WAIT or job.deadline_s is None:
            return act, hint, False
        total = job.deadline_s - job.work_s - job.changeover_s
        if total <= 0:
            return act, hint, False
        spent = job.elapsed_s - job.done_s
        allowed = total * job.elapsed_s / job.deadline_s + self.pace_margin * total
        if job.current is Capacity.ONDEMAND:
            allowed -= self.pace_margin * total / 2
        if spent >= allowed:
            # On on-demand, spent stays put while allowed grows by total / deadline per s.
            return ONDEMAND, min(hint, max(1, int((spent - allowed) * job.deadline_s / total) + 1)), True
        # Waiting: spent grows 1 s per s, allowed total / deadline s per s.
        rate = 1 - total / job.deadline_s
        if rate <= 0:
            return act, hint, False
        return act, min(hint, max(1, int((allowed - spent) / rate))), False

    def on_preempt(
        self, job: JobView, history: Sequence[AttemptView], market: MarketView
    ) -> Decision:
        return decision_of(self.place(job, market))

    # -- cases ----------------------------------------------------------------
    def _no_deadline(self, job: JobView, market: MarketView, spot: bool) -> Placement:
        patience = max(self.patience_s, job.work_left_s)
        if spot:
            return Placement(Capacity.SPOT, "no deadline: spot", NEVER_CHANGES_S)
        if job.current is Capacity.ONDEMAND:
            return Placement(Capacity.ONDEMAND, "no deadline: on-demand until spot is back", NEVER_CHANGES_S)
        if market.spot_down_s is None:
            return Placement(Capacity.NONE, "no deadline: wait for spot", NEVER_CHANGES_S)
        if market.spot_down_s >= patience:
            return Placement(Capacity.ONDEMAND, "no deadline: spot gone too long", NEVER_CHANGES_S)
        return Placement(Capacity.NONE, "no deadline: wait for spot", patience - market.spot_down_s)

    def _no_checkpoint(
        self, job: JobView, market: MarketView, spot: bool, net: tuple[int, int, int]
    ) -> Placement:
        rate = market.spot_reclaim_rate_per_hour if market.lookback_s else PRIOR_RECLAIMS_PER_HOUR
        survive = math.exp(-rate * work_at_risk_s(job) / 3600)
        if job.current is Capacity.ONDEMAND:
            return placed(Capacity.ONDEMAND, "no checkpoints: stay where the work is", [net])
        if survive < 0.5:
            return placed(Capacity.ONDEMAND, "no checkpoints and reclaims too frequent", [net])
        cap = Capacity.SPOT if spot else Capacity.NONE
        return placed(cap, "no checkpoints: spot while a rerun would still fit", [net])

    # -- the model ------------------------------------------------------------
    def _table(self, job: JobView, market: MarketView):  # type: ignore[no-untyped-def]
        d = job.changeover_s
        if d <= 0:
            c, delta = 0, self.step_target_s
        else:
            c = max(1, round(d / self.step_target_s))
            delta = max(1, self.min_step_s, d // c)
        up, rate = self._observed(market)
        p, q = step_probabilities(rate, up, delta)
        if self.empirical:
            p, q = self._conditional(market, delta, p, q)
        ratio = market.spot_price_micros / max(1, market.ondemand_price_micros)
        key = TableKey(
            delta_s=delta,
            c=c,
            # Decisions at a cell do not depend on how far the table reaches,
            # so round its reach up: one table serves many jobs.
            r_max=_round_up(-(-job.work_s // delta), TABLE_REACH_S // delta),
            l_max=_round_up(-(-(job.deadline_s or 0) // delta), TABLE_REACH_S // delta),
            p_down=round(p, 6),
            p_up=round(q, 6),
            spot_ratio=round(min(1.0, ratio) * 20) / 20,
        )
        return build(key), delta

    def _conditional_stable_s(self, market: MarketView) -> int | None:
        """How long the model chosen by ``_conditional`` stays the same as the current run ages."""
        if not self.empirical or market.spot_down_s is None or market.spot_up_s is None:
            return None
        if market.spot_down_s == 0:
            if self.condition == "outage":
                return None
            return residual_stable_s(market.spot_windows_s, market.spot_up_s, self.residual_factor)
        if self.condition == "window":
            return None
        return residual_stable_s(market.spot_outages_s, market.spot_down_s, self.residual_factor)

    def _conditional(self, market: MarketView, delta: int, p: float, q: float) -> tuple[float, float]:
        """Per-step chances of a change, from the observed lengths, given the age of the current run.

        The current run (window or outage) gets its expected time left at its
        age; the other state its mean observed length. Each is replaced only
        where there is enough evidence; the result is quantised so that
        tables are shared.
        """
        if market.spot_down_s is None or market.spot_up_s is None:
            return p, q  # ages not tracked: nothing to condition on
        if market.spot_down_s == 0:
            r_up = residual_s(market.spot_windows_s, market.spot_up_s or 0)
            r_dn = mean_s(market.spot_outages_s)
        else:
            r_up = mean_s(market.spot_windows_s)
            r_dn = residual_s(market.spot_outages_s, market.spot_down_s or 0)
        f = self.residual_factor
        if self.condition == "outage":
            r_up = None
        if self.condition == "window":
            r_dn = None
        if r_up is not None:
            p = 1 - math.exp(-delta / _quantise_log(max(r_up, 1.0), f))
        if r_dn is not None:
            q = 1 - math.exp(-delta / _quantise_log(max(r_dn, 1.0), f))
        return p, q

    @staticmethod
    def _observed(market: MarketView) -> tuple[float, float]:
        """Uptime share and reclaims per hour of uptime, blended with a prior on short history."""
        w = min(1.0, market.lookback_s / MIN_LOOKBACK_S) if market.spot_uptime_fraction is not None else 0.0
        up = w * (market.spot_uptime_fraction or 0.0) + (1 - w) * PRIOR_UPTIME
        rate = w * market.spot_reclaim_rate_per_hour + (1 - w) * PRIOR_RECLAIMS_PER_HOUR
        up = round(min(max(up, 0.02), 0.98) * 20) / 20
        return up, _quantise_log(rate, 1.4)

    @staticmethod
    def _hint(table, mode: str, spot: bool, act: int, lv: int, r: int, left: int, delta: int) -> int:  # type: ignore[no-untyped-def]
        """Seconds the table's answer certainly stays ``act``.

        Time left drops one table step every ``delta`` seconds; work left drops
        at most as fast. So within t steps the cell is (lv - t', r - a) with
        t' <= t and a <= t' + 1: check that triangle.
        """
        if mode == "spot":
            arr = table.spot_up if spot else table.idle_down
        elif mode == "ondemand":
            arr = table.od_up if spot else table.od_down
        else:
            arr = table.idle_up if spot else table.idle_down
        key = table.key
        lv = min(lv, key.l_max)
        r = min(r, key.r_max)
        first_drop = left - lv * delta + 1  # seconds until lv becomes lv - 1
        if r <= 0 or r > lv:
            return first_drop
        T = min(HINT_STEPS, lv - 1)
        if T <= 0:
            return first_drop
        lo_r = max(1, r - T - 1)
        block = arr[lv - T : lv + 1, lo_r : r + 1][::-1]  # row t = time left lv - t
        t_idx = np.arange(T + 1)[:, None]
        a_idx = (r - np.arange(lo_r, r + 1))[None, :]
        region = a_idx <= t_idx + 1
        # cells with r' > l' would be "ondemand" by rule; include them as they are
        bad = region & (block != act)
        rows = np.nonzero(bad.any(axis=1))[0]
        if len(rows) == 0:
            t_ok = T
        else:
            t_ok = int(rows[0]) - 1
        if t_ok < 0:
            return 1
        return first_drop + t_ok * delta

