"""Jobs as plain dicts for the socket API (the CLI never sees ORM objects)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.db.models import Attempt, Event, Job
from broker.states import JobState


def _iso(dt: datetime | None) -> str | None:
    if dt is None:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _age(job: Any, now: datetime) -> int:
    created = job.created_at if job.created_at.tzinfo else job.created_at.replace(tzinfo=UTC)
    return max(0, int((now - created).total_seconds()))


def job_summary(session: Session, job: Job, now: datetime) -> dict[str, Any]:
    last = session.execute(
        select(Attempt).where(Attempt.job_id == job.id).order_by(Attempt.number.desc()).limit(1)
    ).scalar_one_or_none()
    count = session.execute(select(func.count()).where(Attempt.job_id == job.id)).scalar_one()
    return {**summary_of(job, attempts=count, slurm_job_id=last.slurm_job_id if last else None, now=now),
            **_pieces(session, job)}


def job_summaries(session: Session, jobs: list[Job], now: datetime) -> list[dict[str, Any]]:
    """``job_summary`` of each job, in three queries for all of them (the jobs, as loaded
    with their attempts, and their arrays' pieces), not three per job (a status of 200 jobs)."""
    from broker.jobs.arrays import counts_of, pieces_summary

    pieces = counts_of(session, [j.id for j in jobs])
    out = []
    for job in jobs:
        attempts = job.attempts  # loaded with the job (selectin), in number order
        row = summary_of(job, attempts=len(attempts), slurm_job_id=attempts[-1].slurm_job_id if attempts else None,
                         now=now)
        summary = pieces_summary(pieces.get(job.id, {}))
        if summary is not None:
            row["pieces"] = summary
        out.append(row)
    return out


def summary_of(job: Any, *, attempts: int, slurm_job_id: int | None, now: datetime) -> dict[str, Any]:
    """``job_summary`` of a job whose attempts are known and that has no pieces (not an array);
    ``job``: a Job, or its row (any object with a Job's attributes)."""
    return {
        "id": job.id,
        "key": job.key,
        "name": job.name,
        "kind": job.kind,
        "owner": job.owner_name,
        "owner_uid": job.owner_uid,
        "group": job.group_name,
        "state": job.state,
        "reason": job.reason or "",
        "capacity": job.capacity,
        "partition": job.partition,
        "policy": job.placement_policy,
        "reclaims": job.reclaims,
        "failures": job.failures,
        "attempts": attempts,
        "slurm_job_id": slurm_job_id,
        "deadline": _iso(job.deadline),
        "created_at": _iso(job.created_at),
        "finished_at": _iso(job.finished_at),
        "age_s": _age(job, now),
    }


def _pieces(session: Session, job: Job) -> dict[str, Any]:
    from broker.jobs.arrays import array_summary

    summary = array_summary(session, job)
    return {} if summary is None else {"pieces": summary}


def attempt_dict(a: Attempt) -> dict[str, Any]:
    return {
        "number": a.number,
        "slurm_job_id": a.slurm_job_id,
        "partition": a.partition,
        "capacity": a.capacity,
        "state": a.state,
        "nodes": a.nodes,
        "submitted_at": _iso(a.submitted_at),
        "started_at": _iso(a.started_at),
        "ended_at": _iso(a.ended_at),
        "exit_code": a.exit_code,
        "lost_s": a.lost_s,
    }


def job_detail(session: Session, job: Job, now: datetime) -> dict[str, Any]:
    out = job_summary(session, job, now)
    attempts = session.execute(
        select(Attempt).where(Attempt.job_id == job.id).order_by(Attempt.number)
    ).scalars()
    out["attempts"] = [attempt_dict(a) for a in attempts]
    if job.state == JobState.COMPLETING and out["attempts"] and out["attempts"][-1]["state"] in ("running", "moving"):
        out["attempts"][-1]["state"] = "completing"  # as Slurm shows it; it holds its nodes until it has ended
    events = session.execute(
        select(Event).where(Event.job_id == job.id).order_by(Event.id)
    ).scalars()
    out["events"] = [{"at": _iso(e.at), "kind": e.kind, "message": e.message} for e in events]
    out["log"] = job.log_path
    if "pieces" in out:
        from broker.jobs.arrays import array_detail

        out["array"] = array_detail(session, job)
    return out
