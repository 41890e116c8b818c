"""The store: small functions over a Session. No Slurm, no policies, no money rules.

The caller owns the transaction (``with sessions.begin(): ...``), with one
exception: the lease functions commit, because a lease nobody else can see
protects nothing.

Idempotency: ``create_job`` with a key that exists returns the existing job
(the daemon relies on this to survive a client retry or its own crash between
"stored" and "answered"). The same key with a *different* request, or from
another user, raises ``IdempotencyConflict``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, lazyload
from sqlalchemy.orm.attributes import set_committed_value

from broker.db.engine import default_db_url, make_engine, session_factory
from broker.db.models import Attempt, Event, Job, Lease
from broker.errors import BrokerError
from broker.spec import JobSpec, spec_to_dict
from broker.states import ACTIVE, TERMINAL, AttemptState, JobState, can_move
from policies.base import Capacity

__all__ = [
    "IdempotencyConflict",
    "IllegalTransition",
    "acquire_lease",
    "active_jobs",
    "add_attempt",
    "add_event",
    "attempts_by_slurm_id",
    "create_job",
    "default_db_url",
    "get_job",
    "get_job_by_key",
    "job_attempts",
    "job_events",
    "lease_holder",
    "list_jobs",
    "make_engine",
    "release_lease",
    "renew_lease",
    "session_factory",
    "set_job_state",
]

DEFAULT_LIST_LIMIT = 100


class IllegalTransition(BrokerError):
    """A job state move that ``broker.states`` does not allow (a bug, or a stale view)."""


class IdempotencyConflict(BrokerError):
    """A job key reused for a different request or by another user."""

    exit_code = 2


# --------------------------------------------------------------------------- lease


def _upsert_dialect(session: Session) -> str:
    name = session.get_bind().dialect.name
    if name not in ("sqlite", "postgresql"):
        raise ValueError(f"unsupported database {name!r}")
    return name


def acquire_lease(session: Session, name: str, holder: str, ttl_s: float, now: datetime) -> bool:
    """Take the lease ``name`` if it is free, expired, or already ours. Commits.

    One statement (INSERT .. ON CONFLICT DO UPDATE .. WHERE expired-or-mine)
    decides, so two daemons racing on either backend cannot both win: the
    database serialises the conflicting row.
    """
    expires = now + timedelta(seconds=ttl_s)
    values = {"name": name, "holder": holder, "expires_at": expires}
    take_if = or_(Lease.holder == holder, Lease.expires_at <= now)
    if _upsert_dialect(session) == "postgresql":
        pg = postgresql.insert(Lease).values(values)
        session.execute(pg.on_conflict_do_update(
            index_elements=[Lease.name],
            set_={"holder": pg.excluded.holder, "expires_at": pg.excluded.expires_at},
            where=take_if,
        ))
    else:
        lite = sqlite.insert(Lease).values(values)
        session.execute(lite.on_conflict_do_update(
            index_elements=[Lease.name],
            set_={"holder": lite.excluded.holder, "expires_at": lite.excluded.expires_at},
            where=take_if,
        ))
    current = session.execute(select(Lease.holder).where(Lease.name == name)).scalar_one()
    session.commit()
    return current == holder


def renew_lease(session: Session, name: str, holder: str, ttl_s: float, now: datetime) -> bool:
    """Push our lease's expiry to now + ttl. False if someone else holds it now. Commits."""
    result = session.execute(
        update(Lease)
        .where(Lease.name == name, Lease.holder == holder)
        .values(expires_at=now + timedelta(seconds=ttl_s))
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return cast(CursorResult[Any], result).rowcount == 1


def release_lease(session: Session, name: str, holder: str) -> bool:
    """Give the lease up (on a clean stop) so the next daemon need not wait. Commits."""
    result = session.execute(
        delete(Lease).where(Lease.name == name, Lease.holder == holder).execution_options(synchronize_session=False)
    )
    session.commit()
    return cast(CursorResult[Any], result).rowcount == 1


def take_over_lease(
    session: Session, name: str, dead_holder: str, holder: str, ttl_s: float, now: datetime
) -> bool:
    """Take the lease from ``dead_holder`` (known dead: same host, process gone). Commits.

    Compare-and-swap on the holder, so a live daemon that renewed meanwhile, or
    a third one that got there first, keeps it.
    """
    result = session.execute(
        update(Lease)
        .where(Lease.name == name, Lease.holder == dead_holder)
        .values(holder=holder, expires_at=now + timedelta(seconds=ttl_s))
        .execution_options(synchronize_session=False)
    )
    session.commit()
    return cast(CursorResult[Any], result).rowcount == 1


def lease_holder(session: Session, name: str, now: datetime) -> str | None:
    """Who holds the lease right now (None if free or expired)."""
    row = session.execute(select(Lease.holder, Lease.expires_at).where(Lease.name == name)).one_or_none()
    if row is None or row.expires_at <= now:
        return None
    return cast(str, row.holder)


# --------------------------------------------------------------------------- jobs


def spec_json(spec: JobSpec) -> str:
    """The stored form of a spec: stable key order, so equal specs give equal text."""
    return json.dumps(spec_to_dict(spec), sort_keys=True, separators=(",", ":"))


def create_job(
    session: Session,
    *,
    key: str,
    spec: JobSpec,
    owner_uid: int,
    owner_name: str,
    now: datetime,
    state: JobState = JobState.ADMITTED,
    placement_policy: str = "",
    capacity: Capacity = Capacity.NONE,
    partition: str | None = None,
    estimate_micros: int = 0,
    reserved_micros: int = 0,
    reason: str = "",
) -> Job:
    """Store a new job (and a "created" event), or return the job already stored under ``key``.

    Safe against a concurrent insert of the same key: the insert is
    ON CONFLICT DO NOTHING, and the loser reads the winner's row.
    """
    text = spec_json(spec)
    values: dict[str, Any] = {
        "key": key, "owner_uid": owner_uid, "owner_name": owner_name, "group_name": spec.group,
        "name": spec.name, "kind": spec.kind, "spec_json": text, "state": state,
        "placement_policy": placement_policy, "capacity": capacity, "partition": partition,
        "estimate_micros": estimate_micros, "reserved_micros": reserved_micros, "deadline": spec.deadline,
        "reason": reason, "created_at": now, "updated_at": now,
    }
    if _upsert_dialect(session) == "postgresql":
        stmt: Any = postgresql.insert(Job).values(values).on_conflict_do_nothing(index_elements=[Job.key])
    else:
        stmt = sqlite.insert(Job).values(values).on_conflict_do_nothing(index_elements=[Job.key])
    new_id = session.execute(stmt.returning(Job.id)).scalar_one_or_none()
    if new_id is None:
        raced = get_job_by_key(session, key)
        assert raced is not None, "ON CONFLICT fired but the row is gone"
        return check_same_request(raced, owner_uid, text)
    add_event(session, "created", f"job {key} created as {state.value}", now=now, job_id=new_id,
              data={"key": key, "owner_uid": owner_uid, "state": state.value})
    # A new job has no attempts: its list is not loaded (one query fewer on every submission).
    job = session.get(Job, new_id, options=[lazyload(Job.attempts)])
    assert job is not None
    set_committed_value(job, "attempts", [])
    return job


def check_same_request(job: Job, owner_uid: int, text: str) -> Job:
    if job.owner_uid != owner_uid:
        raise IdempotencyConflict(f"job key {job.key} belongs to another user",
                                  hint="use another key, or leave --key out and gbroker makes one")
    if job.spec_json != text:
        raise IdempotencyConflict(f"job key {job.key} was already used for a different request",
                                  hint="use another key, or leave --key out and gbroker makes one")
    return job


def get_job(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id)


def get_job_by_key(session: Session, key: str) -> Job | None:
    return session.execute(select(Job).where(Job.key == key)).scalar_one_or_none()


def list_jobs(
    session: Session,
    *,
    owner_uid: int | None = None,
    group_name: str | None = None,
    states: Iterable[JobState] | None = None,
    limit: int = DEFAULT_LIST_LIMIT,
) -> list[Job]:
    """Newest first."""
    stmt = select(Job).order_by(Job.id.desc()).limit(limit)
    if owner_uid is not None:
        stmt = stmt.where(Job.owner_uid == owner_uid)
    if group_name is not None:
        stmt = stmt.where(Job.group_name == group_name)
    if states is not None:
        stmt = stmt.where(Job.state.in_(list(states)))
    return list(session.execute(stmt).scalars())


def active_jobs(session: Session) -> list[Job]:
    """Every job not in a terminal state, oldest first: what reconcile looks at."""
    stmt = select(Job).where(Job.state.in_(sorted(ACTIVE))).order_by(Job.id)
    return list(session.execute(stmt).scalars())


def set_job_state(session: Session, job: Job, state: JobState, reason: str, now: datetime) -> bool:
    """Move ``job`` to ``state`` and log the move. Returns False if it was there already.

    A repeat (same state) changes nothing but a changed reason, and logs no
    event, so an idempotent reconcile tick leaves no trail. A move that
    ``broker.states.can_move`` forbids raises IllegalTransition.
    """
    old = job.state
    if old == state:
        if reason and reason != job.reason:
            job.reason = reason
            job.updated_at = now
        return False
    if not can_move(old, state):
        raise IllegalTransition(
            f"job {job.key}: cannot move from {old.value} to {state.value}",
            hint="this is a gbroker bug or a stale view of the job; reload it and retry",
        )
    job.state = state
    job.reason = reason
    job.updated_at = now
    if state in TERMINAL:
        job.finished_at = now
    add_event(session, "state", f"{old.value} -> {state.value}" + (f": {reason}" if reason else ""),
              now=now, job_id=job.id, data={"from": old.value, "to": state.value, "reason": reason})
    return True


# --------------------------------------------------------------------------- attempts


def add_attempt(
    session: Session,
    job: Job,
    *,
    partition: str | None,
    capacity: Capacity,
    now: datetime,
) -> Attempt:
    """Record the intent to run ``job`` once more (state SUBMITTING), numbered after the last."""
    last = session.execute(select(func.max(Attempt.number)).where(Attempt.job_id == job.id)).scalar_one()
    attempt = Attempt(
        number=(last or 0) + 1,
        partition=partition,
        capacity=capacity,
        state=AttemptState.SUBMITTING,
        created_at=now,
    )
    job.attempts.append(attempt)
    session.flush()
    return attempt


def job_attempts(session: Session, job_id: int) -> list[Attempt]:
    stmt = select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)
    return list(session.execute(stmt).scalars())


def attempts_by_slurm_id(session: Session, slurm_job_ids: Iterable[int]) -> list[Attempt]:
    """Attempts carrying these Slurm ids (several per id after a Slurm requeue), by id then number."""
    ids = list(slurm_job_ids)
    if not ids:
        return []
    stmt = select(Attempt).where(Attempt.slurm_job_id.in_(ids)).order_by(Attempt.slurm_job_id, Attempt.number)
    return list(session.execute(stmt).scalars())


# --------------------------------------------------------------------------- events


def add_event(
    session: Session,
    kind: str,
    message: str = "",
    *,
    now: datetime,
    job_id: int | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    """Append an event. Events are never changed or deleted (the database refuses)."""
    ev = Event(job_id=job_id, at=now, kind=kind, message=message,
               data_json=json.dumps(data or {}, sort_keys=True))
    session.add(ev)
    return ev


def job_events(session: Session, job_id: int) -> list[Event]:
    """A job's events in the order they were written."""
    return list(session.execute(select(Event).where(Event.job_id == job_id).order_by(Event.id)).scalars())
