"""The price book in the database, and what a node costs per node-hour.

``load`` is the one place that reads the ``prices`` table into a
``PriceBook`` (``broker.money.pricing``): admission, the ledger, reports,
the market view and node sessions all ask it. ``node_hour_price`` is the one
rule for a node's price: ``[nodes.<partition>] price_per_node_hour`` when the
settings give one, else the book's GPU-hour price for (partition, capacity)
times the node's GPUs.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.config import Settings
from broker.db.ledger_models import Price
from broker.amount import parse_money
from broker.money.pricing import PriceBook, PriceRow


def load(s: Session) -> PriceBook:
    """Every price row, as a PriceBook."""
    rows = s.execute(select(Price.partition, Price.capacity, Price.price_micros, Price.effective_at)).all()
    return PriceBook.of(PriceRow(p, c, m, e) for p, c, m, e in rows)


def node_hour_price(
    settings: Settings, book: PriceBook, partition: str, capacity: str, gpus: int, at: datetime
) -> int | None:
    """Micro-units per node-hour for a node of ``partition`` at ``at``.

    The partition's ``price_per_node_hour`` override comes first; else the
    book's GPU-hour price for (partition, capacity) in force at ``at`` times
    the node's GPUs (a node reporting none counts as one). None when neither
    gives a price.
    """
    rule = settings.managed_node_partitions().get(partition)
    if rule is not None and rule.price_per_node_hour is not None:
        return parse_money(rule.price_per_node_hour)
    per_gpu = book.price_at(partition, capacity, at)
    return None if per_gpu is None else per_gpu * max(gpus, 1)


def market_prices(s: Session, settings: Settings, now: datetime) -> dict[str, int]:
    """Per GPU-hour prices in force now for the policies' market view, where the book has them."""
    book = load(s)
    out: dict[str, int] = {}
    spot = book.price_at(settings.spot_partition, "spot", now)
    ondemand = book.price_at(settings.ondemand_partition, "ondemand", now)
    if spot is not None:
        out["spot_price_micros"] = spot
    if ondemand is not None:
        out["ondemand_price_micros"] = ondemand
    return out
