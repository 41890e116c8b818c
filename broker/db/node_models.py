"""Node billing: one row per power-up of a node (resume to suspend), split into busy and idle stretches.

A rented node bills from the moment it is resumed until it is suspended,
whether a job runs on it or not. ``NodeSession`` is that billed stretch;
``NodeUsage`` cuts it into busy and idle pieces as the node manager sees
them, so idle node time (and its cost) can be reported for any window.
Times are whole UTC seconds, so the pieces of a session add up exactly.
What happened and why is in the ``events`` table (kinds ``node_*``).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from broker.db.base import NAME_LEN, Base

KEY_LEN = 64

USAGE_BUSY = "busy"
USAGE_IDLE = "idle"

SOURCE_HOOK = "hook"
"""Opened by Slurm's ResumeProgram through the daemon: exact times."""
SOURCE_JOURNAL = "journal"
"""Opened by the hook while the daemon was down; ingested later, exact times."""
SOURCE_OBSERVED = "observed"
"""Opened because the node tick saw the node up without a session (hooks not wired
to gbroker, or a node powered up behind its back): times are at tick resolution."""


class NodeSession(Base):
    """One billed power-up of one node: resumed_at .. suspended_at (None while it runs)."""

    __tablename__ = "node_sessions"
    __table_args__ = (Index("ix_node_sessions_node_suspended_at", "node", "suspended_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(NAME_LEN))
    partition: Mapped[str] = mapped_column(String(NAME_LEN), index=True)
    capacity: Mapped[str] = mapped_column(String(16))
    provider: Mapped[str] = mapped_column(String(32), default="")
    """Provider that made the instance exist; '' when gbroker did not resume it."""
    instance_id: Mapped[str | None] = mapped_column(String(128))
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    price_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    """Per node-hour, fixed at resume."""
    price_known: Mapped[int] = mapped_column(Integer, default=1)
    """0 when no price was configured or in the price book (the cost then reads 0)."""
    source: Mapped[str] = mapped_column(String(16))
    open_key: Mapped[str] = mapped_column(String(KEY_LEN), unique=True)
    """Idempotency key of the resume that opened it (a replayed journal line finds it)."""
    close_key: Mapped[str | None] = mapped_column(String(KEY_LEN), unique=True)
    resumed_at: Mapped[datetime] = mapped_column(index=True)
    suspended_at: Mapped[datetime | None]
    end_reason: Mapped[str] = mapped_column(Text, default="")
    busy_s: Mapped[int] = mapped_column(Integer, default=0)
    idle_s: Mapped[int] = mapped_column(Integer, default=0)
    cost_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    idle_cost_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    users: Mapped[str] = mapped_column(Text, default="")
    """Comma-separated users whose jobs ran on the node during the session."""
    interrupted_at: Mapped[datetime | None]
    """When a spot interruption of this power-up was handled (once per session)."""

    def __repr__(self) -> str:
        return f"<NodeSession {self.id} {self.node} {self.resumed_at}..{self.suspended_at}>"


class NodeUsage(Base):
    """A busy or idle stretch inside a session; ended_at None while it lasts."""

    __tablename__ = "node_usage"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[int] = mapped_column(ForeignKey("node_sessions.id"), index=True)
    state: Mapped[str] = mapped_column(String(8))
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None]
