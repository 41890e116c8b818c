"""The daemon's view of the spot market, from node samples (our own logic: fake node lists)."""

from datetime import datetime, timedelta, UTC

from broker.market import MarketWatch, SpotObserver
from broker.slurm.backend import NodeInfo
from broker.states import NodeState

T = datetime(2026, 9, 1, tzinfo=UTC)


def node(name: str, state: NodeState, raw: str = "idle~") -> NodeInfo:
    return NodeInfo(name=name, state_raw=raw, state=state, partitions=["spot"], features=[], gpus=4, reason="")


def test_streaks_uptime_and_availability() -> None:
    obs = SpotObserver()
    up = [node("spot1", NodeState.POWERED_DOWN), node("spot2", NodeState.IDLE, "idle")]
    down = [node("spot1", NodeState.DOWN, "down"), node("spot2", NodeState.IDLE, "idle+drain")]
    assert obs.summary(T) == {}
    obs.observe(up, "spot", T)                              # up for 300 s
    obs.observe(down, "spot", T + timedelta(seconds=300))   # down for 100 s
    obs.observe(down, "spot", T + timedelta(seconds=400))
    s = obs.summary(T + timedelta(seconds=450))
    assert s["spot_available"] == 0
    assert s["spot_down_s"] == 150 and s["spot_up_s"] == 0
    assert s["lookback_s"] == 400
    assert abs(s["spot_uptime_fraction"] - 0.75) < 1e-9
    obs.observe(up, "spot", T + timedelta(seconds=500))
    s = obs.summary(T + timedelta(seconds=560))
    assert s["spot_available"] == 2 and s["spot_up_s"] == 60 and s["spot_down_s"] == 0
    # A gang of three never fits on two nodes.
    assert obs.summary(T + timedelta(seconds=560), need=3)["spot_up_s"] == 0


def test_old_samples_leave_the_window() -> None:
    obs = SpotObserver()
    obs.observe([node("spot1", NodeState.IDLE, "idle")], "spot", T)
    obs.observe([node("spot1", NodeState.IDLE, "idle")], "spot", T + timedelta(days=8))
    assert len(obs.samples) == 1


def test_a_gang_sees_its_own_windows_and_outages() -> None:
    obs = SpotObserver()
    n = lambda k: [node(f"spot{i}", NodeState.IDLE, "idle") for i in range(k)]  # noqa: E731
    # available nodes over time: 4 (0-100 s), 2 (100-400), 4 (400-1000), 2 (1000-1300), 4 (1300-)
    for t, k in [(0, 4), (100, 2), (400, 4), (1000, 2), (1300, 4), (1350, 4)]:
        obs.observe(n(k), "spot", T + timedelta(seconds=t))
    now = T + timedelta(seconds=1400)
    one = obs.summary(now, need=1)
    assert one["spot_windows_s"] == () and one["spot_outages_s"] == ()  # always up: one run, still going
    gang = obs.summary(now, need=3)
    # The first window is cut by the start of the history, the last still goes on.
    assert gang["spot_windows_s"] == (600,)
    assert gang["spot_outages_s"] == (300, 300)
    assert gang["spot_up_s"] == 100 and gang["spot_down_s"] == 0
    assert abs(gang["spot_uptime_fraction"] - 750 / 1350) < 1e-9


def test_the_daemon_gives_each_gang_its_own_market() -> None:
    from types import SimpleNamespace

    from broker.jobs.placement import market_view
    from policies import MarketView

    obs = SpotObserver()
    for t, k in [(0, 4), (100, 2), (400, 2)]:
        obs.observe([node(f"spot{i}", NodeState.IDLE, "idle") for i in range(k)], "spot", T + timedelta(seconds=t))
    at = T + timedelta(seconds=450)
    watch = MarketWatch(observer=obs)
    watch.refresh(MarketView(spot_reclaim_rate_per_hour=0.5, **obs.summary(at, 1)), None, at)
    svc = SimpleNamespace(market=watch)
    single, gang = market_view(svc, 1), market_view(svc, 3)
    assert single.spot_up_s == 450 and single.spot_down_s == 0
    assert gang.spot_up_s == 0 and gang.spot_down_s == 350
    assert gang.spot_reclaim_rate_per_hour == 0.5 and gang.spot_available == 2
    assert market_view(SimpleNamespace(market=MarketWatch()), 3) == MarketView()  # no tick yet: the defaults


def test_each_gang_size_gets_its_own_reclaim_rate() -> None:
    from types import SimpleNamespace

    from broker.jobs.placement import market_view
    from broker.market import OWN_SIZE_HOURS, ReclaimHistory
    from policies import MarketView

    # 10 single-node reclaims in 40 spot hours, 1 four-node reclaim in 2 hours.
    history = ReclaimHistory({1: (10, 40.0), 4: (1, 2.0)})
    assert history.rate(1) == 10 / 40
    # Too little 4-node history: per node-hour over everything (11 / (40 + 8)) times 4.
    assert abs(history.rate(4) - 4 * 11 / 48) < 1e-12
    # A size never seen: the same bound.
    assert abs(history.rate(16) - 16 * 11 / 48) < 1e-12
    # Enough history of its own: its own rate.
    own = ReclaimHistory({1: (10, 40.0), 4: (3, OWN_SIZE_HOURS)})
    assert own.rate(4) == 3 / OWN_SIZE_HOURS
    assert ReclaimHistory().rate(4) == 0.0
    # Only 4-node gangs seen, their nodes reclaimed together: 10 reclaims in 100 gang-hours.
    # A single node is then reclaimed about as often as a gang, not a quarter as often.
    together = ReclaimHistory({4: (10, 100.0)})
    assert together.rate(1) == 10 / 100
    assert together.rate(4) == 10 / 100
    watch = MarketWatch()
    watch.refresh(MarketView(spot_reclaim_rate_per_hour=history.rate(1)), history, None)
    svc = SimpleNamespace(market=watch)
    assert market_view(svc, 1).spot_reclaim_rate_per_hour == 0.25
    assert abs(market_view(svc, 4).spot_reclaim_rate_per_hour - 44 / 48) < 1e-12


def test_the_reclaim_history_counts_the_nodes_of_each_attempt(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from ledger_fakes import World, caller, job_spec, setup_lab

    from broker.jobs.placement import reclaim_history
    from broker.jobs.submit import submit

    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc, vision_budget="1000")
    one = w.submit(time="4h")["slurm_job_id"]
    gang = submit(w.svc, caller("alice"), dict(job_spec(time="4h", partition="spot"), nodes=4))["slurm_job_id"]
    assert w.slurm.start(one, node="spot1")
    assert w.slurm.start(gang, node="spot1,spot2,spot3,spot4")
    w.tick()
    w.advance(1800)
    assert w.slurm.reclaim(gang)
    w.tick()
    w.advance(1800)
    assert w.slurm.reclaim(one)
    w.tick()
    assert w.slurm.start(one, node="spot2")
    w.tick()
    w.advance(7200)
    assert w.slurm.finish(one)
    w.tick()
    with w.svc.tx() as s:
        h = reclaim_history(s, w.clock.now())
    # 1 node: reclaimed after 1 h, then 2 h to completion; 4 nodes: reclaimed after 30 min
    # (its next run has not started, so it adds no hours).
    assert h.by_nodes == {1: (1, 3.0), 4: (1, 0.5)}, h.by_nodes
    assert w.svc.market.history is not None
    assert w.svc.market.history.by_nodes == h.by_nodes  # what the tick handed the policy
