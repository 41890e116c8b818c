"""Each policy's decisions on hand-made situations."""

from __future__ import annotations

import math

import pytest

from policies import Capacity, JobView, MarketView, from_name, names
from policies.base import Action
from policies.rules import needs_ondemand, stable_for

H = 3600
UP = MarketView(spot_available=1, step_s=600)
DOWN = MarketView(spot_available=0, step_s=600)


def job(**kw: object) -> JobView:
    base: dict[str, object] = dict(work_s=48 * H, deadline_s=60 * H, changeover_s=720)
    base.update(kw)
    return JobView(**base)  # type: ignore[arg-type]


def test_registry_has_every_policy_and_unknown_name_lists_them() -> None:
    for n in ("ondemand", "greedy", "greedy-no-safety-net", "uniform-progress", "omniscient", "gbroker", "simple"):
        assert n in names()
    with pytest.raises(ValueError, match="choose one of: .*gbroker"):
        from_name("nope")


def test_omniscient_refuses_without_a_plan() -> None:
    with pytest.raises(ValueError, match="simulator"):
        from_name("omniscient")


@pytest.mark.parametrize("name", ["ondemand", "greedy", "greedy-no-safety-net", "uniform-progress", "gbroker"])
def test_non_interruptible_never_on_spot(name: str) -> None:
    p = from_name(name)
    for cur in Capacity:
        for deadline in (None, 60 * H):
            pl = p.place(job(interruptible=False, current=cur, deadline_s=deadline), UP)
            assert pl.capacity is Capacity.ONDEMAND


def test_ondemand_always_ondemand() -> None:
    p = from_name("ondemand")
    assert p.place(job(), UP).capacity is Capacity.ONDEMAND
    assert p.on_preempt(job(), [], DOWN).action is Action.MOVE_ONDEMAND


def test_greedy_spot_when_available_else_wait() -> None:
    p = from_name("greedy")
    assert p.place(job(), UP).capacity is Capacity.SPOT
    assert p.place(job(), DOWN).capacity is Capacity.NONE


def test_greedy_safety_net_moves_to_ondemand_for_good() -> None:
    p = from_name("greedy")
    # time left = work left + changeover + less than one step: must go on-demand
    tight = job(elapsed_s=12 * H - 720 - 300, done_s=0)
    assert needs_ondemand(tight, UP)
    assert p.place(tight, UP).capacity is Capacity.ONDEMAND
    # and it stays there even when spot is available (slack does not come back)
    later = job(elapsed_s=12 * H, done_s=600, current=Capacity.ONDEMAND)
    assert p.place(later, UP).capacity is Capacity.ONDEMAND
    # one step earlier it still waits
    loose = job(elapsed_s=12 * H - 720 - 600, done_s=0)
    assert p.place(loose, DOWN).capacity is Capacity.NONE


def test_greedy_without_net_never_uses_ondemand() -> None:
    p = from_name("greedy-no-safety-net")
    assert p.place(job(elapsed_s=59 * H), DOWN).capacity is Capacity.NONE


def test_gang_needs_all_its_nodes() -> None:
    p = from_name("greedy")
    assert p.place(job(nodes=4), MarketView(spot_available=3)).capacity is Capacity.NONE
    assert p.place(job(nodes=4), MarketView(spot_available=4)).capacity is Capacity.SPOT


def test_uniform_progress_rules() -> None:
    p = from_name("uniform-progress")
    # W/D = 0.8: at 10 h the line is at 8 h.
    ahead = job(elapsed_s=10 * H, done_s=9 * H)
    behind = job(elapsed_s=10 * H, done_s=7 * H)
    assert p.place(ahead, DOWN).capacity is Capacity.NONE
    assert p.place(behind, DOWN).capacity is Capacity.ONDEMAND
    # taking risks: spot whenever available, even when behind
    assert p.place(behind, UP).capacity is Capacity.SPOT
    # hysteresis: on on-demand stay until cp >= ep(t + 2d)
    just = job(elapsed_s=10 * H, done_s=8 * H + 100, current=Capacity.ONDEMAND)
    assert p.place(just, UP).capacity is Capacity.ONDEMAND
    well = job(elapsed_s=10 * H, done_s=8 * H + 2000, current=Capacity.ONDEMAND)
    assert p.place(well, UP).capacity is Capacity.SPOT
    # on on-demand without spot: keep on-demand
    assert p.place(well, DOWN).capacity is Capacity.ONDEMAND
    # safety net with 2d when not on spot
    net = job(elapsed_s=12 * H - 1440 - 500, done_s=0)
    assert p.place(net, UP).capacity is Capacity.ONDEMAND


