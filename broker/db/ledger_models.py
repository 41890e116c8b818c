"""Money tables: semesters, groups, quotas, the price book, budgets, and the ledger.

The ledger is two append-only tables (the database refuses UPDATE and DELETE,
like ``events``):

* ``ledger_runs``: one row per Slurm run (slurm job id, run index) once it has
  been charged, keyed so a run can never be settled twice;
* ``charges``: the money lines of a run, one per price period (and per
  semester, and useful/lost part), keyed on (slurm job id, run index, period
  start) so a line can never land twice. Idle node time is a line of its own
  (tag ``idle``, no Slurm job), and so are the node time a pool's billing
  rounds up to at the end of a power-up (tag ``rounding``) and what a stopped
  node keeps billing (tag ``stopped``).

Every line and run names its pool and GPU type (``pool``, ``gpu_type``; NULL
in rows from before the pool catalog: reports read those by their partition)
and its capacity class (``owned``, ``reserved``, ``spot``, ``ondemand``).

Money is integer micro-units (``broker.amount``); prices are micro-units per
GPU-hour. Times are UTC, whole seconds.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    event,
)
from sqlalchemy.orm import Mapped, mapped_column

from broker.db import models as _models  # noqa: F401  (the jobs table their foreign keys name)
from broker.db.base import NAME_LEN, AppendOnlyError, Base

TAG_USEFUL = "useful"
"""Work that survived: the run completed, or was saved by a checkpoint before a reclaim."""
TAG_LOST = "lost"
"""Work thrown away by a reclaim or preemption (since the last checkpoint)."""
TAG_IDLE = "idle"
"""A node that was up and paid for with no job on it."""
TAG_ROUNDING = "rounding"
"""Node time billed beyond a power-up's real length: the pool bills whole increments (or a minimum)."""
TAG_STOPPED = "stopped"
"""A stopped (powered-down) node whose provider keeps billing for it (disks, addresses)."""
TAGS = (TAG_USEFUL, TAG_LOST, TAG_IDLE, TAG_ROUNDING, TAG_STOPPED)
NODE_TAGS = frozenset({TAG_IDLE, TAG_ROUNDING, TAG_STOPPED})
"""Lines of node time no job used: the cluster's overhead, priced per node-hour."""


class Semester(Base):
    """A budget period: [starts_at, ends_at). Semesters never overlap."""

    __tablename__ = "semesters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    starts_at: Mapped[datetime]
    ends_at: Mapped[datetime]
    """Exclusive: the first second that belongs to the next semester."""
    created_at: Mapped[datetime]


class LabGroup(Base):
    """A research group: its Slurm account (what jobs are charged to) and its members."""

    __tablename__ = "lab_groups"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    slurm_account: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    created_at: Mapped[datetime]


