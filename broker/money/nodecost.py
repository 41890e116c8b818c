"""Node time in money: what a stretch of a powered-up node costs, priced once.

A node is billed from resume to suspend at its price per node-hour, fixed when
it resumed (``pricebook.node_hour_price``: the partition's
``price_per_node_hour``, else the price book's GPU-hour price times its GPUs).
``stretch_cost`` is the one function that turns a stretch of that time into
money: the stretch is cut at semester boundaries (so each ledger line belongs
to one semester) and each piece costs ``cost_micros(price, seconds)``, rounded
once, half-even.

Everything that prices node time adds these pieces:

* the ledger's idle lines (``broker.money.ledger.charge_idle_time``), which
  ``gbroker report`` sums;
* a session's totals when it closes (``session_totals``);
* ``gbroker node report`` (``node_cost``).

So the idle cost of the same node time is the same, to the micro-unit, in
both reports. Reads the node tables (``broker.db.node_models``); the session
bookkeeping itself (open, close, busy/idle stretches) is ``broker.nodes.sessions``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from broker.config import Settings
from broker.db import store
from broker.db.node_models import USAGE_BUSY, NodeSession, NodeUsage
from broker.amount import cost_micros, format_money
from broker.money.budgets import semester_cuts
from broker.money.pricebook import node_hour_price
from broker.money.pricing import PriceBook


@dataclass(frozen=True)
class Piece:
    """Part of a stretch inside one semester: [start, end), its seconds and its cost."""

    start: datetime
    end: datetime
    seconds: int
    amount_micros: int


def stretch_cost(price_micros: int, start: datetime, end: datetime, cuts: Sequence[datetime] = ()) -> list[Piece]:
    """The pieces of node time [start, end) at ``price_micros`` per node-hour.

    ``cuts``: boundaries inside the stretch where it is cut (semester starts
    and ends); each piece is rounded once. Empty when the stretch is empty.
    """
    if end <= start:
        return []
    edges = sorted({start, end, *(c for c in cuts if start < c < end)})
    pieces = []
    for a, b in itertools.pairwise(edges):
        seconds = int((b - a).total_seconds())
        if seconds > 0:
            pieces.append(Piece(a, b, seconds, cost_micros(price_micros, seconds)))
    return pieces


def stretch_micros(price_micros: int, start: datetime, end: datetime, cuts: Sequence[datetime] = ()) -> int:
    """What [start, end) costs at ``price_micros`` per node-hour: the sum of its pieces."""
    return sum(p.amount_micros for p in stretch_cost(price_micros, start, end, cuts))


# ----------------------------------------------------------------------------- sessions


@dataclass(frozen=True)
class SessionTotals:
    busy_s: int
    idle_s: int
    cost_micros: int
    idle_cost_micros: int


def session_totals(s: Session, sess: NodeSession, cuts: Sequence[datetime] | None = None) -> SessionTotals:
    """Busy and idle seconds of a session's ended stretches, and what they cost.

    A session without a price costs nothing (its seconds still count).
    """
    if cuts is None:
        cuts = semester_cuts(s)
    busy = idle = cost = idle_cost = 0
    for u in s.execute(select(NodeUsage).where(NodeUsage.session_id == sess.id)).scalars():
        if u.ended_at is None:
            continue
        secs = int((u.ended_at - u.started_at).total_seconds())
        money = stretch_micros(sess.price_micros, u.started_at, u.ended_at, cuts) if sess.price_known else 0
        cost += money
        if u.state == USAGE_BUSY:
            busy += secs
        else:
            idle += secs
            idle_cost += money
    return SessionTotals(busy, idle, cost, idle_cost)


def session_price(s: Session, settings: Settings, book: PriceBook, sess: NodeSession, now: datetime) -> int | None:
    """The session's price per node-hour; None while it has none.

    A node that resumed before any price applied to it (no override, nothing in
    the book yet) gets, once the book has one, the price that was in force when
    it resumed: it is fixed on the session (totals of a closed session are
    redone, a ``node_priced`` event says so), so both reports count it from then on.
    """
    if sess.price_known:
        return sess.price_micros
    price = node_hour_price(settings, book, sess.partition, sess.capacity, sess.gpus, sess.resumed_at)
    if price is None:
        return None
    sess.price_micros, sess.price_known = price, 1
    if sess.suspended_at is not None:
        totals = session_totals(s, sess)
        sess.cost_micros, sess.idle_cost_micros = totals.cost_micros, totals.idle_cost_micros
    store.add_event(
        s, "node_priced", f"{sess.node}: priced at {format_money(price)} per node-hour from its resume",
        now=now, data={"at": now.isoformat(), "node": sess.node, "partition": sess.partition, "session": sess.id,
                       "price_micros": price, "cost_micros": sess.cost_micros,
                       "idle_cost_micros": sess.idle_cost_micros},
    )  # fmt: skip
    return price


# ----------------------------------------------------------------------------- report


@dataclass
class PartitionNodeCost:
    """Billed node time of one partition in a window, split into busy and idle."""

    partition: str
    sessions: int = 0
    node_s: int = 0
    busy_s: int = 0
    idle_s: int = 0
    cost_micros: int = 0
    idle_cost_micros: int = 0
    unpriced_s: int = 0
    """Seconds of nodes without a price (counted in the hours, not in the cost)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition, "sessions": self.sessions, "node_s": self.node_s, "busy_s": self.busy_s,
            "idle_s": self.idle_s, "cost_micros": self.cost_micros, "idle_cost_micros": self.idle_cost_micros,
            "busy_cost_micros": self.cost_micros - self.idle_cost_micros, "unpriced_s": self.unpriced_s,
        }  # fmt: skip