@pytest.mark.parametrize("name", ["greedy", "uniform-progress", "gbroker"])
def test_no_deadline_is_never_forced_by_a_deadline_rule(name: str) -> None:
    p = from_name(name)
    free = job(deadline_s=None, elapsed_s=500 * H)
    assert p.place(free, UP).capacity is Capacity.SPOT
    assert p.place(job(deadline_s=None, elapsed_s=500 * H), MarketView(spot_available=0, spot_down_s=60)).capacity is Capacity.NONE


def test_gbroker_no_deadline_gives_up_waiting_after_patience() -> None:
    p = from_name("gbroker")
    long_gone = MarketView(spot_available=0, spot_down_s=13 * H)
    assert p.place(job(deadline_s=None, work_s=4 * H), long_gone).capacity is Capacity.ONDEMAND
    assert p.place(job(deadline_s=None, work_s=4 * H, current=Capacity.ONDEMAND), UP).capacity is Capacity.SPOT


def test_gbroker_safety_net_and_slack() -> None:
    p = from_name("gbroker")
    tight = job(elapsed_s=12 * H - 720 - 300)
    assert p.place(tight, UP).capacity is Capacity.ONDEMAND
    # lots of slack, spot available: spot; spot down, early: wait
    calm = MarketView(spot_available=1, spot_uptime_fraction=0.8, spot_reclaim_rate_per_hour=0.2, lookback_s=7 * 24 * H)
    assert p.place(job(deadline_s=96 * H), calm).capacity is Capacity.SPOT
    calm_down = MarketView(spot_available=0, spot_uptime_fraction=0.8, spot_reclaim_rate_per_hour=0.2, lookback_s=7 * 24 * H)
    assert p.place(job(deadline_s=96 * H), calm_down).capacity is Capacity.NONE
    # little slack left for a lot of work while spot is down: on-demand before the net
    assert p.place(job(deadline_s=96 * H, elapsed_s=49 * H, done_s=3 * H), calm_down).capacity is Capacity.ONDEMAND


