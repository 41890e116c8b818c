"""Node billing: node_sessions (resume to suspend) and node_usage (busy/idle stretches).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

Node events go to the existing events table (kinds ``node_*``, job_id NULL).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "node_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("partition", sa.String(length=64), nullable=False),
        sa.Column("capacity", sa.String(length=16), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        sa.Column("instance_id", sa.String(length=128), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("price_micros", sa.BigInteger(), nullable=False),
        sa.Column("price_known", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("open_key", sa.String(length=64), nullable=False),
        sa.Column("close_key", sa.String(length=64), nullable=True),
        sa.Column("resumed_at", TZ, nullable=False),
        sa.Column("suspended_at", TZ, nullable=True),
        sa.Column("end_reason", sa.Text(), nullable=False),
        sa.Column("busy_s", sa.Integer(), nullable=False),
        sa.Column("idle_s", sa.Integer(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("idle_cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("users", sa.Text(), nullable=False),
        sa.Column("interrupted_at", TZ, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_sessions")),
        sa.UniqueConstraint("open_key", name=op.f("uq_node_sessions_open_key")),
        sa.UniqueConstraint("close_key", name=op.f("uq_node_sessions_close_key")),
    )
    op.create_index("ix_node_sessions_node_suspended_at", "node_sessions", ["node", "suspended_at"])
    op.create_index(op.f("ix_node_sessions_partition"), "node_sessions", ["partition"])
    op.create_index(op.f("ix_node_sessions_resumed_at"), "node_sessions", ["resumed_at"])
    op.create_table(
        "node_usage",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("session_id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=8), nullable=False),
        sa.Column("started_at", TZ, nullable=False),
        sa.Column("ended_at", TZ, nullable=True),
        sa.ForeignKeyConstraint(
            ["session_id"], ["node_sessions.id"], name=op.f("fk_node_usage_session_id_node_sessions")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_usage")),
    )
    op.create_index(op.f("ix_node_usage_session_id"), "node_usage", ["session_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_node_usage_session_id"), table_name="node_usage")
    op.drop_table("node_usage")
    op.drop_index(op.f("ix_node_sessions_resumed_at"), table_name="node_sessions")
    op.drop_index(op.f("ix_node_sessions_partition"), table_name="node_sessions")
    op.drop_index("ix_node_sessions_node_suspended_at", table_name="node_sessions")
    op.drop_table("node_sessions")
