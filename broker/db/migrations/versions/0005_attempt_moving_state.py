"""A running spot attempt that gbroker requeues onto on-demand is in its own state, ``moving``.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

Before, such an attempt stayed ``running`` with the outcome "moving to
on-demand". Attempt states are stored as text, so the new state needs no
schema change: the attempts still being moved (not ended) take the state,
and lose the outcome that said it. Downgrade gives it back.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MOVING_OUTCOME = "moving to on-demand"
"""The outcome that marked a moving attempt up to 0004."""


def upgrade() -> None:
    op.execute(
        "UPDATE attempts SET state = 'moving', outcome = NULL "
        f"WHERE state = 'running' AND outcome = '{MOVING_OUTCOME}' AND ended_at IS NULL"
    )


def downgrade() -> None:
    op.execute(f"UPDATE attempts SET state = 'running', outcome = '{MOVING_OUTCOME}' WHERE state = 'moving'")
