"""Every ledger line and run names its pool and GPU type.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

``charges.pool``, ``charges.gpu_type``, ``ledger_runs.pool``,
``ledger_runs.gpu_type``: the pool of the charged partition (from the pool
catalog, ``[pools.NAME]``) and its GPU type, written with each new row.
``capacity`` keeps its column and now holds the pool's class (owned,
reserved, spot, ondemand); the new tags (``rounding``, ``stopped``) are text
too, so they need no schema change.

The ledger is append-only, so rows from before stay as they are (NULL pool):
reports read them under the pool whose partition they name, else as
``(partition X)``. Downgrade drops the columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LEDGER_TABLES = ("ledger_runs", "charges")
COLUMNS = ("pool", "gpu_type")


def upgrade() -> None:
    # A plain ADD COLUMN on both backends: SQLite's batch mode would copy the table and
    # lose the append-only triggers of 0002.
    for table in LEDGER_TABLES:
        for column in COLUMNS:
            op.add_column(table, sa.Column(column, sa.String(length=64), nullable=True))


def downgrade() -> None:
    for table in LEDGER_TABLES:
        for column in reversed(COLUMNS):
            op.drop_column(table, column)
