"""The notification tables: the outbox (one row per message and target) and the event cursor.

The notify tick turns new rows of the append-only event log into outbox rows
(same transaction as the cursor move, so none is lost or made twice) and
delivers them with retries; a row is never deleted, only marked delivered or
dead. See ``broker/ops/notify.py`` and docs/OPERATIONS.md.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from broker.db.base import NAME_LEN, Base

OUTBOX_PENDING = "pending"
OUTBOX_DELIVERED = "delivered"
OUTBOX_DEAD = "dead"


class OutboxMessage(Base):
    """One notification for one target, until it is delivered (or given up after ``max_tries``)."""

    __tablename__ = "outbox"
    __table_args__ = (Index("ix_outbox_status_next_at", "status", "next_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    dedupe_key: Mapped[str] = mapped_column(String(160), unique=True)
    """"<event id>:<target>" (or "deadline:<job id>:<target>"): a message is made once."""
    event: Mapped[str] = mapped_column(String(32))
    """``broker.opsconfig.EVENTS`` name."""
    event_id: Mapped[int | None] = mapped_column(BigInteger)
    target: Mapped[str] = mapped_column(String(NAME_LEN))
    target_json: Mapped[str] = mapped_column(Text)
    """{"name": ...} for a settings target (its secret stays in the settings), or a budget's own hook."""
    payload_json: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default=OUTBOX_PENDING)
    """pending, delivered or dead (a message's delivery status; not a job state)."""
    tries: Mapped[int] = mapped_column(Integer, default=0)
    next_at: Mapped[datetime]
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]
    last_error: Mapped[str] = mapped_column(Text, default="")


class NotifyCursor(Base):
    """How far the notify tick has read the event log."""

    __tablename__ = "notify_cursor"

    name: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    last_event_id: Mapped[int] = mapped_column(BigInteger)
