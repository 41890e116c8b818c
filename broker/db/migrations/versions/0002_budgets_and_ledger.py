"""Budgets and the ledger: semesters, groups, quotas, prices, budgets, alerts, holds, runs, charges.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

The ledger tables (ledger_runs, charges) are append-only: triggers refuse
UPDATE and DELETE (and TRUNCATE on PostgreSQL), whatever the client.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
APPEND_ONLY_MESSAGE = "the ledger is append-only"
LEDGER_TABLES = ("ledger_runs", "charges")


def upgrade() -> None:
    op.create_table(
        "semesters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("starts_at", TZ, nullable=False),
        sa.Column("ends_at", TZ, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_semesters")),
        sa.UniqueConstraint("name", name=op.f("uq_semesters_name")),
    )
    op.create_table(
        "lab_groups",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("slurm_account", sa.String(length=64), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_lab_groups")),
        sa.UniqueConstraint("name", name=op.f("uq_lab_groups_name")),
        sa.UniqueConstraint("slurm_account", name=op.f("uq_lab_groups_slurm_account")),
    )
    op.create_table(
        "group_members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["group_id"], ["lab_groups.id"], name=op.f("fk_group_members_group_id_lab_groups")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_group_members")),
        sa.UniqueConstraint("group_id", "user_name", name=op.f("uq_group_members_group_id_user_name")),
    )
    op.create_index(op.f("ix_group_members_group_id"), "group_members", ["group_id"])
    op.create_index(op.f("ix_group_members_user_name"), "group_members", ["user_name"])
    op.create_table(
        "quotas",
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.Column("max_gpus", sa.Integer(), nullable=True),
        sa.Column("max_ondemand_gpus", sa.Integer(), nullable=True),
        sa.Column("updated_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(["group_id"], ["lab_groups.id"], name=op.f("fk_quotas_group_id_lab_groups")),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_quotas")),
    )
    op.create_table(
        "prices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("partition", sa.String(length=64), nullable=False),
        sa.Column("capacity", sa.String(length=16), nullable=False),
        sa.Column("price_micros", sa.BigInteger(), nullable=False),
        sa.Column("effective_at", TZ, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_prices")),
        sa.UniqueConstraint(
            "partition", "capacity", "effective_at", name=op.f("uq_prices_partition_capacity_effective_at")
        ),
    )
    op.create_table(
        "budgets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.Column("semester_id", sa.Integer(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("thresholds", sa.String(length=64), nullable=False),
        sa.Column("hold_pending", sa.Boolean(), nullable=False),
        sa.Column("cancel_running", sa.Boolean(), nullable=False),
        sa.Column("alert_command", sa.Text(), nullable=True),
        sa.Column("alert_url", sa.Text(), nullable=True),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("updated_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(["group_id"], ["lab_groups.id"], name=op.f("fk_budgets_group_id_lab_groups")),
        sa.ForeignKeyConstraint(["semester_id"], ["semesters.id"], name=op.f("fk_budgets_semester_id_semesters")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budgets")),
        sa.UniqueConstraint("group_id", "semester_id", name=op.f("uq_budgets_group_id_semester_id")),
    )
    op.create_table(
        "budget_alerts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("budget_id", sa.Integer(), nullable=False),
        sa.Column("threshold_pct", sa.Integer(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("spent_micros", sa.BigInteger(), nullable=False),
        sa.Column("fired_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(["budget_id"], ["budgets.id"], name=op.f("fk_budget_alerts_budget_id_budgets")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_alerts")),
        sa.UniqueConstraint(
            "budget_id", "threshold_pct", "amount_micros",
            name=op.f("uq_budget_alerts_budget_id_threshold_pct_amount_micros"),
        ),
    )
    op.create_table(
        "budget_holds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("slurm_job_id", sa.BigInteger(), nullable=False),
        sa.Column("budget_id", sa.Integer(), nullable=False),
        sa.Column("held_at", TZ, nullable=False),
        sa.Column("released_at", TZ, nullable=True),
        sa.ForeignKeyConstraint(["budget_id"], ["budgets.id"], name=op.f("fk_budget_holds_budget_id_budgets")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_budget_holds_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_holds")),
    )
    op.create_index(op.f("ix_budget_holds_job_id"), "budget_holds", ["job_id"])
    op.create_table(
        "ledger_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slurm_job_id", sa.BigInteger(), nullable=False),
        sa.Column("run_index", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=True),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("partition", sa.String(length=64), nullable=False),
        sa.Column("capacity", sa.String(length=16), nullable=False),
        sa.Column("state_raw", sa.String(length=64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("started_at", TZ, nullable=True),
        sa.Column("elapsed_s", sa.Integer(), nullable=False),
        sa.Column("lost_s", sa.Integer(), nullable=False),
        sa.Column("total_micros", sa.BigInteger(), nullable=False),
        sa.Column("settled_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], name=op.f("fk_ledger_runs_attempt_id_attempts")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_ledger_runs_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_runs")),
        sa.UniqueConstraint(
            "slurm_job_id", "run_index", "job_id", name=op.f("uq_ledger_runs_slurm_job_id_run_index_job_id")
        ),
    )
    op.create_index(op.f("ix_ledger_runs_job_id"), "ledger_runs", ["job_id"])
    op.create_table(
        "charges",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("line_key", sa.String(length=128), nullable=False),
        sa.Column("slurm_job_id", sa.BigInteger(), nullable=True),
        sa.Column("run_index", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("attempt_id", sa.Integer(), nullable=True),
        sa.Column("account", sa.String(length=64), nullable=False),
        sa.Column("user_name", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("partition", sa.String(length=64), nullable=False),
        sa.Column("capacity", sa.String(length=16), nullable=False),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("tag", sa.String(length=16), nullable=False),
        sa.Column("period_start", TZ, nullable=False),
        sa.Column("period_end", TZ, nullable=False),
        sa.Column("seconds", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("price_micros", sa.BigInteger(), nullable=False),
        sa.Column("amount_micros", sa.BigInteger(), nullable=False),
        sa.Column("ondemand_micros", sa.BigInteger(), nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["attempts.id"], name=op.f("fk_charges_attempt_id_attempts")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_charges_job_id_jobs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_charges")),
        sa.UniqueConstraint("line_key", name=op.f("uq_charges_line_key")),
        sa.UniqueConstraint(
            "slurm_job_id", "run_index", "period_start", name=op.f("uq_charges_slurm_job_id_run_index_period_start")
        ),
    )
    op.create_index("ix_charges_account_period_start", "charges", ["account", "period_start"])
    op.create_index(op.f("ix_charges_job_id"), "charges", ["job_id"])
    op.create_table(
        "reservation_releases",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("charged_micros", sa.BigInteger(), nullable=False),
        sa.Column("released_at", TZ, nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_reservation_releases_job_id_jobs")),
        sa.PrimaryKeyConstraint("job_id", name=op.f("pk_reservation_releases")),
    )
    _create_append_only_triggers()


def _create_append_only_triggers() -> None:
    """The database itself refuses to change or remove a ledger line, whatever the client."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION gbroker_ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}'; END $$"
        )
        for table in LEDGER_TABLES:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION gbroker_ledger_append_only()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION gbroker_ledger_append_only()"
            )
    else:
        for table in LEDGER_TABLES:
            for what in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{what.lower()} BEFORE {what} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END"
                )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in LEDGER_TABLES:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
        op.execute("DROP FUNCTION IF EXISTS gbroker_ledger_append_only()")
    else:
        for table in LEDGER_TABLES:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete")
    op.drop_table("reservation_releases")
    op.drop_index(op.f("ix_charges_job_id"), table_name="charges")
    op.drop_index("ix_charges_account_period_start", table_name="charges")
    op.drop_table("charges")
    op.drop_index(op.f("ix_ledger_runs_job_id"), table_name="ledger_runs")
    op.drop_table("ledger_runs")
    op.drop_index(op.f("ix_budget_holds_job_id"), table_name="budget_holds")
    op.drop_table("budget_holds")
    op.drop_table("budget_alerts")
    op.drop_table("budgets")
    op.drop_table("prices")
    op.drop_table("quotas")
    op.drop_index(op.f("ix_group_members_user_name"), table_name="group_members")
    op.drop_index(op.f("ix_group_members_group_id"), table_name="group_members")
    op.drop_table("group_members")
    op.drop_table("lab_groups")
    op.drop_table("semesters")