class GroupMember(Base):
    __tablename__ = "group_members"
    __table_args__ = (UniqueConstraint("group_id", "user_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("lab_groups.id"), index=True)
    user_name: Mapped[str] = mapped_column(String(NAME_LEN), index=True)


class Quota(Base):
    """Most GPUs a group may have in flight at once (queued or running); None = no limit."""

    __tablename__ = "quotas"

    group_id: Mapped[int] = mapped_column(ForeignKey("lab_groups.id"), primary_key=True)
    max_gpus: Mapped[int | None] = mapped_column(Integer)
    max_ondemand_gpus: Mapped[int | None] = mapped_column(Integer)
    updated_at: Mapped[datetime]


class QuotaLimit(Base):
    """Most GPUs a group may have in flight at once on one capacity class or one GPU type."""

    __tablename__ = "quota_limits"

    group_id: Mapped[int] = mapped_column(ForeignKey("lab_groups.id"), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    """'class' (owned, reserved, spot, ondemand) or 'gpu' (a GPU type)."""
    name: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    max_gpus: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime]


class Price(Base):
    """Price per GPU-hour of (partition, capacity) from ``effective_at`` until the next row.

    ``partition`` may be ``*``: any partition of that capacity without a row of its own.
    """

    __tablename__ = "prices"
    __table_args__ = (UniqueConstraint("partition", "capacity", "effective_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    partition: Mapped[str] = mapped_column(String(NAME_LEN))
    capacity: Mapped[str] = mapped_column(String(16))
    price_micros: Mapped[int] = mapped_column(BigInteger)
    effective_at: Mapped[datetime]
    created_at: Mapped[datetime]
    note: Mapped[str] = mapped_column(Text, default="")


class Budget(Base):
    """Money a group may spend in a semester, its alert thresholds and what happens at 100 %."""

    __tablename__ = "budgets"
    __table_args__ = (UniqueConstraint("group_id", "semester_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("lab_groups.id"))
    semester_id: Mapped[int] = mapped_column(ForeignKey("semesters.id"))
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    thresholds: Mapped[str] = mapped_column(String(NAME_LEN), default="50,80,100")
    """Comma-separated whole percentages of the amount that raise an alert when spend crosses them."""
    hold_pending: Mapped[bool] = mapped_column(Boolean, default=True)
    """At the limit: hold the group's pending jobs in Slurm (released when the budget allows)."""
    cancel_running: Mapped[bool] = mapped_column(Boolean, default=False)
    """At 100 % spent: cancel running jobs (False: let them finish)."""
    alert_command: Mapped[str | None] = mapped_column(Text)
    """JSON argv run on an alert (details in the environment and on stdin)."""
    alert_url: Mapped[str | None] = mapped_column(Text)
    """Webhook: an alert is POSTed here as JSON."""
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]


class BudgetAlert(Base):
    """A threshold crossing that was announced; keyed so each fires once per budget amount."""

    __tablename__ = "budget_alerts"
    __table_args__ = (UniqueConstraint("budget_id", "threshold_pct", "amount_micros"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    budget_id: Mapped[int] = mapped_column(ForeignKey("budgets.id"))
    threshold_pct: Mapped[int] = mapped_column(Integer)
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    spent_micros: Mapped[int] = mapped_column(BigInteger)
    fired_at: Mapped[datetime]


class BudgetHold(Base):
    """A Slurm hold gbroker placed on a job because its group hit its budget.

    Only these holds are released when the budget allows; an admin's own holds are left alone.
    """

    __tablename__ = "budget_holds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    slurm_job_id: Mapped[int] = mapped_column(BigInteger)
    budget_id: Mapped[int] = mapped_column(ForeignKey("budgets.id"))
    held_at: Mapped[datetime]
    released_at: Mapped[datetime | None]


class LedgerRun(Base):
    """One Slurm run that has been charged (its lines are in ``charges``). Append-only."""

    __tablename__ = "ledger_runs"
    __table_args__ = (UniqueConstraint("slurm_job_id", "run_index", "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slurm_job_id: Mapped[int] = mapped_column(BigInteger)
    run_index: Mapped[int] = mapped_column(Integer)
    """Zero-based index of the run among the sacct --duplicates rows of the Slurm job."""
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    """Part of the key: Slurm reuses job ids after its state is reset (or at MaxJobId)."""
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id"))
    account: Mapped[str] = mapped_column(String(NAME_LEN))
    user_name: Mapped[str] = mapped_column(String(NAME_LEN))
    partition: Mapped[str] = mapped_column(String(NAME_LEN))
    capacity: Mapped[str] = mapped_column(String(16))
    """The pool's class: owned, reserved, spot or ondemand."""
    pool: Mapped[str | None] = mapped_column(String(NAME_LEN))
    """The pool of ``partition`` when it was charged; NULL before the catalog, or a partition of no pool."""
    gpu_type: Mapped[str | None] = mapped_column(String(NAME_LEN))
    """The pool's GPU type (Slurm's gres type); NULL when untyped or unknown."""
    state_raw: Mapped[str] = mapped_column(String(NAME_LEN))
    gpus: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime | None]
    elapsed_s: Mapped[int] = mapped_column(Integer)
    """The run time charged: sacct's ElapsedRaw, or what gbroker saw (``elapsed_source``)."""
    elapsed_source: Mapped[str] = mapped_column(String(16), default="sacct", server_default="sacct")
    """``sacct``, or ``observed`` when accounting lost a run gbroker saw running (sacct shows 0 s)."""
    lost_s: Mapped[int] = mapped_column(Integer, default=0)
    total_micros: Mapped[int] = mapped_column(BigInteger)
    settled_at: Mapped[datetime]


class Charge(Base):
    """One money line. Append-only; keyed so it cannot land twice."""

    __tablename__ = "charges"
    __table_args__ = (
        UniqueConstraint("slurm_job_id", "run_index", "period_start"),
        Index("ix_charges_account_period_start", "account", "period_start"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    line_key: Mapped[str] = mapped_column(String(128), unique=True)
    """"run:<slurm id>:<run index>:<period start epoch>", "idle:<node>:<start epoch>",
    "rounding:<node>:<resume epoch>" or "stopped:<node>:<start epoch>"."""
    slurm_job_id: Mapped[int | None] = mapped_column(BigInteger)
    run_index: Mapped[int | None] = mapped_column(Integer)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"), index=True)
    attempt_id: Mapped[int | None] = mapped_column(ForeignKey("attempts.id"))
    account: Mapped[str] = mapped_column(String(NAME_LEN))
    user_name: Mapped[str] = mapped_column(String(NAME_LEN))
    kind: Mapped[str] = mapped_column(String(16))
    partition: Mapped[str] = mapped_column(String(NAME_LEN))
    capacity: Mapped[str] = mapped_column(String(16))
    """The pool's class: owned, reserved, spot or ondemand."""
    pool: Mapped[str | None] = mapped_column(String(NAME_LEN))
    """The pool of ``partition`` when it was charged; NULL before the catalog, or a partition of no pool."""
    gpu_type: Mapped[str | None] = mapped_column(String(NAME_LEN))
    """The pool's GPU type (Slurm's gres type); NULL when untyped or unknown."""
    node: Mapped[str] = mapped_column(String(NAME_LEN), default="")
    tag: Mapped[str] = mapped_column(String(16))
    period_start: Mapped[datetime]
    period_end: Mapped[datetime]
    seconds: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)
    price_micros: Mapped[int] = mapped_column(BigInteger)
    """The price in force for this period, micro-units per GPU-hour (an ``idle`` line: the node's per node-hour)."""
    amount_micros: Mapped[int] = mapped_column(BigInteger)
    ondemand_micros: Mapped[int] = mapped_column(BigInteger)
    """What the same GPU-seconds would have cost on on-demand (for "saved against all-on-demand")."""
    created_at: Mapped[datetime]


class ReservationRelease(Base):
    """A job whose runs are all charged: its reservation no longer counts against the budget."""

    __tablename__ = "reservation_releases"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    charged_micros: Mapped[int] = mapped_column(BigInteger)
    released_at: Mapped[datetime]


@event.listens_for(LedgerRun, "before_update")
@event.listens_for(LedgerRun, "before_delete")
@event.listens_for(Charge, "before_update")
@event.listens_for(Charge, "before_delete")
def _ledger_is_append_only(_mapper: Any, _conn: Any, target: Any) -> None:
    # The database refuses too (triggers in migration 0002).
    raise AppendOnlyError(f"the ledger is append-only; refusing to change {type(target).__name__} {target.id}")
