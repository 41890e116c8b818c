"""Quotas per capacity class and per GPU type: the quota_limits table.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

A group's quota (``quotas``: all GPUs, on-demand GPUs) gains limits per
capacity class (owned, reserved, spot, ondemand) and per GPU type (a100,
l4...), one row each. Nothing existing changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "quota_limits",
        sa.Column("group_id", sa.Integer(), sa.ForeignKey("lab_groups.id"), primary_key=True),
        sa.Column("kind", sa.String(length=8), primary_key=True),
        sa.Column("name", sa.String(length=64), primary_key=True),
        sa.Column("max_gpus", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("quota_limits")
