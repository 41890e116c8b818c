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

from sqlalchemy import CursorResult, Table, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, lazyload
from sqlalchemy.orm.attributes import set_committed_value

from broker.db.engine import default_db_url, make_engine, session_factory
from broker.db.models import Attempt, Event, Job, Lease
from broker.errors import BrokerError
from broker.spec import JobSpec, spec_from_dict, spec_to_dict
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
    "event_row",
    "insert_events",
    "insert_first_attempt",
    "insert_job",
    "job_values",
    "key_is_stored",
    "state_event_row",
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
    log_path: str | None = None,
) -> Job:
    """Store a new job (and a "created" event), or return the job already stored under ``key``.

    Safe against a concurrent insert of the same key: the insert is
    ON CONFLICT DO NOTHING, and the loser reads the winner's row.
    """
    values = job_values(key=key, spec=spec, owner_uid=owner_uid, owner_name=owner_name, now=now, state=state,
                        placement_policy=placement_policy, capacity=capacity, partition=partition,
                        estimate_micros=estimate_micros, reserved_micros=reserved_micros, reason=reason,
                        log_path=log_path)
    new_id = insert_job(session, values)
    if new_id is None:
        raced = get_job_by_key(session, key)
        assert raced is not None, "ON CONFLICT fired but the row is gone"
        return check_same_request(raced, owner_uid, values["spec_json"])
    # A new job has no attempts: its list is not loaded (one query fewer on every submission).
    job = session.get(Job, new_id, options=[lazyload(Job.attempts)])
    assert job is not None
    set_committed_value(job, "attempts", [])
    return job


def job_values(
    *, key: str, spec: JobSpec, owner_uid: int, owner_name: str, now: datetime, state: JobState,
    placement_policy: str, capacity: Capacity, partition: str | None, estimate_micros: int,
    reserved_micros: int, reason: str, log_path: str | None,
) -> dict[str, Any]:
    """The row of a new job (what ``insert_job`` stores)."""
    return {
        "key": key, "owner_uid": owner_uid, "owner_name": owner_name, "group_name": spec.group,
        "name": spec.name, "kind": spec.kind, "spec_json": spec_json(spec), "state": state,
        "placement_policy": placement_policy, "capacity": capacity, "partition": partition,
        "estimate_micros": estimate_micros, "reserved_micros": reserved_micros, "deadline": spec.deadline,
        "reason": reason, "created_at": now, "updated_at": now, "log_path": log_path, "gpus": spec.gpus,
        "reclaims": 0, "failures": 0, "done_s": 0,
    }


_INSERT_JOB = {
    dialect.__name__.rsplit(".", 1)[-1]: dialect.insert(Job.__table__)
    .on_conflict_do_nothing(index_elements=["key"]).returning(Job.__table__.c.id)
    for dialect in (postgresql, sqlite)
}
"""Made once: building a statement costs more than running it (the values come with each run)."""


def insert_job(session: Session, values: dict[str, Any]) -> int | None:
    """Insert a job row (``job_values``) and its "created" event, without loading it; its id,
    or None when a job with that key exists (ON CONFLICT DO NOTHING: nothing is written)."""
    new_id = session.connection().execute(_INSERT_JOB[_upsert_dialect(session)], values).scalar_one_or_none()
    if new_id is not None:
        insert_events(session, [event_row(
            "created", f"job {values['key']} created as {values['state'].value}", now=values["created_at"],
            job_id=new_id, data={"key": values["key"], "owner_uid": values["owner_uid"],
                                 "state": values["state"].value})])
    return new_id


def check_same_request(job: Job, owner_uid: int, text: str) -> Job:
    if job.owner_uid != owner_uid:
        raise IdempotencyConflict(f"job key {job.key} belongs to another user",
                                  hint="use another key, or leave --key out and gbroker makes one")
    if job.spec_json != text and not _same_spec(job.spec_json, text):
        raise IdempotencyConflict(f"job key {job.key} was already used for a different request",
                                  hint="use another key, or leave --key out and gbroker makes one")
    return job


def _same_spec(stored: str, text: str) -> bool:
    """The same request written by another release (the stored form may gain or drop default fields)."""
    try:
        return spec_from_dict(json.loads(stored)) == spec_from_dict(json.loads(text))
    except (ValueError, BrokerError):
        return False


def get_job(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id)


def get_job_by_key(session: Session, key: str) -> Job | None:
    return session.execute(select(Job).where(Job.key == key)).scalar_one_or_none()


def key_is_stored(session: Session, key: str) -> bool:
    """Is there a job with this key? (Asked at every submission: a row check, nothing loaded.)"""
    return session.connection().execute(_KEY_STORED, {"key": key}).first() is not None


_KEY_STORED = select(Job.__table__.c.id).where(Job.__table__.c.key == bindparam("key"))


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
    session.add(Event(**state_event_row(job.id, old, state, reason, now)))
    return True


def state_event_row(job_id: int, old: JobState, new: JobState, reason: str, now: datetime) -> dict[str, Any]:
    """The event a job's move from ``old`` to ``new`` logs."""
    return event_row("state", f"{old.value} -> {new.value}" + (f": {reason}" if reason else ""), now=now,
                     job_id=job_id, data={"from": old.value, "to": new.value, "reason": reason})


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


def insert_first_attempt(session: Session, job_id: int, *, partition: str | None, capacity: Capacity,
                         now: datetime) -> int:
    """Record the intent to run a job just inserted (``insert_job``) the first time, without
    loading either; the attempt's id. (``add_attempt`` does it for a loaded job, any time.)"""
    return int(session.connection().execute(_INSERT_ATTEMPT, {
        "job_id": job_id, "number": 1, "partition": partition, "capacity": capacity,
        "state": AttemptState.SUBMITTING, "created_at": now, "nodes": "", "lost_s": 0, "slurm_restarts": 0,
    }).scalar_one())


_INSERT_ATTEMPT = insert(cast(Table, Attempt.__table__)).returning(Attempt.__table__.c.id)
_INSERT_EVENT = insert(cast(Table, Event.__table__))


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
    ev = Event(**event_row(kind, message, now=now, job_id=job_id, data=data))
    session.add(ev)
    return ev


def event_row(kind: str, message: str = "", *, now: datetime, job_id: int | None = None,
              data: dict[str, Any] | None = None) -> dict[str, Any]:
    """An event as a row (``add_event`` stores one as an object, ``insert_events`` rows as they are)."""
    return {"job_id": job_id, "at": now, "kind": kind, "message": message,
            "data_json": json.dumps(data or {}, sort_keys=True)}


def insert_events(session: Session, rows: list[dict[str, Any]]) -> None:
    """Append events given as rows (``event_row``), in one statement, without loading them."""
    if rows:
        session.connection().execute(_INSERT_EVENT, rows)


def job_events(session: Session, job_id: int) -> list[Event]:
    """A job's events in the order they were written."""
    return list(session.execute(select(Event).where(Event.job_id == job_id).order_by(Event.id)).scalars())
