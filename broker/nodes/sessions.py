"""Node billing in the database: open and close sessions, cut them into busy/idle.

Every change writes an event (kind ``node_*``, job_id NULL) carrying the exact
times, so the totals here can be checked against the event log. Times are
whole seconds (``whole``), so busy + idle of a session equals its length.
A session's price per node-hour is fixed when it opens
(``broker.money.pricebook.node_hour_price``); what its time costs, when it
closes and in ``gbroker node report``, is ``broker.money.nodecost``, the same
function the ledger charges idle time with.
Callers hold a transaction (``svc.tx()``); nothing here talks to Slurm or a cloud.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.config import Settings
from broker.db.models import Event
from broker.db.node_models import (
    SOURCE_OBSERVED,
    USAGE_IDLE,
    NodeSession,
    NodeUsage,
)
from broker.money import pricebook
from broker.money.nodecost import session_totals

log = logging.getLogger(__name__)

NODE_EVENT_PREFIX = "node_"


def whole(t: datetime) -> datetime:
    """Node times are whole seconds: sums of stretches then add up exactly."""
    return t.replace(microsecond=0)


def add_event(s: Session, kind: str, when: datetime, message: str, **data: Any) -> None:
    """One node event; ``data["at"]`` carries the exact time (ISO) for anyone re-deriving totals."""
    assert kind.startswith(NODE_EVENT_PREFIX) and len(kind) <= 32, kind
    data.setdefault("at", when.isoformat())
    s.add(Event(job_id=None, at=when, kind=kind, message=message,
                data_json=json.dumps(data, sort_keys=True, default=str)))


def event_with_key(s: Session, kind: str, key: str) -> bool:
    """Whether a node event of ``kind`` recorded ``key`` (journal lines applied once)."""
    return s.execute(
        select(Event.id).where(Event.kind == kind, Event.data_json.contains(json.dumps(key)))
    ).first() is not None


def open_sessions(s: Session) -> dict[str, NodeSession]:
    rows = s.execute(select(NodeSession).where(NodeSession.suspended_at.is_(None))).scalars()
    return {r.node: r for r in rows}


def open_session_of(s: Session, node: str) -> NodeSession | None:
    return s.execute(
        select(NodeSession).where(NodeSession.node == node, NodeSession.suspended_at.is_(None))
    ).scalars().first()


def current_usage(s: Session, sess: NodeSession) -> NodeUsage | None:
    return s.execute(
        select(NodeUsage).where(NodeUsage.session_id == sess.id, NodeUsage.ended_at.is_(None))
    ).scalars().first()


# ----------------------------------------------------------------------------- sessions


def open_session(
    s: Session,
    settings: Settings,
    *,
    node: str,
    partition: str,
    capacity: str,
    gpus: int,
    provider: str,
    source: str,
    key: str,
    at: datetime,
    instance_id: str | None = None,
) -> tuple[NodeSession, bool]:
    """(session, created). A node has at most one open session; a key opens at most one ever."""
    at = whole(at)
    by_key = s.execute(select(NodeSession).where(NodeSession.open_key == key)).scalars().first()
    if by_key is not None:
        return by_key, False
    existing = open_session_of(s, node)
    if existing is not None:
        return existing, False
    price = pricebook.node_hour_price(settings, pricebook.load(s, settings), partition, capacity, gpus, at)
    sess = NodeSession(
        node=node, partition=partition, capacity=capacity, provider=provider, instance_id=instance_id,
        gpus=gpus, price_micros=price or 0, price_known=int(price is not None), source=source, open_key=key,
        close_key=None, resumed_at=at, suspended_at=None, end_reason="", busy_s=0, idle_s=0, cost_micros=0,
        idle_cost_micros=0, users="", interrupted_at=None,
    )  # fmt: skip
    s.add(sess)
    s.flush()
    s.add(NodeUsage(session_id=sess.id, state=USAGE_IDLE, started_at=at, ended_at=None))
    add_event(
        s, "node_resume", at, f"{node} resumed ({source}{', ' + provider if provider else ''})",
        node=node, partition=partition, capacity=capacity, session=sess.id, source=source, provider=provider,
        instance_id=instance_id, price_micros=sess.price_micros,
    )  # fmt: skip
    return sess, True


def backdate(s: Session, sess: NodeSession, at: datetime, source: str) -> None:
    """An exact resume time (from the journal) replaces the tick's observed one."""
    at = whole(at)
    if sess.source != SOURCE_OBSERVED or at >= sess.resumed_at:
        return
    first = s.execute(
        select(NodeUsage).where(NodeUsage.session_id == sess.id).order_by(NodeUsage.started_at, NodeUsage.id)
    ).scalars().first()
    if first is not None:
        first.started_at = at
    add_event(s, "node_backdated", at, f"{sess.node}: resume time from the journal",
              node=sess.node, session=sess.id, was=sess.resumed_at.isoformat())
    sess.resumed_at = at
    sess.source = source


def claim(s: Session, sess: NodeSession, *, source: str, provider: str, at: datetime) -> bool:
    """A resume hook (or its journal line) for a power-up a tick had already seen
    (an ``observed`` session, the only kind without a provider): from now on the
    session is the hook's and its provider's, as if the hook had opened it.
    False when the session already has a provider (nothing to take over)."""
    if sess.provider or not provider:
        return False
    add_event(s, "node_resume_claimed", whole(at), f"{sess.node}: the resume hook took over the observed power-up",
              node=sess.node, session=sess.id, source=source, provider=provider)
    sess.source = source
    sess.provider = provider
    return True


def set_usage(s: Session, sess: NodeSession, state: str, at: datetime) -> bool:
    """Move the session into a busy or idle stretch at ``at``; False when it already is."""
    at = whole(at)
    cur = current_usage(s, sess)
    if cur is not None and cur.state == state:
        return False
    if cur is not None:
        cur.ended_at = max(at, cur.started_at)
        at = cur.ended_at
    s.add(NodeUsage(session_id=sess.id, state=state, started_at=at, ended_at=None))
    add_event(s, f"node_{state}", at, f"{sess.node} {state}", node=sess.node, partition=sess.partition,
              session=sess.id)
    return True


def add_users(sess: NodeSession, users: set[str]) -> None:
    have = {u for u in sess.users.split(",") if u}
    if users - have:
        sess.users = ",".join(sorted(have | users))


def close_session(s: Session, sess: NodeSession, at: datetime, reason: str, key: str | None = None) -> None:
    """End the billed stretch at ``at`` and total it up (busy, idle, cost)."""
    if sess.suspended_at is not None:
        return
    at = max(whole(at), sess.resumed_at)
    cur = current_usage(s, sess)
    if cur is not None:
        cur.ended_at = max(at, cur.started_at)
        at = cur.ended_at
    s.flush()
    totals = session_totals(s, sess)
    busy, idle = totals.busy_s, totals.idle_s
    sess.suspended_at = at
    sess.close_key = key
    sess.end_reason = reason
    sess.busy_s, sess.idle_s = busy, idle
    sess.cost_micros, sess.idle_cost_micros = totals.cost_micros, totals.idle_cost_micros
    add_event(
        s, "node_suspend", at, f"{sess.node} suspended: {reason}", node=sess.node, partition=sess.partition,
        session=sess.id, reason=reason, busy_s=busy, idle_s=idle, cost_micros=sess.cost_micros,
        idle_cost_micros=sess.idle_cost_micros,
    )  # fmt: skip


def session_by_close_key(s: Session, key: str) -> NodeSession | None:
    return s.execute(select(NodeSession).where(NodeSession.close_key == key)).scalars().first()
