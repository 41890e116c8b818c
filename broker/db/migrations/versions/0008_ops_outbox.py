"""The notification outbox and the notify tick's event cursor.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02

``outbox``: one row per notification and target, delivered with retries and
backoff by the notify tick (docs/OPERATIONS.md). ``notify_cursor``: the last
event the tick has turned into messages; it starts at the newest event of an
existing database, so an upgrade does not announce the past.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dedupe_key", sa.String(length=160), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("event_id", sa.BigInteger(), nullable=True),
        sa.Column("target", sa.String(length=64), nullable=False),
        sa.Column("target_json", sa.Text(), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("next_at", TZ, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("delivered_at", TZ, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_outbox")),
        sa.UniqueConstraint("dedupe_key", name=op.f("uq_outbox_dedupe_key")),
    )
    op.create_index("ix_outbox_status_next_at", "outbox", ["status", "next_at"])
    op.create_table(
        "notify_cursor",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("last_event_id", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_notify_cursor")),
    )
    op.execute("INSERT INTO notify_cursor (name, last_event_id) SELECT 'events', COALESCE(MAX(id), 0) FROM events")


def downgrade() -> None:
    op.drop_table("notify_cursor")
    op.drop_index("ix_outbox_status_next_at", table_name="outbox")
    op.drop_table("outbox")
