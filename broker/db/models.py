"""The tables: jobs, their attempts (Slurm runs), the event log, the daemon lease.

Only the daemon writes these (principle 2). Enums come from ``broker.states``
and ``policies.base`` and are stored as their text values; times are UTC.
Any change here needs a migration in ``broker/db/migrations/versions`` (a test
compares the two).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    event,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from broker.db.base import NAME_LEN, AppendOnlyError, Base
from broker.db.types import EnumText
from broker.states import AttemptState, JobState
from policies.base import Capacity

class Job(Base):
    """One gbroker job: what was asked (spec_json) and where it stands now."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_group_state", "group_name", "state"),  # a group's queued and running jobs
        Index("ix_jobs_group_released", "group_name", "released_at"),  # its jobs still holding money
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(NAME_LEN), unique=True)
    """Idempotency key ("gb-<12 hex>"); it travels in the Slurm job's comment."""
    owner_uid: Mapped[int] = mapped_column(Integer, index=True)
    owner_name: Mapped[str] = mapped_column(String(NAME_LEN))
    group_name: Mapped[str] = mapped_column(String(NAME_LEN), index=True)
    """The Slurm account charged."""
    name: Mapped[str] = mapped_column(String(NAME_LEN))
    kind: Mapped[str] = mapped_column(String(16))
    spec_json: Mapped[str] = mapped_column(Text)
    """``broker.spec.spec_to_dict`` of the validated spec."""
    state: Mapped[JobState] = mapped_column(EnumText(JobState), index=True)
    placement_policy: Mapped[str] = mapped_column(String(NAME_LEN), default="")
    capacity: Mapped[Capacity] = mapped_column(EnumText(Capacity, 16), default=Capacity.NONE)
    """What the job runs on (or is aimed at) now."""
    partition: Mapped[str | None] = mapped_column(String(NAME_LEN))
    gpus: Mapped[int | None] = mapped_column(Integer)
    """GPUs the job holds when it runs (nodes x GPUs per node, from its spec)."""
    reclaims: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    """Failures of the program itself (counted against spec.max_retries)."""
    done_s: Mapped[int] = mapped_column(Integer, default=0)
    """Work seconds safe in a checkpoint."""
    estimate_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    reserved_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    deadline: Mapped[datetime | None]
    reason: Mapped[str] = mapped_column(Text, default="")
    """Why the job is in its state, for humans."""
    log_path: Mapped[str | None] = mapped_column(Text)
    """The job's log (every attempt appends to it); created at submit, as the owner."""
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    released_at: Mapped[datetime | None]
    """When its reservation stopped counting against the budget (its ``reservation_releases`` row)."""

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="job", order_by="Attempt.number", lazy="selectin"
    )

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.key} {self.state.value}>"


class Attempt(Base):
    """One run of a job in Slurm.

    Slurm keeps the job id when it requeues (NODE_FAIL), so one Slurm id can
    carry several attempts: (slurm_job_id, slurm_restarts) names a run, and
    (job_id, number) is the key.
    """

    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("job_id", "number"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    number: Mapped[int] = mapped_column(Integer)
    slurm_job_id: Mapped[int | None] = mapped_column(BigInteger, index=True)
    partition: Mapped[str | None] = mapped_column(String(NAME_LEN))
    capacity: Mapped[Capacity] = mapped_column(EnumText(Capacity, 16))
    state: Mapped[AttemptState] = mapped_column(EnumText(AttemptState))
    nodes: Mapped[str] = mapped_column(Text, default="")
    """The attempt's nodes, comma-separated and expanded, e.g. "spot1,spot2"."""
    created_at: Mapped[datetime]
    """When the intent was recorded (before sbatch)."""
    submitted_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    outcome: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    lost_s: Mapped[int] = mapped_column(Integer, default=0)
    """Work lost since the last checkpoint when this attempt ended."""
    slurm_restarts: Mapped[int] = mapped_column(Integer, default=0)
    """Slurm's restart count for this id when the attempt was seen."""

    job: Mapped[Job] = relationship(back_populates="attempts")

    def __repr__(self) -> str:
        return f"<Attempt {self.job_id}#{self.number} slurm={self.slurm_job_id} {self.state.value}>"


class Event(Base):
    """Append-only log: state moves, decisions, warnings. Triggers refuse UPDATE and DELETE."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))
    at: Mapped[datetime] = mapped_column(index=True)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text, default="")
    data_json: Mapped[str] = mapped_column(Text, default="{}")

    def __repr__(self) -> str:
        return f"<Event {self.id} job={self.job_id} {self.kind}>"


class Lease(Base):
    """The single-writer lease: one row per name; the holder renews it before expires_at."""

    __tablename__ = "lease"

    name: Mapped[str] = mapped_column(String(NAME_LEN), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    expires_at: Mapped[datetime]


@event.listens_for(Event, "before_update")
@event.listens_for(Event, "before_delete")
def _events_are_append_only(_mapper: Any, _conn: Any, target: Event) -> None:
    # The database refuses too (triggers in the first migration); this catches it before the round trip.
    raise AppendOnlyError(f"events are append-only; refusing to change event {target.id}")
