"""The socket API's operations: who may do what, then the use case."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select

from broker.api import Caller
from broker.db import store
from broker.db.models import Attempt, Job
from broker.errors import NotFound, SpecError
from broker.service.context import Services, must_get
from broker.service.submit import submit
from broker.service.views import job_detail, job_summary
from broker.states import ATTEMPT_TERMINAL, TERMINAL, AttemptState, JobState

Handler = Callable[[Caller, dict[str, Any]], Any]


EXTENSIONS = ("broker.service.budget_api", "broker.service.node_api")
"""Modules that add operations: each has ``handlers(svc) -> dict[str, Handler]``."""


def make_handlers(svc: Services) -> dict[str, Handler]:
    import importlib

    ops = _job_handlers(svc)
    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        ops.update(module.handlers(svc))
    return ops


def _job_handlers(svc: Services) -> dict[str, Handler]:
    return {
        "ping": lambda caller, args: {"user": caller.name, "uid": caller.uid, "admin": caller.is_admin},
        "submit": lambda caller, args: submit(svc, caller, args.get("spec")),  # type: ignore[arg-type]
        "list": lambda caller, args: list_jobs(svc, caller, **args),
        "show": lambda caller, args: show_job(svc, caller, _int(args.get("job_id"), "job_id")),
        "cancel": lambda caller, args: cancel_jobs(svc, caller, [_int(j, "job_id") for j in args.get("job_ids", [])]),
    }


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{name}: expected a job number, got {value!r}")
    return value


def _visible(svc: Services, caller: Caller, job_id: int) -> Job:
    with svc.sessions() as s:
        job = s.get(Job, job_id)
        if job is None or (job.owner_uid != caller.uid and not caller.is_admin):
            # Same answer for "missing" and "not yours": job numbers are not a secret, contents are.
            raise NotFound(f"no job {job_id} of yours", hint="`gbroker history` lists your jobs")
        s.expunge(job)
        return job


def list_jobs(
    svc: Services, caller: Caller, active: bool = True, all_users: bool = False, limit: int = 200
) -> list[dict[str, Any]]:
    if all_users:
        caller.require_admin("listing every user's jobs")
    now = svc.clock.now()
    with svc.sessions() as s:
        q = select(Job).order_by(Job.id.desc()).limit(max(1, min(int(limit), 10_000)))
        if not all_users:
            q = q.where(Job.owner_uid == caller.uid)
        if active:
            q = q.where(Job.state.not_in(list(TERMINAL)))
        return [job_summary(s, j, now) for j in s.execute(q).scalars()]


def show_job(svc: Services, caller: Caller, job_id: int) -> dict[str, Any]:
    _visible(svc, caller, job_id)
    with svc.sessions() as s:
        job = must_get(s, Job, job_id)
        return job_detail(s, job, svc.clock.now())


def cancel_jobs(svc: Services, caller: Caller, job_ids: list[int]) -> list[dict[str, Any]]:
    if not job_ids:
        raise SpecError("give at least one job number")
    jobs = [_visible(svc, caller, j) for j in job_ids]
    slurm_ids: list[int] = []
    with svc.sessions() as s:
        for job in jobs:
            if JobState(job.state) in TERMINAL:
                continue
            slurm_ids += [
                a.slurm_job_id
                for a in s.execute(select(Attempt).where(Attempt.job_id == job.id)).scalars()
                if a.slurm_job_id is not None
            ]
    if slurm_ids:
        # Slurm first: if it is unreachable the error says so and nothing changes here.
        svc.backend.cancel(sorted(set(slurm_ids)))
    now = svc.clock.now()
    out = []
    with svc.tx() as s:
        for j in jobs:
            job = must_get(s, Job, j.id)
            if JobState(job.state) not in TERMINAL:
                for a in s.execute(select(Attempt).where(Attempt.job_id == job.id)).scalars():
                    if a.state not in ATTEMPT_TERMINAL:
                        a.state = AttemptState.CANCELLED
                        a.ended_at = a.ended_at or now
                store.set_job_state(s, job, JobState.CANCELLED, f"cancelled by {caller.name}", now=now)
            out.append({"id": job.id, "state": job.state})
    return out
