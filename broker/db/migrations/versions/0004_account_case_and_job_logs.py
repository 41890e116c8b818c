"""Group and account names ignore letter case; each job records its log file.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

Slurm compares account names ignoring case (it stores them lower-case), so
gbroker does too: every stored group name, Slurm account and charged account
becomes lower-case. Two groups whose names differ only in case cannot be
merged automatically (their members, quotas and budgets may differ): the
migration stops and says which, and an admin merges them by hand first.

``jobs.log_path``: the job's log, created at submit as the job's owner under a
name nobody can guess (NULL for jobs submitted before: they used
``<workdir>/gbroker-<id>.out``).

``ledger_runs.elapsed_source``: ``sacct``, or ``observed`` for a run that
accounting lost (sacct shows 0 s) and gbroker charged from what it saw.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LEDGER_TABLES = ("ledger_runs", "charges")
APPEND_ONLY_MESSAGE = "the ledger is append-only"


class CaseDuplicates(RuntimeError):
    """Groups that differ only in letter case; an admin must merge them first."""


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("log_path", sa.Text(), nullable=True))
    with op.batch_alter_table("ledger_runs") as batch:
        batch.add_column(sa.Column("elapsed_source", sa.String(length=16), nullable=False,
                                   server_default="sacct"))
    if not context.is_offline_mode():  # SQL printed for review cannot ask the database
        _refuse_case_duplicates()
    op.execute("UPDATE lab_groups SET name = lower(name), slurm_account = lower(slurm_account)")
    op.execute("UPDATE jobs SET group_name = lower(group_name) WHERE group_name <> lower(group_name)")
    for table in LEDGER_TABLES:
        _lower_ledger_accounts(table)


def _refuse_case_duplicates() -> None:
    bind = op.get_bind()
    for column in ("name", "slurm_account"):
        dupes = bind.execute(sa.text(
            f"SELECT lower({column}), count(*) FROM lab_groups GROUP BY lower({column}) HAVING count(*) > 1"
        )).all()
        if dupes:
            names = ", ".join(repr(d[0]) for d in dupes)
            raise CaseDuplicates(
                f"groups whose {column.replace('_', ' ')} differs only in letter case: {names}. "
                "Slurm treats them as one account. Merge them (move members, quotas and budgets to one "
                "group and delete the other with SQL), then run the upgrade again."
            )


def _lower_ledger_accounts(table: str) -> None:
    """Lower-case a ledger table's accounts with its append-only trigger lifted, in this transaction only."""
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.execute(f"ALTER TABLE {table} DISABLE TRIGGER {table}_append_only")
    else:
        op.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")
    op.execute(f"UPDATE {table} SET account = lower(account) WHERE account <> lower(account)")
    if postgres:
        op.execute(f"ALTER TABLE {table} ENABLE TRIGGER {table}_append_only")
    else:
        op.execute(
            f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} "
            f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END"
        )


def downgrade() -> None:
    with op.batch_alter_table("ledger_runs") as batch:
        batch.drop_column("elapsed_source")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("log_path")
