"""The price book in the database, and what a node costs per node-hour.

``load`` is the one place that reads the ``prices`` table into a
``PriceBook`` (``broker.money.pricing``): admission, the ledger, reports,
the market view and node sessions all ask it. With the settings, it adds the
pool catalog's own prices: a pool whose (partition, class) has no row in the
table (and no ``*`` row of its class) is priced at its configured
``price_per_gpu_hour`` from the epoch on, so owned and reserved pools cost
their internal rate ("0" unless set) and a spot or on-demand pool may carry
its price in the settings. A pool with neither stays unpriced (the ledger's
``MissingPrice``). ``pool_prices`` is what each pool costs now, for the
per-pool market views; ``market_prices`` the two figures of the
spot/on-demand view. ``node_hour_price`` is the one
rule for a node's price: ``[nodes.<partition>] price_per_node_hour`` when the
settings give one, else the book's GPU-hour price for (partition, capacity)
times the node's GPUs.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.config import Settings
from broker.db.ledger_models import Price
from broker.amount import parse_money
from broker.money.pricing import PriceBook, PriceRow


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
"""From when a pool's configured price is in force (it has no date: it always was)."""


def load(s: Session, settings: Settings) -> PriceBook:
    """Every price row, plus each pool's configured price where the table has none."""
    rows = [PriceRow(p, c, m, e) for p, c, m, e in s.execute(_ALL_PRICES).all()]
    return PriceBook.of(rows + configured_rows(PriceBook.of(rows), settings))


_ALL_PRICES = select(Price.partition, Price.capacity, Price.price_micros, Price.effective_at)
"""Built once (read at every admission)."""


def configured_rows(table: PriceBook, settings: Settings) -> list[PriceRow]:
    """The pools' ``price_per_gpu_hour`` as rows from the epoch, for the pools ``table`` has no price for."""
    out = []
    for pool in settings.catalog().pools:
        if pool.price_per_gpu_hour is None or table.key_for(pool.partition, pool.capacity) is not None:
            continue
        out.append(PriceRow(pool.partition, pool.capacity, parse_money(pool.price_per_gpu_hour), EPOCH))
    return out


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
    """Per GPU-hour prices in force now for the policies' market view, where the book has them.

    The spot and on-demand figures are those of the first pool of each class
    (with ``[partitions]``: its two partitions).
    """
    book = load(s, settings)
    out: dict[str, int] = {}
    spot = book.price_at(settings.partition_for("spot"), "spot", now)
    ondemand = book.price_at(settings.partition_for("ondemand"), "ondemand", now)
    if spot is not None:
        out["spot_price_micros"] = spot
    if ondemand is not None:
        out["ondemand_price_micros"] = ondemand
    return out


def pool_prices(s: Session, settings: Settings, now: datetime) -> dict[str, int]:
    """Micro-units per GPU-hour in force now, by pool name, for the pools the book prices."""
    book = load(s, settings)
    out: dict[str, int] = {}
    for pool in settings.catalog().pools:
        price = book.price_at(pool.partition, pool.capacity, now)
        if price is not None:
            out[pool.name] = price
    return out
