"""Initial schema: jobs, attempts, events (append-only), lease.

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Plain SQLAlchemy types only: a migration must not change meaning when the
model code changes later. Enums are VARCHAR holding the enum value; times are
timestamps with time zone (UTC text on SQLite).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
APPEND_ONLY_MESSAGE = "events are append-only"


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("owner_uid", sa.Integer(), nullable=False),
        sa.Column("owner_name", sa.String(length=64), nullable=False),
        sa.Column("group_name", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("placement_policy", sa.String(length=64), nullable=False),
        sa.Column("capacity", sa.String(length=16), nullable=False),
        sa.Column("partition", sa.String(length=64), nullable=True),
        sa.Column("reclaims", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("done_s", sa.Integer(), nullable=False),
        sa.Column("estimate_micros", sa.BigInteger(), nullable=False),
        sa.Column("reserved_micros", sa.BigInteger(), nullable=False),
        sa.Column("deadline", TZ, nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.Column("finished_at", TZ, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("key", name=op.f("uq_jobs_key")),
    )
    op.create_index(op.f("ix_jobs_group_name"), "jobs", ["group_name"])
    op.create_index(op.f("ix_jobs_owner_uid"), "jobs", ["owner_uid"])
    op.create_index(op.f("ix_jobs_state"), "jobs", ["state"])

    op.create_table(
        "lease",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_lease")),
    )

    op.create_table(
        "attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("slurm_job_id", sa.BigInteger(), nullable=True),
        sa.Column("partition", sa.String(length=64), nullable=True),
        sa.Column("capacity", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("nodes", sa.Text(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("submitted_at", TZ, nullable=True),
        sa.Column("started_at", TZ, nullable=True),
        sa.Column("ended_at", TZ, nullable=True),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("lost_s", sa.Integer(), nullable=False),
        sa.Column("slurm_restarts", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_attempts_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
        sa.UniqueConstraint("job_id", "number", name=op.f("uq_attempts_job_id_number")),
    )
    op.create_index(op.f("ix_attempts_slurm_job_id"), "attempts", ["slurm_job_id"])

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("at", TZ, nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("data_json", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_events_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index(op.f("ix_events_at"), "events", ["at"])
    op.create_index("ix_events_job_id_id", "events", ["job_id", "id"])
    _create_append_only_triggers()


def _create_append_only_triggers() -> None:
    """The database itself refuses UPDATE and DELETE on events, whatever the client."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION gbroker_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}'; END $$"
        )
        op.execute(
            "CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events "
            "FOR EACH ROW EXECUTE FUNCTION gbroker_events_append_only()"
        )
        op.execute(
            "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events "
            "FOR EACH STATEMENT EXECUTE FUNCTION gbroker_events_append_only()"
        )
    else:
        for what in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER events_no_{what.lower()} BEFORE {what} ON events "
                f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_no_truncate ON events")
        op.execute("DROP TRIGGER IF EXISTS events_append_only ON events")
        op.execute("DROP FUNCTION IF EXISTS gbroker_events_append_only()")
    else:
        op.execute("DROP TRIGGER IF EXISTS events_no_update")
        op.execute("DROP TRIGGER IF EXISTS events_no_delete")
    op.drop_index("ix_events_job_id_id", table_name="events")
    op.drop_index(op.f("ix_events_at"), table_name="events")
    op.drop_table("events")
    op.drop_index(op.f("ix_attempts_slurm_job_id"), table_name="attempts")
    op.drop_table("attempts")
    op.drop_table("lease")
    op.drop_index(op.f("ix_jobs_state"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_owner_uid"), table_name="jobs")
    op.drop_index(op.f("ix_jobs_group_name"), table_name="jobs")
    op.drop_table("jobs")
