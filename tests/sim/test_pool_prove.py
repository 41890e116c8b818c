"""gbroker over several pools: when a job on on-demand leaves it for spot (``pool_rule="prove"``)."""

from __future__ import annotations

from policies import Capacity, JobView, MarketView
from policies.gbroker import GBrokerPolicy

D = 720  # a 12-minute changeover
WEEK = 7 * 24 * 3600


def market(up_s: int, rate: float = 1.0, windows: tuple[int, ...] = ()) -> MarketView:
    """A pool whose spot window has lasted ``up_s`` seconds (0: no spot now)."""
    return MarketView(spot_available=int(up_s > 0), step_s=60, spot_reclaim_rate_per_hour=rate,
                      spot_uptime_fraction=0.7, lookback_s=WEEK, spot_up_s=up_s,
                      spot_down_s=0 if up_s else 600, spot_windows_s=windows)


def on_ondemand(slack_s: int, work_left_s: int = 20 * 3600) -> JobView:
    work = 40 * 3600
    done = work - work_left_s
    return JobView(work_s=work, done_s=done, elapsed_s=10 * 3600, deadline_s=10 * 3600 + work_left_s + D + slack_s,
                   changeover_s=D, current=Capacity.ONDEMAND, pool=0)


def policy(**kw: object) -> GBrokerPolicy:
    return GBrokerPolicy(pool_choice="age", pool_rule="prove", **kw)  # type: ignore[arg-type]


def test_scarce_round_trips_wait_for_a_window_that_has_lasted_the_proof() -> None:
    p = policy()
    job = on_ondemand(slack_s=2 * 3600)  # 5 round trips against ~14 windows in the time left: scarce
    young = [market(1 * D), market(2 * D)]
    pl = p.place_pools(job, young)
    assert pl.capacity is Capacity.ONDEMAND and pl.pool is None
    # one pool's window has now lasted 3 changeovers: leave for that one, not the younger one
    pl = p.place_pools(job, [market(1 * D), market(3 * D), market(0)])
    assert (pl.capacity, pl.pool) == (Capacity.SPOT, 1)


def test_plenty_of_round_trips_leave_on_demand_at_once_for_the_oldest_window() -> None:
    p = policy()
    job = on_ondemand(slack_s=30 * 3600)
    long_windows = tuple([10 * D] * 10)  # none shorter than the proof
    pl = p.place_pools(job, [market(60, windows=long_windows), market(600, windows=long_windows)])
    assert (pl.capacity, pl.pool) == (Capacity.SPOT, 1)


def test_many_short_windows_ask_for_the_proof_even_with_slack() -> None:
    p = policy()
    job = on_ondemand(slack_s=30 * 3600)
    mixed = tuple([D] * 4 + [10 * D] * 6)  # 40 % of the windows shorter than 3 changeovers
    pl = p.place_pools(job, [market(600, windows=mixed), market(60, windows=mixed)])
    assert pl.capacity is Capacity.ONDEMAND
    # fewer than 8 windows observed: their share is not trusted
    pl = p.place_pools(job, [market(600, windows=mixed[:3]), market(60, windows=mixed[:3])])
    assert (pl.capacity, pl.pool) == (Capacity.SPOT, 0)
    # a share of 50 % asked for: 40 % short is not enough
    pl = policy(pool_short_share=0.5).place_pools(job, [market(600, windows=mixed), market(60, windows=mixed)])
    assert (pl.capacity, pl.pool) == (Capacity.SPOT, 0)


