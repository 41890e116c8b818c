"""Arrays: an index on each piece's array, state and index.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

The reconcile tick counts an array's pieces per state, finds its waiting
pieces among index ranges, and the ledger tick finds the arrays with
waiting pieces to hold at a group's budget: ``(job_id, state, idx)``
answers all of these from the index alone, without reading a row per piece
(a tick over 100,000 pieces). Downgrade drops it.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_array_pieces_job_state_idx", "array_pieces", ["job_id", "state", "idx"])


def downgrade() -> None:
    op.drop_index("ix_array_pieces_job_state_idx", table_name="array_pieces")