def test_gbroker_no_checkpoint_prefers_ondemand_when_reclaims_are_frequent() -> None:
    p = from_name("gbroker")
    busy = MarketView(spot_available=1, spot_reclaim_rate_per_hour=1.0, spot_uptime_fraction=0.5, lookback_s=7 * 24 * H)
    assert p.place(job(checkpointable=False, safe_done_s=0, deadline_s=200 * H), busy).capacity is Capacity.ONDEMAND
    short = job(checkpointable=False, safe_done_s=0, work_s=H // 2, deadline_s=10 * H)
    assert p.place(short, busy).capacity is Capacity.SPOT


def test_omniscient_follows_its_plan() -> None:
    p = from_name("omniscient", plan=[(0, 100, Capacity.SPOT), (200, 300, Capacity.ONDEMAND)])
    assert p.place(job(elapsed_s=50), UP).capacity is Capacity.SPOT
    pl = p.place(job(elapsed_s=150), UP)
    assert pl.capacity is Capacity.NONE and pl.recheck_s == 50
    assert p.on_preempt(job(elapsed_s=200), [], DOWN).action is Action.MOVE_ONDEMAND


def test_stable_for_bounds() -> None:
    # value 10 falling at 2/s when idle: flips after 6 s (10 - 2*6 < 0)
    assert stable_for([(10, -2, 0)]) == 6
    # value -5 rising at 1/s when running: flips at 5 s
    assert stable_for([(-5, 0, 1)]) == 5
    assert stable_for([(5, 0, 1)]) is None


def test_gbroker_markov_leaves_ondemand_only_for_a_window_that_lasted() -> None:
    p = from_name("gbroker-markov")
    kw = dict(spot_uptime_fraction=0.8, spot_reclaim_rate_per_hour=0.2, lookback_s=7 * 24 * H)
    on_od = job(deadline_s=96 * H, current=Capacity.ONDEMAND)
    fresh = p.place(on_od, MarketView(spot_available=1, spot_up_s=60, **kw))  # type: ignore[arg-type]
    assert fresh.capacity is Capacity.ONDEMAND and fresh.recheck_s is not None and fresh.recheck_s <= 2 * 720 - 60
    proven = p.place(on_od, MarketView(spot_available=1, spot_up_s=2 * 720, **kw))  # type: ignore[arg-type]
    assert proven.capacity is Capacity.SPOT


def test_gbroker_with_the_daemons_default_market_still_moves_to_spot() -> None:
    # The daemon may not track window ages: unknown ages must not pin a job to on-demand.
    p = from_name("gbroker")
    on_od = job(deadline_s=96 * H, current=Capacity.ONDEMAND)
    assert p.place(on_od, MarketView(spot_available=1)).capacity is Capacity.SPOT
    assert p.place(job(deadline_s=None), MarketView(spot_available=0)).capacity is Capacity.NONE


def test_empirical_residual_life_given_age() -> None:
    from policies.empirical import mean_s, residual_s, residual_stable_s

    lengths = (60, 60, 60, 60, 600, 6000, 6000, 6000, 6000)
    assert mean_s(lengths) == sum(lengths) / len(lengths)
    # A run that outlived the short ones is expected to last much longer: not memoryless.
    young = residual_s(lengths, 0)
    old = residual_s(lengths, 600)
    assert young is not None and old is not None and old > young
    assert old == 6000 - 600
    assert residual_s(lengths, 6000) is None  # no run lasted longer: no evidence
    assert residual_s((), 0) is None
    # The quantised residual cannot change before the bound says so.
    for age in (0, 30, 59, 61, 500, 599, 601, 3000):
        t = residual_stable_s(lengths, age, 2.0)
        assert t is not None and t >= 1
        q = lambda a: None if residual_s(lengths, a) is None else round(math.log(max(1.0, residual_s(lengths, a) or 1)) / math.log(2.0))  # noqa: E731
        assert all(q(age + k) == q(age) for k in range(t))


def test_gbroker_markov_judges_a_window_by_what_windows_of_its_age_did() -> None:
    # The reclaim rate alone says windows last 10 hours on average, but every
    # window seen lasted 2000 s: one of 1440 s has little left, so stay on
    # on-demand, and ask again before that evidence runs out.
    p = from_name("gbroker-markov", empirical=True)
    kw = dict(spot_uptime_fraction=0.8, spot_reclaim_rate_per_hour=0.1, lookback_s=7 * 24 * H,
              spot_windows_s=(2000,) * 20, spot_outages_s=(H,) * 20, spot_down_s=0)
    on_od = job(deadline_s=72 * H, current=Capacity.ONDEMAND)
    blind = p.place(on_od, MarketView(spot_available=1, spot_up_s=2 * 720, spot_down_s=0,
                                      spot_uptime_fraction=0.8, spot_reclaim_rate_per_hour=0.1,
                                      lookback_s=7 * 24 * H))
    assert blind.capacity is Capacity.SPOT
    seen = p.place(on_od, MarketView(spot_available=1, spot_up_s=2 * 720, **kw))  # type: ignore[arg-type]
    assert seen.capacity is Capacity.ONDEMAND
    assert seen.recheck_s is not None and seen.recheck_s <= 2000 - 2 * 720
    # Off by default: the default policy does not read the lengths.
    assert from_name("gbroker-markov").place(on_od, MarketView(spot_available=1, spot_up_s=2 * 720, **kw)).capacity is Capacity.SPOT  # type: ignore[arg-type]


def test_gbroker_markov_paces_waiting_so_slack_is_not_burnt_early() -> None:
    # W 48 h, D 60 h, d 0.2 h: 11.8 h of slack; margin 0.35 -> 4.13 h ahead of the even pace.
    paced, unpaced = from_name("gbroker-markov"), from_name("gbroker-markov", pace_margin=None)
    calm_down = MarketView(spot_available=0, spot_uptime_fraction=0.8, spot_reclaim_rate_per_hour=0.2,
                           lookback_s=7 * 24 * H, spot_down_s=H)
    early = job(elapsed_s=4 * H)  # spent 4 h, allowed 0.79 + 4.13 h: may wait
    pl = paced.place(early, calm_down)
    assert pl.capacity is Capacity.NONE
    # Told when waiting would cross the pace: (4.92 h - 4 h) / (1 - 11.8 / 60) = 1.14 h.
    assert pl.recheck_s is not None and pl.recheck_s <= int(0.922 * H / (1 - 11.8 / 60)) + 1
    late = job(elapsed_s=6 * H)  # spent 6 h, allowed 1.18 + 4.13 h
    assert unpaced.place(late, calm_down).capacity is Capacity.NONE  # the model alone would wait on
    pl = paced.place(late, calm_down)
    assert pl.capacity is Capacity.ONDEMAND and "pace" in pl.reason
    # On on-demand it stays until it is back under the pace by half the margin.
    # D 96 h: 47.8 h of slack, margin 16.7 h; at 30 h the pace allows 14.9 + 16.7 h, on on-demand 8.4 h less.
    on_od = job(deadline_s=96 * H, elapsed_s=30 * H, done_s=5 * H, current=Capacity.ONDEMAND)  # spent 25 h
    assert unpaced.place(on_od, calm_down).capacity is Capacity.NONE
    assert paced.place(on_od, calm_down).capacity is Capacity.ONDEMAND
    caught_up = job(deadline_s=96 * H, elapsed_s=30 * H, done_s=10 * H, current=Capacity.ONDEMAND)  # spent 20 h
    assert paced.place(caught_up, calm_down).capacity is Capacity.NONE


def test_gepa_follows_spot_keeps_ondemand_in_outages_and_waits_on_slack() -> None:
    p = from_name("gepa")
    # W 48 h, D 60 h, d 0.2 h: slack 11.8 h, a fifth of the work is 9.6 h.
    assert p.place(job(), UP).capacity is Capacity.SPOT
    assert p.place(job(current=Capacity.ONDEMAND), UP).capacity is Capacity.SPOT  # back to spot at once
    assert p.place(job(current=Capacity.ONDEMAND), DOWN).capacity is Capacity.ONDEMAND
    wait = p.place(job(), DOWN)
    assert wait.capacity is Capacity.NONE
    # waiting burns slack 1 s per s: on-demand once it is under 9.6 h, 2.2 h from now
    assert wait.recheck_s is not None and abs(wait.recheck_s - int(2.2 * H)) <= 2
    assert p.place(job(elapsed_s=int(2.3 * H)), DOWN).capacity is Capacity.ONDEMAND
    # the shared safety net has the last word
    assert p.place(job(elapsed_s=12 * H - 720 - 300), UP).capacity is Capacity.ONDEMAND


def test_gbroker_is_choosy_about_windows_only_when_round_trips_are_scarce() -> None:
    p = from_name("gbroker")
    on_od = job(current=Capacity.ONDEMAND)  # slack 11.8 h: 29 round trips of 2 x 0.2 h
    busy = dict(spot_uptime_fraction=0.8, spot_reclaim_rate_per_hour=1.0, lookback_s=7 * 24 * H)
    # about 48 windows to come in 60 h: scarce, so a fresh window is not worth leaving on-demand for
    fresh = p.place(on_od, MarketView(spot_available=1, spot_up_s=60, **busy))  # type: ignore[arg-type]
    assert fresh.capacity is Capacity.ONDEMAND and fresh.recheck_s is not None and fresh.recheck_s <= 2 * 720 - 60
    assert p.place(on_od, MarketView(spot_available=1, spot_up_s=2 * 720, **busy)).capacity is Capacity.SPOT  # type: ignore[arg-type]
    # about 10 windows to come: take every one
    calm = dict(busy, spot_reclaim_rate_per_hour=0.2)
    assert p.place(on_od, MarketView(spot_available=1, spot_up_s=60, **calm)).capacity is Capacity.SPOT  # type: ignore[arg-type]
    # in an outage: stay on on-demand; from waiting, wait while the slack is above 12 % of the work
    assert p.place(on_od, DOWN).capacity is Capacity.ONDEMAND
    assert p.place(job(), DOWN).capacity is Capacity.NONE
    # slack 60 - 48 - 0.2 - elapsed against 0.12 x 48 = 5.76 h
    assert p.place(job(elapsed_s=int(5.9 * H)), DOWN).capacity is Capacity.NONE
    assert p.place(job(elapsed_s=int(6.1 * H)), DOWN).capacity is Capacity.ONDEMAND