def test_the_rule_leaves_other_states_and_the_safety_net_alone() -> None:
    p = policy()
    # no spot anywhere: stay on on-demand
    pl = p.place_pools(on_ondemand(slack_s=2 * 3600), [market(0), market(0)])
    assert pl.capacity is Capacity.ONDEMAND and pl.pool is None
    # no slack left: on-demand, however old the window
    pl = p.place_pools(on_ondemand(slack_s=0), [market(50 * D), market(0)])
    assert pl.capacity is Capacity.ONDEMAND
    # not on on-demand (after a reclaim): spot at once in the pool with the oldest window
    idle = JobView(work_s=40 * 3600, done_s=20 * 3600, elapsed_s=10 * 3600, deadline_s=32 * 3600,
                   changeover_s=D, current=Capacity.NONE, pool=0)
    pl = p.place_pools(idle, [market(0), market(60), market(2 * D)])
    assert (pl.capacity, pl.pool) == (Capacity.SPOT, 2)
    # one pool: the single-pool rule, unchanged
    one = p.place_pools(on_ondemand(slack_s=2 * 3600), [market(1 * D)])
    assert one.capacity is p.place(on_ondemand(slack_s=2 * 3600), market(1 * D)).capacity


def out(down_s: int | None, windows: tuple[int, ...]) -> MarketView:
    """A pool with no spot now, out for ``down_s`` seconds."""
    return MarketView(spot_available=0, step_s=60, spot_reclaim_rate_per_hour=1.0, spot_uptime_fraction=0.4,
                      lookback_s=WEEK, spot_up_s=None if down_s is None else 0, spot_down_s=down_s,
                      spot_windows_s=windows)


def waiting(slack_share: float, work_left_s: int = 20 * 3600) -> JobView:
    """A job waiting for spot whose slack left is ``slack_share`` of its work left."""
    work = 40 * 3600
    slack = int(slack_share * work_left_s)
    return JobView(work_s=work, done_s=work - work_left_s, elapsed_s=10 * 3600,
                   deadline_s=10 * 3600 + work_left_s + D + slack, changeover_s=D, current=Capacity.NONE, pool=0)


SHORT = tuple([D] * 7 + [10 * D] * 3)  # 70 % of the windows shorter than the 3-changeover proof
LONG = tuple([D] * 3 + [10 * D] * 7)  # 30 %


def test_an_old_outage_of_every_pool_with_short_windows_goes_to_on_demand_sooner() -> None:
    p = policy()
    job = waiting(slack_share=0.15)  # above the usual 12 %, under the 20 % for an old outage
    pl = p.place_pools(job, [out(2 * D, SHORT), out(3 * D, SHORT)])
    assert pl.capacity is Capacity.ONDEMAND and pl.pool is None
    # the rule before: wait while the slack is above 12 % of the work left
    pl = policy(pool_old_ratio=None).place_pools(job, [out(2 * D, SHORT), out(3 * D, SHORT)])
    assert pl.capacity is Capacity.NONE
    # more slack than 20 % of the work left: wait, however old the outage
    pl = p.place_pools(waiting(slack_share=0.25), [out(2 * D, SHORT), out(3 * D, SHORT)])
    assert pl.capacity is Capacity.NONE


def test_a_young_outage_waits_and_asks_again_when_it_turns_old() -> None:
    p = policy()
    job = waiting(slack_share=0.15)
    # the outage of every pool began when the later pool went out: D ago
    pl = p.place_pools(job, [out(D, SHORT), out(5 * D, SHORT)])
    assert pl.capacity is Capacity.NONE
    assert pl.recheck_s is not None and 1 <= pl.recheck_s <= D
    # the same outage once it has lasted 2 changeovers
    assert p.place_pools(job, [out(2 * D, SHORT), out(6 * D, SHORT)]).capacity is Capacity.ONDEMAND


def test_long_windows_or_no_outage_tracking_keep_the_usual_share() -> None:
    p = policy()
    job = waiting(slack_share=0.15)
    assert p.place_pools(job, [out(4 * D, LONG), out(4 * D, LONG)]).capacity is Capacity.NONE
    # fewer than 8 windows observed
    assert p.place_pools(job, [out(4 * D, SHORT[:3]), out(4 * D, SHORT[:3])]).capacity is Capacity.NONE
    # the outage's age is not tracked
    assert p.place_pools(job, [out(None, SHORT), out(None, SHORT)]).capacity is Capacity.NONE
    # under 12 %: on-demand either way
    assert p.place_pools(waiting(slack_share=0.08), [out(D, LONG), out(D, LONG)]).capacity is Capacity.ONDEMAND
