"""Node release by billing, at hour scale with a fake clock: plan_release is pure, so the clock is a loop.

A node bills from its power-up; on an hourly pool the hour is paid once it
starts, so an idle node is kept until just before the hour ends and released
then (two node ticks, at least 30 s, at most 10 % of the increment, before).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.nodes.policy import (
    NodeView,
    PartitionRule,
    Power,
    keeps_paid_time,
    paid_left_s,
    plan_release,
    release_margin_s,
)
from broker.pools.catalog import BILLING, Billing

T0 = datetime(2026, 10, 1, 8, 0, tzinfo=UTC)
HOUR = Billing(*BILLING["hour"])
TICK = 30.0


def rule(billing: Billing = HOUR, **kw: object) -> dict[str, PartitionRule]:
    return {"spot": PartitionRule("spot", idle_s=300, billing=billing, tick_s=TICK, **kw)}  # type: ignore[arg-type]


def node(now: datetime, work_until: datetime, up_since: datetime | None = T0) -> NodeView:
    busy = now < work_until
    return NodeView("s1", ("spot",), Power.ON, busy=busy, gpus=4, idle_since=None if busy else work_until,
                    up_since=up_since)


def first_release(rules: dict[str, PartitionRule], work_s: int, up_since: datetime | None = T0,
                  until_s: int = 3 * 3600) -> tuple[float | None, dict[float, str]]:
    """Tick every 30 s from the power-up: when is the node first released, and why was it kept before."""
    kept: dict[float, str] = {}
    t = 0.0
    while t <= until_s:
        now = T0 + timedelta(seconds=t)
        plan = plan_release([node(now, T0 + timedelta(seconds=work_s), up_since)], [], rules, now)
        if plan.release == ["s1"]:
            return t, kept
        kept[t] = plan.kept.get("s1", "")
        t += TICK
    return None, kept


def test_ten_minutes_of_work_then_idle_on_an_hourly_pool_is_kept_until_59_minutes() -> None:
    released, kept = first_release(rule(), work_s=600)
    assert released is not None and 59 * 60 <= released < 60 * 60, released
    assert released == 3600 - release_margin_s(3600, TICK) == 59 * 60
    # Idle past its idle time (300 s from 10 min on) but kept for the paid hour, saying so.
    assert "paid for" in kept[16 * 60] and "released 60s before" in kept[16 * 60]
    assert "paid for 90s more" in kept[58 * 60 + 30]
    assert kept[12 * 60] == "idle 120s of 300s"


def test_the_same_node_on_a_per_second_pool_goes_after_its_idle_time() -> None:
    released, _ = first_release(rule(Billing()), work_s=600)
    assert released == 600 + 300


def test_a_node_that_passed_the_hour_busy_is_kept_to_the_end_of_its_second_hour() -> None:
    released, kept = first_release(rule(), work_s=65 * 60)
    assert released == 2 * 3600 - 60
    assert "paid for" in kept[71 * 60]


def test_a_pool_that_does_not_power_down_is_never_released() -> None:
    released, kept = first_release(rule(power_down=False), work_s=600, until_s=10 * 3600)
    assert released is None
    assert "power_down = false" in kept[5 * 3600]


def test_a_node_whose_power_up_start_is_unknown_goes_after_its_idle_time() -> None:
    released, _ = first_release(rule(), work_s=600, up_since=None)
    assert released == 900


def test_warm_minimum_still_holds_on_an_hourly_pool() -> None:
    released, kept = first_release(rule(warm_min=1), work_s=600)
    assert released is None and "warm minimum" in kept[59 * 60]


@pytest.mark.parametrize(("increment", "tick", "margin", "keeps"), [
    (3600, 30, 60, True),    # two ticks
    (3600, 10, 30, True),    # at least 30 s
    (180, 2, 18, True),      # never more than 10 % of the increment
    (60, 30, 6, False),      # per minute with 30 s ticks: a tick could miss the window
    (60, 2, 6, True),
    (1, 2, 0.1, False),      # per second: released after its idle time
])
def test_release_margin(increment: int, tick: float, margin: float, keeps: bool) -> None:
    assert release_margin_s(increment, tick) == pytest.approx(margin)
    assert keeps_paid_time(PartitionRule("p", 10, billing=Billing(increment, 0), tick_s=tick)) is keeps


def test_paid_time_left_at_the_edges_of_an_increment() -> None:
    assert paid_left_s(HOUR, 0) == 3600
    assert paid_left_s(HOUR, 3599.5) == pytest.approx(0.5)
    assert paid_left_s(HOUR, 3600) == 0  # the hour is over, the next not started
    assert paid_left_s(HOUR, 3600.2) == pytest.approx(3599.8)  # the next hour is paid already
    assert paid_left_s(Billing(60, 600), 30) == 570  # the minimum first
