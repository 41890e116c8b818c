"""Jobs: their GPU count and the end of their reservation as columns, and the indexes admission uses.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

Admission adds up the GPUs of a group's queued and running jobs at every
submission (quotas per group, per capacity class and per GPU type). Read from
each job's stored spec, that meant loading every such job: a group with a
thousand jobs queued paid for a thousand rows per submission. ``jobs.gpus``
(nodes x GPUs per node, what the spec says) lets the database add them up.
Existing rows are filled from their spec.

Admission also adds up the money the group's jobs still hold: those whose
reservation was not released yet. Found by the absence of a
``reservation_releases`` row, that meant looking at every job the group ever
ran. ``jobs.released_at`` (set with that row; filled from it here) and the
index ``(group_name, released_at)`` find the few still holding money; the
index ``(group_name, state)`` finds a group's queued and running jobs without
reading its ended ones. Downgrade drops them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("gpus", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("released_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_jobs_group_state", "jobs", ["group_name", "state"])
    op.create_index("ix_jobs_group_released", "jobs", ["group_name", "released_at"])
    op.execute("UPDATE jobs SET released_at = (SELECT r.released_at FROM reservation_releases r "
               "WHERE r.job_id = jobs.id)")
    jobs = sa.table("jobs", sa.column("id", sa.Integer()), sa.column("spec_json", sa.Text()),
                    sa.column("gpus", sa.Integer()))
    if op.get_context().as_sql:
        return  # SQL for review (`upgrade --sql`): gpus stays NULL, and admission reads those rows' spec instead
    conn = op.get_bind()
    rows = conn.execute(sa.select(jobs.c.id, jobs.c.spec_json)).all()
    updates = []
    for job_id, text in rows:
        data = json.loads(text or "{}")
        updates.append({"job_id": job_id, "gpus": int(data.get("nodes", 1)) * int(data.get("gpus_per_node", 1))})
    if updates:
        conn.execute(jobs.update().where(jobs.c.id == sa.bindparam("job_id")).values(gpus=sa.bindparam("gpus")),
                     updates)


def downgrade() -> None:
    op.drop_index("ix_jobs_group_released", table_name="jobs")
    op.drop_index("ix_jobs_group_state", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("released_at")
        batch.drop_column("gpus")
