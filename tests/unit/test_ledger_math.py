"""Ledger math, exact to the micro-unit: price periods, splits, lost work, rounding."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from broker.amount import parse_money
from broker.money.charging import MissingPrice, Run, billable_limit_s, split_run
from broker.money.pricing import PriceBook, PriceRow

T0 = datetime(2026, 10, 1, 12, 0, tzinfo=UTC)


def book(*rows: tuple[str, str, str, datetime]) -> PriceBook:
    return PriceBook.of(PriceRow(p, c, parse_money(m), t) for p, c, m, t in rows)


SPOT = ("spot", "spot")
OD = ("ondemand", "ondemand")


def test_price_in_force_is_the_latest_not_after_the_moment() -> None:
    b = book(("spot", "spot", "0.918", T0), ("spot", "spot", "1.20", T0 + timedelta(hours=1)),
             ("*", "ondemand", "3.06", T0))
    assert b.price_at("spot", "spot", T0 - timedelta(seconds=1)) is None
    assert b.price_at("spot", "spot", T0) == 918_000
    assert b.price_at("spot", "spot", T0 + timedelta(minutes=59, seconds=59)) == 918_000
    assert b.price_at("spot", "spot", T0 + timedelta(hours=1)) == 1_200_000
    assert b.price_at("gpu-a100", "ondemand", T0) == 3_060_000  # the '*' row
    assert b.price_at("gpu-a100", "spot", T0) is None
    assert b.max_price("spot", "spot", T0, T0 + timedelta(hours=2)) == 1_200_000
    assert b.max_price("spot", "spot", T0, T0 + timedelta(minutes=30)) == 918_000


def test_one_hour_on_four_gpus_is_exact() -> None:
    b = book(("spot", "spot", "0.918", T0))
    lines = split_run(Run(7, 0, T0, 3600, 4, "spot", "spot"), b)
    assert [(ln.seconds, ln.amount_micros, ln.tag) for ln in lines] == [(3600, 3_672_000, "useful")]


def test_price_change_mid_run_is_charged_in_two_parts() -> None:
    change = T0 + timedelta(minutes=10)
    b = book(("spot", "spot", "3.60", T0 - timedelta(days=1)), ("spot", "spot", "7.20", change))
    run = Run(42, 0, T0, 1800, 2, "spot", "spot")  # 10 min before the change, 20 min after
    lines = split_run(run, b)
    assert [(ln.period_start, ln.period_end, ln.seconds, ln.price_micros, ln.amount_micros) for ln in lines] == [
        (T0, change, 600, 3_600_000, 1_200_000),
        (change, T0 + timedelta(minutes=30), 1200, 7_200_000, 4_800_000),
    ]
    assert sum(ln.amount_micros for ln in lines) == 6_000_000
    assert len({ln.key(42, 0) for ln in lines}) == 2


def test_semester_boundary_and_lost_tail_cut_the_run() -> None:
    b = book(("spot", "spot", "3.60", T0 - timedelta(days=1)))
    boundary = T0 + timedelta(seconds=100)
    run = Run(5, 1, T0, 300, 1, "spot", "spot", lost_s=50)
    lines = split_run(run, b, cuts=[boundary, T0 - timedelta(days=30)])
    assert [(ln.seconds, ln.tag) for ln in lines] == [(100, "useful"), (150, "useful"), (50, "lost")]
    assert sum(ln.amount_micros for ln in lines) == 300_000  # $3.60/h = 1000 micro-units a second
    assert lines[-1].period_start == T0 + timedelta(seconds=250)


def test_a_reclaimed_run_without_checkpoint_is_all_lost() -> None:
    b = book(("spot", "spot", "3.60", T0))
    lines = split_run(Run(5, 0, T0, 120, 1, "spot", "spot", lost_s=10_000), b)
    assert [(ln.seconds, ln.tag) for ln in lines] == [(120, "lost")]


def test_saved_against_on_demand_uses_the_on_demand_price_of_the_moment() -> None:
    b = book(("spot", "spot", "1.00", T0), ("ondemand", "ondemand", "3.00", T0),
             ("ondemand", "ondemand", "4.00", T0 + timedelta(seconds=1800)))
    lines = split_run(Run(9, 0, T0, 3600, 1, "spot", "spot"), b, ondemand=OD)
    assert [ln.ondemand_micros for ln in lines] == [1_500_000, 2_000_000]
    assert sum(ln.amount_micros for ln in lines) == 1_000_000


def test_no_price_means_no_charge_yet() -> None:
    b = book(("spot", "spot", "1.00", T0 + timedelta(hours=1)))
    with pytest.raises(MissingPrice, match="no price for partition spot"):
        split_run(Run(1, 0, T0, 60, 1, "spot", "spot"), b)
    with pytest.raises(MissingPrice):
        split_run(Run(1, 0, T0, 60, 1, "ondemand", "ondemand"), b)


def test_zero_time_or_zero_gpus_costs_nothing() -> None:
    b = book(("spot", "spot", "1.00", T0))
    assert split_run(Run(1, 0, T0, 0, 1, "spot", "spot"), b) == []
    assert split_run(Run(1, 0, T0, 60, 0, "spot", "spot"), b) == []


def test_rounding_is_once_per_line_half_even() -> None:
    # 0.000001 per GPU-hour for 1800 s is half a micro-unit: half-even rounds to 0; 5400 s -> 1.5 -> 2.
    b = book(("spot", "spot", "0.000001", T0))
    assert split_run(Run(1, 0, T0, 1800, 1, "spot", "spot"), b)[0].amount_micros == 0
    assert split_run(Run(1, 0, T0, 5400, 1, "spot", "spot"), b)[0].amount_micros == 2


def test_estimates_use_slurm_whole_minutes() -> None:
    assert billable_limit_s(1) == 60
    assert billable_limit_s(60) == 60
    assert billable_limit_s(61) == 120
    assert billable_limit_s(3600) == 3600
