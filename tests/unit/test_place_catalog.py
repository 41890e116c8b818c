"""Placement across the pool catalog (Policy.place_catalog, pool_after_preempt): pure, every policy."""

from __future__ import annotations

import pytest

from policies import Action, Capacity, Decision, JobView, MarketView, PoolView, expected_spot_cost, from_name

OWNED = PoolView("owned", Capacity.OWNED, 0, room=True)
OWNED_FULL = PoolView("owned", Capacity.OWNED, 0, room=False)
SPOT_A = PoolView("spot-a", Capacity.SPOT, 350_000, market=MarketView(spot_available=4, spot_price_micros=350_000))
SPOT_B = PoolView("spot-b", Capacity.SPOT, 1_100_000, market=MarketView(spot_available=2, spot_price_micros=1_100_000))
SPOT_A_DOWN = PoolView("spot-a", Capacity.SPOT, 350_000, room=False,
                       market=MarketView(spot_available=0, spot_price_micros=350_000, spot_uptime_fraction=0.9))
OD = PoolView("ondemand", Capacity.ONDEMAND, 3_670_000)
OD_CHEAP = PoolView("ondemand-l4", Capacity.ONDEMAND, 800_000)

POLICIES = ["gbroker", "gbroker-markov", "uniform-progress", "greedy", "gepa"]


@pytest.mark.parametrize("name", POLICIES)
def test_owned_room_comes_first_for_every_job(name: str) -> None:
    policy = from_name(name)
    for job in (JobView(), JobView(interruptible=False), JobView(deadline_s=7200, work_s=3600)):
        choice = policy.place_catalog(job, [SPOT_A, OD, OWNED])
        assert (choice.pool, choice.capacity) == (2, Capacity.OWNED), choice


@pytest.mark.parametrize("name", POLICIES)
def test_owned_full_sends_an_interruptible_job_to_spot(name: str) -> None:
    choice = from_name(name).place_catalog(JobView(work_s=3600), [OWNED_FULL, SPOT_A, OD])
    assert choice.capacity in (Capacity.SPOT, Capacity.NONE) and choice.pool == 1, choice


@pytest.mark.parametrize("name", POLICIES)
def test_a_non_interruptible_job_waits_for_owned_or_goes_ondemand_by_deadline(name: str) -> None:
    policy = from_name(name)
    pools = [OWNED_FULL, SPOT_A, OD]
    no_deadline = policy.place_catalog(JobView(interruptible=False), pools)
    assert (no_deadline.pool, no_deadline.capacity) == (0, Capacity.NONE), no_deadline
    slack = policy.place_catalog(JobView(interruptible=False, work_s=3600, deadline_s=6 * 3600), pools)
    assert (slack.pool, slack.capacity) == (0, Capacity.NONE), slack
    tight = policy.place_catalog(JobView(interruptible=False, work_s=3600, deadline_s=3700), pools)
    assert (tight.pool, tight.capacity) == (2, Capacity.ONDEMAND), tight
    # Never on spot, whatever the prices.
    assert policy.place_catalog(JobView(interruptible=False), [SPOT_A, OD]).capacity is Capacity.ONDEMAND


def test_spot_pools_rank_by_expected_cost_with_their_reclaim_rate() -> None:
    policy = from_name("gbroker")
    job = JobView(work_s=4 * 3600, changeover_s=120)
    assert policy.place_catalog(job, [SPOT_B, SPOT_A, OD]).pool == 1  # A is cheaper
    # A reclaimed every 20 minutes, a non-checkpointing job: A's expected cost is above B's.
    stormy = PoolView("spot-a", Capacity.SPOT, 350_000,
                      market=MarketView(spot_available=4, spot_price_micros=350_000, spot_reclaim_rate_per_hour=3.0))
    fragile = JobView(work_s=4 * 3600, changeover_s=120, checkpointable=False)
    assert expected_spot_cost(fragile, stormy) > expected_spot_cost(fragile, SPOT_B)
    assert policy.place_catalog(fragile, [stormy, SPOT_B, OD]).pool == 1
    # Speed counts: a pool twice as fast at 1.5x the price is cheaper per unit of work.
    fast = PoolView("spot-fast", Capacity.SPOT, 525_000, speed=2.0, market=MarketView(spot_available=4))
    assert policy.place_catalog(job, [SPOT_A, fast, OD]).pool == 1


