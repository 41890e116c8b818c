"""The price book as plain data: which price is in force when, for a partition and capacity.

Pure (no database): the ledger, admission and the tests build a ``PriceBook``
from rows and ask it questions. Prices are micro-units per GPU-hour; a price
holds from its ``effective_at`` until the next one of the same key. A row with
partition ``*`` covers every partition of that capacity without rows of its own.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

ANY_PARTITION = "*"
CAPACITIES = ("owned", "reserved", "spot", "ondemand")
"""The capacity classes a price row may name (``broker.pools.CLASSES``)."""


@dataclass(frozen=True)
class PriceRow:
    partition: str
    capacity: str
    price_micros: int
    effective_at: datetime


@dataclass(frozen=True)
class PricePeriod:
    """One stretch of constant price: [start, end) (end None = until further notice)."""

    start: datetime
    end: datetime | None
    price_micros: int


@dataclass
class PriceBook:
    rows: list[PriceRow] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._by_key: dict[tuple[str, str], list[PriceRow]] = {}
        for row in sorted(self.rows, key=lambda r: r.effective_at):
            self._by_key.setdefault((row.partition, row.capacity), []).append(row)
        self._starts = {k: [r.effective_at for r in v] for k, v in self._by_key.items()}

    @classmethod
    def of(cls, rows: Iterable[PriceRow]) -> PriceBook:
        return cls(list(rows))

    def key_for(self, partition: str, capacity: str) -> tuple[str, str] | None:
        """The key whose rows price (partition, capacity): its own, else the ``*`` rows."""
        if (partition, capacity) in self._by_key:
            return (partition, capacity)
        if (ANY_PARTITION, capacity) in self._by_key:
            return (ANY_PARTITION, capacity)
        return None

    def price_at(self, partition: str, capacity: str, at: datetime) -> int | None:
        """The price in force at ``at``, or None when the book has none yet."""
        key = self.key_for(partition, capacity)
        if key is None:
            return None
        i = bisect.bisect_right(self._starts[key], at) - 1
        return self._by_key[key][i].price_micros if i >= 0 else None

    def periods(self, partition: str, capacity: str, start: datetime, end: datetime) -> list[PricePeriod] | None:
        """The price periods covering [start, end), cut to it; None if any part has no price."""
        key = self.key_for(partition, capacity)
        if key is None:
            return None
        rows = self._by_key[key]
        i = bisect.bisect_right(self._starts[key], start) - 1
        if i < 0:
            return None
        out: list[PricePeriod] = []
        t = start
        while t < end:
            nxt = rows[i + 1].effective_at if i + 1 < len(rows) else None
            stop = end if nxt is None or nxt > end else nxt
            out.append(PricePeriod(t, stop, rows[i].price_micros))
            t = stop
            i += 1
        if not out:
            out.append(PricePeriod(start, end, rows[i].price_micros))
        return out

    def max_price(self, partition: str, capacity: str, start: datetime, end: datetime) -> int | None:
        """The highest price in force at any moment of [start, end] (for a safe estimate)."""
        periods = self.periods(partition, capacity, start, end)
        if not periods:
            return None
        return max(p.price_micros for p in periods)
