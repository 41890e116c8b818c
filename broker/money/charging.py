"""Ledger math: one Slurm run -> money lines. Pure, so it is tested to the micro-unit.

A run of ``gpus`` GPUs that started at ``start`` and ran ``elapsed_s`` seconds
(sacct's ElapsedRaw, the truth) is cut wherever something that changes the
money changes: a price period boundary (of its own partition, and of the
on-demand price used for "saved"), a semester boundary, and the moment its
lost work began (a reclaimed run loses the work since its last checkpoint:
the last ``lost_s`` seconds). Each piece is one line:

    amount = gpus x seconds x price in force / 3600   (rounded once, half-even, per line)

Node time has its own rules, by the pool's billing (``broker.pools.Billing``):
a power-up is billed in whole increments with a minimum, so a node up 61
minutes on an hourly pool costs 7,200 s. ``rounding_s`` is the part billed
beyond the real length (the ledger's ``rounding`` line); ``stopped_micros``
prices the time a stopped node keeps billing (its ``stopped`` line).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from broker.db.ledger_models import TAG_LOST, TAG_USEFUL
from broker.errors import BrokerError
from broker.amount import cost_micros, parse_money
from broker.money.pricing import PriceBook
from broker.pools.catalog import Billing


class MissingPrice(BrokerError):
    """The price book has no price for some part of a run; it stays uncharged until one is added."""


@dataclass(frozen=True)
class Run:
    """The facts of one Slurm run that the charge is computed from."""

    slurm_job_id: int
    run_index: int
    start: datetime
    elapsed_s: int
    gpus: int
    partition: str
    capacity: str
    lost_s: int = 0

    @property
    def end(self) -> datetime:
        return self.start + timedelta(seconds=self.elapsed_s)


@dataclass(frozen=True)
class Line:
    period_start: datetime
    period_end: datetime
    seconds: int
    gpus: int
    price_micros: int
    amount_micros: int
    ondemand_micros: int
    tag: str

    def key(self, slurm_job_id: int, run_index: int) -> str:
        return f"run:{slurm_job_id}:{run_index}:{int(self.period_start.timestamp())}"


def split_run(
    run: Run,
    book: PriceBook,
    *,
    cuts: Sequence[datetime] = (),
    ondemand: tuple[str, str] | None = None,
) -> list[Line]:
    """The lines of ``run``. ``cuts``: extra boundaries (semester starts/ends).

    ``ondemand``: the (partition, capacity) whose price prices the "all on-demand"
    comparison; lines without one compare against their own price (nothing saved).
    Raises MissingPrice when any second of the run has no price.
    """
    if run.elapsed_s <= 0 or run.gpus <= 0:
        return []
    start, end = run.start, run.end
    periods = book.periods(run.partition, run.capacity, start, end)
    if periods is None:
        raise MissingPrice(
            f"no price for partition {run.partition} ({run.capacity}) at {start:%Y-%m-%d %H:%M:%S} UTC",
            hint=f"add one: gbroker price set {run.partition} --capacity {run.capacity} --price ... --from ...",
        )
    points = {start, end}
    points.update(p.start for p in periods)
    if ondemand is not None:
        od = book.periods(ondemand[0], ondemand[1], start, end)
        if od:
            points.update(p.start for p in od)
    points.update(c for c in cuts if start < c < end)
    lost_s = min(max(run.lost_s, 0), run.elapsed_s)
    lost_from = end - timedelta(seconds=lost_s)
    if lost_s:
        points.add(lost_from)
    edges = sorted(p for p in points if start <= p <= end)
    lines: list[Line] = []
    for a, b in itertools.pairwise(edges):
        seconds = int((b - a).total_seconds())
        if seconds <= 0:
            continue
        price = book.price_at(run.partition, run.capacity, a)
        assert price is not None  # periods() covered [start, end)
        od_price = book.price_at(*ondemand, a) if ondemand is not None else None
        if od_price is None:
            od_price = price
        lines.append(
            Line(
                period_start=a,
                period_end=b,
                seconds=seconds,
                gpus=run.gpus,
                price_micros=price,
                amount_micros=cost_micros(price, seconds, run.gpus),
                ondemand_micros=cost_micros(od_price, seconds, run.gpus),
                tag=TAG_LOST if a >= lost_from and lost_s else TAG_USEFUL,
            )
        )
    return lines


def estimate_micros(gpus: int, seconds: int, price_micros: int) -> int:
    """The most a run of ``gpus`` x ``seconds`` can cost at ``price_micros`` per GPU-hour."""
    return cost_micros(price_micros, seconds, gpus)


def billable_limit_s(time_limit_s: int) -> int:
    """Slurm limits are whole minutes, rounded up: a job may run that long, so estimate that."""
    return max(60, -(-time_limit_s // 60) * 60)


def billed_node_s(billing: Billing, up_s: int) -> int:
    """Seconds a pool bills for a node up ``up_s`` seconds: whole increments, at least the minimum.

    Hourly (3600/3600): 61 min -> 7,200 s. Per second: exactly ``up_s``. Per
    minute with a 60 s minimum: 10 s -> 60 s, 61 s -> 120 s. 0 s -> 0.
    """
    return billing.billed_s(up_s)


def rounding_s(billing: Billing, up_s: int) -> int:
    """The billed seconds beyond the power-up's real length (0 on a per-second pool)."""
    return billed_node_s(billing, up_s) - max(up_s, 0)


def stopped_price_micros(billing: Billing) -> int | None:
    """Micro-units per node-hour a stopped node keeps costing; None when the pool's provider bills nothing."""
    if not billing.stopped_price_per_hour:
        return None
    return parse_money(billing.stopped_price_per_hour)


def stopped_micros(billing: Billing, stopped_s: int) -> int:
    """What ``stopped_s`` seconds of a stopped node cost (rounded once, half-even); 0 without a stopped price."""
    price = stopped_price_micros(billing)
    if price is None or stopped_s <= 0:
        return 0
    return cost_micros(price, stopped_s)
