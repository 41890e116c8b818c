"""Arrays: each piece's state and each Slurm array submitted for them.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

The ``array_batches`` and ``array_pieces`` tables (a job with batches is an
array; jobs from before have none). Downgrade drops them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "array_batches",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("indices", sa.Text(), nullable=False),
        sa.Column("slurm_array_id", sa.BigInteger(), nullable=True),
        sa.Column("partition", sa.String(length=64), nullable=True),
        sa.Column("capacity", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_array_batches_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_array_batches")),
        sa.UniqueConstraint("job_id", "number", name=op.f("uq_array_batches_job_id_number")),
    )
    op.create_index(op.f("ix_array_batches_job_id"), "array_batches", ["job_id"])
    op.create_index(op.f("ix_array_batches_slurm_array_id"), "array_batches", ["slurm_array_id"])
    op.create_table(
        "array_pieces",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("last", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("reclaims", sa.Integer(), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_array_pieces_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_array_pieces")),
        sa.UniqueConstraint("job_id", "idx", name=op.f("uq_array_pieces_job_id_idx")),
    )
    op.create_index(op.f("ix_array_pieces_job_id"), "array_pieces", ["job_id"])
    op.create_index(op.f("ix_array_pieces_state"), "array_pieces", ["state"])


def downgrade() -> None:
    op.drop_table("array_pieces")
    op.drop_table("array_batches")
