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


def _on_ondemand(**kw: object) -> JobView:
    """A checkpointing deadline job running on on-demand (catalog pool 1) with slack to spare."""
    base: dict[str, object] = dict(current=Capacity.ONDEMAND, pool=1, work_s=8 * 3600, done_s=3600, safe_done_s=3600,
                                   elapsed_s=3600, deadline_s=12 * 3600, changeover_s=120)
    base.update(kw)
    return JobView(**base)  # type: ignore[arg-type]


def _spot(name: str, price: int, **market: object) -> PoolView:
    m: dict[str, object] = dict(spot_available=4, spot_price_micros=price, spot_up_s=3600, spot_down_s=0)
    m.update(market)
    return PoolView(name, Capacity.SPOT, price, market=MarketView(**m))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", [*POLICIES, "simple", "ondemand"])
def test_a_job_on_ondemand_goes_back_to_spot_exactly_when_the_policys_own_rule_says_so(name: str) -> None:
    """The daemon asks a running job what the simulator asks at every step (``place_pools`` with the
    spot pools' markets): a move back to spot whenever that answer is spot, and only then."""
    policy = from_name(name)
    markets = [dict(spot_up_s=3600), dict(spot_up_s=30), dict(spot_available=0, spot_up_s=0, spot_down_s=600)]
    jobs = [_on_ondemand(), _on_ondemand(deadline_s=9 * 3600 + 600), _on_ondemand(deadline_s=None),
            _on_ondemand(reclaims=5), _on_ondemand(done_s=7 * 3600, safe_done_s=7 * 3600)]
    answers = set()
    for job in jobs:
        for m in markets:
            spot = _spot("spot-a", 350_000, **m)
            choice = policy.place_catalog(job, [spot, OD])
            asked = policy.place_pools(JobView(**{**job.__dict__, "pool": None}),
                                       [MarketView(**{**spot.market.__dict__, "ondemand_price_micros": OD.price_micros})])
            want = (0, Capacity.SPOT) if asked.capacity is Capacity.SPOT else (1, Capacity.ONDEMAND)
            assert (choice.pool, choice.capacity) == want, (name, job, m, asked, choice)
            answers.add(choice.capacity)
    if name == "ondemand":
        assert answers == {Capacity.ONDEMAND}
    elif name == "simple":  # on-demand for good after its reclaim limit
        assert policy.place_catalog(_on_ondemand(reclaims=5), [_spot("spot-a", 350_000), OD]).pool == 1
    elif name == "gbroker":
        assert answers == {Capacity.SPOT, Capacity.ONDEMAND}


def test_a_job_on_ondemand_stays_where_moving_back_to_spot_would_not_pay_or_is_not_allowed() -> None:
    policy = from_name("gbroker")
    up = _spot("spot-a", 350_000)
    assert policy.place_catalog(_on_ondemand(), [up, OD]).capacity is Capacity.SPOT
    stays = {
        "not interruptible": (_on_ondemand(interruptible=False), [up, OD]),
        "cannot checkpoint": (_on_ondemand(checkpointable=False), [up, OD]),
        "unsaved work past a changeover": (_on_ondemand(safe_done_s=3600 - 121), [up, OD]),
        "spot never observed": (_on_ondemand(), [_spot("spot-a", 350_000, spot_up_s=None, spot_down_s=None), OD]),
        "spot dearer than on-demand": (_on_ondemand(), [_spot("spot-a", 4_000_000), OD]),
        "no room for the gang": (_on_ondemand(), [PoolView("spot-a", Capacity.SPOT, 350_000, room=False,
                                                           market=up.market), OD]),
        "slack under a changeover there and back": (_on_ondemand(deadline_s=3600 + 7 * 3600 + 239), [up, OD]),
    }
    for why, (job, pools) in stays.items():
        choice = policy.place_catalog(job, pools)
        assert (choice.pool, choice.capacity) == (1, Capacity.ONDEMAND), (why, choice)
    # Unsaved work of exactly one changeover, and slack for exactly the round trip: it goes.
    assert policy.place_catalog(_on_ondemand(safe_done_s=3600 - 120), [up, OD]).capacity is Capacity.SPOT
    edge = _on_ondemand(deadline_s=3600 + 7 * 3600 + 240 + up.market.step_s)
    assert policy.place_catalog(edge, [up, OD]).capacity is Capacity.SPOT


def test_over_several_spot_pools_a_job_leaves_ondemand_for_the_oldest_window_once_it_is_proven() -> None:
    """gbroker's multi-pool rule, as in the simulator: where most observed windows are shorter than
    3 changeovers, a job on on-demand leaves only for a window that has lasted that long, and for the
    pool whose window is oldest (here the dearer one, catalog pool 2, behind the on-demand pool 1)."""
    policy = from_name("gbroker")
    short = dict(spot_windows_s=(60,) * 10 + (7200,) * 2, spot_uptime_fraction=0.5, lookback_s=86_400,
                 spot_reclaim_rate_per_hour=0.5)
    job = _on_ondemand(deadline_s=30 * 3600)
    young = [_spot("spot-a", 350_000, spot_up_s=100, **short), OD, _spot("spot-b", 500_000, spot_up_s=200, **short)]
    assert policy.place_catalog(job, young).capacity is Capacity.ONDEMAND
    proven = [_spot("spot-a", 350_000, spot_up_s=100, **short), OD, _spot("spot-b", 500_000, spot_up_s=360, **short)]
    choice = policy.place_catalog(job, proven)
    assert (choice.pool, choice.capacity) == (2, Capacity.SPOT), choice
    assert "back to spot in spot-b" in choice.reason
