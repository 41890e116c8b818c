"""The daemon's view of the spot market, from node samples (our own logic: fake node lists)."""

from datetime import datetime, timedelta, timezone

from broker.service.market import SpotObserver
from broker.slurm.backend import NodeInfo
from broker.states import NodeState

T = datetime(2026, 9, 1, tzinfo=timezone.utc)


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
