"""Pricing node time: a node's price per node-hour and the one function that prices a stretch of it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from broker.config import NodePartition, Settings
from broker.amount import cost_micros, parse_money
from broker.money.nodecost import stretch_cost, stretch_micros
from broker.money.pricebook import node_hour_price
from broker.money.pricing import PriceBook, PriceRow

T = datetime(2026, 10, 1, 8, 0, tzinfo=UTC)
BOOK = PriceBook.of([PriceRow("spot", "spot", 3_600_000, T - timedelta(days=30)),
                     PriceRow("*", "ondemand", 7_200_000, T - timedelta(days=30))])


def _settings(**kw: Any) -> Settings:
    return Settings(db_url="sqlite://", socket="/nonexistent.sock", **kw)


def test_a_partitions_node_hour_price_comes_before_the_book() -> None:
    plain = _settings()
    own = _settings(node_partitions=(NodePartition("spot", price_per_node_hour="2.45"),))
    assert node_hour_price(plain, BOOK, "spot", "spot", 4, T) == 4 * 3_600_000
    assert node_hour_price(own, BOOK, "spot", "spot", 4, T) == parse_money("2.45")
    assert node_hour_price(plain, BOOK, "a100", "ondemand", 2, T) == 2 * 7_200_000  # the book's "*" row
    assert node_hour_price(plain, BOOK, "spot", "spot", 0, T) == 3_600_000  # a node without GPUs counts as one
    assert node_hour_price(plain, BOOK, "spot", "spot", 4, T - timedelta(days=31)) is None
    assert node_hour_price(plain, PriceBook(), "spot", "spot", 4, T) is None


def test_a_stretch_is_cut_at_semester_boundaries_and_each_piece_rounded_once() -> None:
    price = parse_money("2.45")  # 680.55... micro-units a second: rounding shows
    cut = T + timedelta(seconds=93)
    pieces = stretch_cost(price, T, T + timedelta(seconds=186), cuts=[T - timedelta(days=1), cut])
    assert [(p.start, p.end, p.seconds, p.amount_micros) for p in pieces] == [
        (T, cut, 93, 63_292), (cut, T + timedelta(seconds=186), 93, 63_292)]
    assert stretch_micros(price, T, T + timedelta(seconds=186), [cut]) == 126_584 != cost_micros(price, 186)
    assert stretch_micros(price, T, T + timedelta(seconds=186)) == cost_micros(price, 186)
    assert stretch_cost(price, T, T) == [] and stretch_cost(price, T, T - timedelta(seconds=1)) == []