def sessions_in(s: Session, start: datetime | None, end: datetime) -> dict[int, NodeSession]:
    """The node sessions that overlap [start, end) (from the first, when ``start`` is None), by id."""
    q = select(NodeSession).where(NodeSession.resumed_at < end)
    if start is not None:
        q = q.where(or_(NodeSession.suspended_at.is_(None), NodeSession.suspended_at > start))
    return {x.id: x for x in s.execute(q).scalars()}


def stretches_in(
    s: Session, sessions: dict[int, NodeSession], start: datetime | None, end: datetime,
) -> Iterator[tuple[NodeSession, NodeUsage, datetime, datetime]]:
    """Each busy or idle stretch of ``sessions``, cut to [start, end): (session, stretch, from, to).

    Open stretches run to ``end``; a stretch with nothing left inside the window is left out.
    """
    if not sessions:
        return
    for u in s.execute(select(NodeUsage).where(NodeUsage.session_id.in_(list(sessions)))).scalars():
        a = u.started_at if start is None else max(u.started_at, start)
        b = min(u.ended_at or end, end)
        if b > a:
            yield sessions[u.session_id], u, a, b


def node_cost(s: Session, start: datetime | None, end: datetime) -> list[PartitionNodeCost]:
    """Per partition: node seconds in [start, end), busy and idle, and their cost.

    Open sessions count up to ``end``. Each stretch, cut to the window, costs
    ``stretch_cost`` at its session's price, exactly as the ledger charges it.
    Only reads, inside the caller's session.
    """
    sessions = sessions_in(s, start, end)
    if not sessions:
        return []
    cuts = semester_cuts(s)
    out: dict[str, PartitionNodeCost] = {}
    counted: set[int] = set()
    for sess, u, a, b in stretches_in(s, sessions, start, end):
        secs = int((b - a).total_seconds())
        if secs <= 0:
            continue
        row = out.setdefault(sess.partition, PartitionNodeCost(sess.partition))
        if sess.id not in counted:
            counted.add(sess.id)
            row.sessions += 1
        row.node_s += secs
        busy = u.state == USAGE_BUSY
        if busy:
            row.busy_s += secs
        else:
            row.idle_s += secs
        if not sess.price_known:
            row.unpriced_s += secs
            continue
        money = stretch_micros(sess.price_micros, a, b, cuts)
        row.cost_micros += money
        if not busy:
            row.idle_cost_micros += money
    return [out[k] for k in sorted(out)]
