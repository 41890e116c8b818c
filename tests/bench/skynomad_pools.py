"""SkyNomad's multi-region rule, in our several-pool benchmark.

SkyNomad (NSDI '27; artifact andylizf/skynomad-artifact, strategy
``unified_cost_model_risk``, the one behind the paper's headline figures)
values every choice in dollars per hour of progress and takes the best:

- spot in pool r: ``(V * (E - oh) - c_spot * E) / E``, E the pool's
  expected remaining window at its current age (Nelson-Aalen over its
  observed windows; capped at ``cap_h`` = 2 h and at the time left), oh the
  changeover (0 to stay where the job runs);
- on-demand: ``V - c_od``; waiting: 0;
- V, the value of an hour of progress, is ``v_mult`` (1.2) x the cost per
  hour of work of finishing from here: the share of the time left that
  on-demand must cover at the job's pace so far (``w``), the rest filled
  from the pools by availability over the last 12 h, cheapest
  changeover-adjusted price first, the remainder on on-demand;
- a running job moves only for a gain over ``delta`` = 0.5 $/h + 0.0002 x
  the checkpoint (50 GB) + 0.05 x V; it never stops to wait.

Restated for our model: every pool's observed windows (the look-back our
simulator gives every policy) in place of what SkyNomad learns from its own
runs and one-minute probes (generous: no probe is paid, no history is
missed); no egress and no transfer time between pools (our pools are zones
with one changeover per move); the pace over the whole elapsed time in place
of the last 10 h; no burst factor (its jitter multiplier, 1 in calm
markets); the shared safety net. Prices are per job-hour, as SkyNomad sees a
cluster's. Registered here, for this run only; ``bench_pools.main`` runs
with the arguments given:

    PYTHONPATH=. python tests/bench/skynomad_pools.py --changeovers 720 \\
        --policies uniform-progress-best-pool,gepa,skynomad,gbroker

Options (as ``skynomad@key=value``): ``v_mult``, ``cap_h``, ``delta_base``
(in $/h per job), ``delta_v``, ``v_form="pace"`` (the V100 arm of the
artifact: V = c_od x (work left / time left) / (W / D), at least the lowest
spot price).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_pools  # noqa: E402

from policies.base import (  # noqa: E402
    AttemptView,
    Capacity,
    Decision,
    JobView,
    MarketView,
    Placement,
    Policy,
    PoolPlacement,
    register,
)
from policies.rules import decision_of, safety_form, spot_usable  # noqa: E402

TICK_H = 600 / 3600
"""SkyNomad's tick, which its geometric tail past the last observed window uses."""
AVAIL_WINDOW_S = 12 * 3600
CHECKPOINT_GB = 50


@lru_cache(maxsize=4096)
def _knots(windows_s: tuple[int, ...]) -> tuple[tuple[tuple[float, float], ...], float]:
    """Nelson-Aalen steps (duration h, hazard step) over windows that all ended in a reclaim."""
    xs = sorted(w / 3600 for w in windows_s)
    n = len(xs)
    out: list[tuple[float, float]] = []
    i = 0
    while i < n:
        j = i
        while j < n and xs[j] == xs[i]:
            j += 1
        out.append((xs[i], (j - i) / (n - i)))
        i = j
    tail = max(out[-1][1], 1e-8) if out else 1e-8
    return tuple(out), tail


def expected_left_h(windows_s: tuple[int, ...], age_h: float) -> float:
    knots, tail = _knots(windows_s)
    e, s, t = 0.0, 1.0, age_h
    for tau, step in knots:
        if tau <= age_h:
            continue
        e += s * (tau - t)
        s *= math.exp(-step)
        t = tau
    den = 1 - math.exp(-tail)
    return e + (s * TICK_H / den if den > 1e-9 else s * TICK_H / max(tail, 1e-9))


def recent_uptime(m: MarketView, up_now: bool, horizon_s: int) -> float:
    """Share of the last ``horizon_s`` (at most the look-back) in which the pool had spot."""
    span = min(horizon_s, m.lookback_s + (m.spot_up_s or m.spot_down_s or 0))
    if span <= 0:
        return 0.0
    covered = m.spot_up_s or m.spot_down_s or 0
    upt = min(covered, span) if up_now else 0
    ws, os_ = list(m.spot_windows_s), list(m.spot_outages_s)
    state_up = not up_now
    while covered < span and (ws if state_up else os_):
        run = (ws if state_up else os_).pop()
        take = min(run, span - covered)
        if state_up:
            upt += take
        covered += take
        state_up = not state_up
    return upt / max(covered, 1)