def test_ondemand_is_the_cheapest_that_fits() -> None:
    choice = from_name("ondemand").place_catalog(JobView(), [SPOT_A, OD, OD_CHEAP])
    assert (choice.pool, choice.capacity) == (2, Capacity.ONDEMAND)


def test_after_a_reclaim_the_job_resumes_in_the_other_zone_when_its_own_is_down() -> None:
    policy = from_name("gbroker")
    job = JobView(pool=0, reclaims=1)
    choice = policy.pool_after_preempt(job, Decision(Action.RESUME_SPOT), [SPOT_A_DOWN, SPOT_B, OD])
    assert (choice.pool, choice.capacity) == (1, Capacity.SPOT)
    # With zone A up again and cheaper, A.
    again = policy.pool_after_preempt(job, Decision(Action.RESUME_SPOT), [SPOT_A, SPOT_B, OD])
    assert again.pool == 0
    moved = policy.pool_after_preempt(job, Decision(Action.MOVE_ONDEMAND), [SPOT_A_DOWN, SPOT_B, OD])
    assert (moved.pool, moved.capacity) == (2, Capacity.ONDEMAND)
    owned = policy.pool_after_preempt(job, Decision(Action.RESUME_SPOT), [SPOT_A_DOWN, SPOT_B, OD, OWNED])
    assert (owned.pool, owned.capacity) == (3, Capacity.OWNED)


def test_a_running_job_moves_back_to_owned_only_when_it_pays() -> None:
    policy = from_name("gbroker")
    long_left = JobView(current=Capacity.ONDEMAND, pool=1, work_s=8 * 3600, done_s=3600, changeover_s=120)
    choice = policy.place_catalog(long_left, [OWNED, OD])
    assert (choice.pool, choice.capacity) == (0, Capacity.OWNED), choice
    # Almost done: the changeover costs more than the saving.
    nearly = JobView(current=Capacity.ONDEMAND, pool=1, work_s=3600, done_s=3540, changeover_s=120)
    assert policy.place_catalog(nearly, [OWNED, OD]).pool == 1
    # A job that cannot checkpoint never moves.
    fragile = JobView(current=Capacity.ONDEMAND, pool=1, work_s=8 * 3600, done_s=3600, checkpointable=False)
    assert policy.place_catalog(fragile, [OWNED, OD]).pool == 1
    # No room in owned: it stays.
    assert policy.place_catalog(long_left, [OWNED_FULL, OD]).pool == 1


def test_two_legacy_pools_place_as_the_single_pool_policy_does() -> None:
    """A [partitions] config is two pools; the catalog answer is the single-pool answer."""
    for name in POLICIES:
        policy = from_name(name)
        for job in (JobView(), JobView(interruptible=False), JobView(deadline_s=3700, work_s=3600),
                    JobView(deadline_s=20 * 3600, work_s=3600)):
            for spot in (MarketView(spot_available=4), MarketView(spot_available=0, spot_down_s=3600)):
                single = policy.place(job, spot)
                pools = [PoolView("spot", Capacity.SPOT, spot.spot_price_micros, market=spot),
                         PoolView("ondemand", Capacity.ONDEMAND, spot.ondemand_price_micros, market=spot)]
                choice = policy.place_catalog(job, pools)
                want = {Capacity.SPOT: (0, Capacity.SPOT), Capacity.NONE: (0, Capacity.NONE),
                        Capacity.ONDEMAND: (1, Capacity.ONDEMAND)}[single.capacity]
                assert (choice.pool, choice.capacity) == want, (name, job, spot, single, choice)