@register
class SkyNomadPolicy(Policy):
    name = "skynomad"
    description = "SkyNomad (NSDI '27): dollars per hour of progress for every choice, V from the pace"

    def __init__(self, v_mult: float = 1.2, cap_h: float = 2.0, delta_base: float = 0.5,
                 delta_v: float = 0.05, v_form: str = "ref") -> None:
        self.v_mult = v_mult
        self.cap_h = cap_h
        self.delta_base = delta_base
        self.delta_v = delta_v
        self.v_form = v_form

    def place(self, job: JobView, market: MarketView) -> Placement:
        pl = self.place_pools(job, [market])
        return Placement(pl.capacity, pl.reason, pl.recheck_s)

    def on_preempt(self, job: JobView, history: Sequence[AttemptView], market: MarketView) -> Decision:
        return decision_of(self.place(job, market))

    def _value(self, job: JobView, markets: Sequence[MarketView], E: list[float], c_spot: list[float],
               c_od: float) -> float:
        T = job.deadline_s / 3600  # type: ignore[operator]
        t = job.elapsed_s / 3600
        p = job.done_s / 3600
        W = job.work_s / 3600
        d = job.changeover_s / 3600
        left = max(W - p, 1e-9)
        if self.v_form == "pace":
            need = left / max(T - t, 1e-9)
            return max(c_od * need / (W / T), min(c_spot))
        # the share of the time left that on-demand must cover at the pace so far
        if t <= 0:
            w = 0.0
        elif abs(p - t) < 1e-6:
            w = 0.5
        else:
            r = min(1.0, max(0.0, p / t))
            if abs(r - 1) < 1e-6:
                w = 0.0
            else:
                x = (r * t - p + (W + 2 * d - T)) / (r - 1)
                w = 0.0 if x >= T else 1.0 if x <= 0 else min(1.0, max(0.0, (T - x) / (T - t)))
        spot_need = (1 - w) * left
        cost = w * left * c_od
        offers = []
        for k, m in enumerate(markets):
            e = E[k]
            eta = (e - d) / e if e > d else 0.0
            cap = recent_uptime(m, spot_usable(job, m), AVAIL_WINDOW_S) * (T - t) * eta
            if cap > 0:
                offers.append((c_spot[k] * e / max(e - d, 1e-6), cap))
        for price, cap in sorted(offers):
            take = min(cap, spot_need)
            cost += take * price
            spot_need -= take
            if spot_need <= 0:
                break
        cost += max(spot_need, 0.0) * c_od
        return self.v_mult * cost / left

    def place_pools(self, job: JobView, markets: Sequence[MarketView]) -> PoolPlacement:
        if not job.interruptible or job.deadline_s is None or not job.checkpointable:
            return PoolPlacement(Capacity.ONDEMAND, None, "no rule for this job: on-demand")
        net = safety_form(job, markets[0], 1)
        if net is not None and net[0] < 0:
            return PoolPlacement(Capacity.ONDEMAND, None, "safety net: no slack left")
        g = job.nodes * job.gpus_per_node
        c_spot = [m.spot_price_micros * g / 1e6 for m in markets]
        c_od = markets[0].ondemand_price_micros * g / 1e6
        t_left_h = max((job.deadline_s - job.elapsed_s) / 3600, 0.0)
        E = [min(expected_left_h(m.spot_windows_s, (m.spot_up_s or 0) / 3600), self.cap_h, t_left_h)
             for m in markets]
        V = self._value(job, markets, E, c_spot, c_od)
        d = job.changeover_s / 3600
        running = job.current is not Capacity.NONE
        here = job.pool if job.current is Capacity.SPOT else None
        if job.current is Capacity.SPOT and here is not None:
            cur = V - c_spot[here]
        elif job.current is Capacity.ONDEMAND:
            cur = V - c_od
        else:
            cur = 0.0
        delta = self.delta_base + 0.0002 * CHECKPOINT_GB + self.delta_v * V
        opts: list[tuple[float, int, Capacity, int | None]] = []
        for k, m in enumerate(markets):
            if not spot_usable(job, m):
                continue
            oh = 0.0 if k == here else d
            e = E[k]
            if e - oh <= 0:
                continue
            val = (V * (e - oh) - c_spot[k] * e) / e
            if val < 0 or (running and k != here and val <= cur + delta):
                continue
            opts.append((val, 1 + k, Capacity.SPOT, k))
        val = V - c_od
        if val >= 0 and job.current is not Capacity.ONDEMAND and not (running and val <= cur + delta):
            opts.append((val, 1 + len(markets), Capacity.ONDEMAND, None))
        opts.sort(key=lambda o: (-o[0], o[1]))
        for val, _, cap, k in opts:
            if val <= cur:
                break
            if cap is Capacity.SPOT and k == here:
                continue
            return PoolPlacement(cap, k, f"best value {val:.2f} $/h over {cur:.2f}")
        if job.current is Capacity.SPOT and here is not None and spot_usable(job, markets[here]):
            return PoolPlacement(Capacity.SPOT, here, "nothing worth more: stay")
        if job.current is Capacity.ONDEMAND:
            return PoolPlacement(Capacity.ONDEMAND, None, "nothing worth more: stay")
        return PoolPlacement(Capacity.NONE, None, "no choice worth its price: wait")


if __name__ == "__main__":
    bench_pools.main()
