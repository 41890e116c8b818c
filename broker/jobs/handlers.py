"""The socket API's operations: check every argument, who may do what, then the use case."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from broker.caller import Caller, Handler, bool_arg, int_arg, only_args
from broker.db.models import Attempt, Job
from broker.errors import NotFound, SpecError
from broker.spec import MAX_JOB_ID
from broker.state import Services, must_get
from broker.jobs import arrays, lifecycle
from broker.jobs.placement import pool_table
from broker.jobs.submit import plan, submit
from broker.jobs.views import job_detail, job_summaries
from broker.states import TERMINAL, JobState


MAX_IDS_PER_REQUEST = 1000
"""Jobs one request may name (cancel); more is refused at once, not worked through."""
MAX_LIST = 10_000

def handlers(svc: Services) -> dict[str, Handler]:
    """The job operations: ping, submit, plan (a dry run of submit), list, show, cancel, pools."""

    def ping(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "ping")
        return {"user": caller.name, "uid": caller.uid, "admin": caller.is_admin}

    def do_submit(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "submit", "spec", "key", "log")
        return submit(svc, caller, args.get("spec"), args.get("key"), args.get("log"))

    def do_plan(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "plan", "spec")
        return plan(svc, caller, args.get("spec"))

    def do_list(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "list", "active", "all_users", "limit", "user", "group", "state", "partitions")
        return list_jobs(
            svc, caller,
            active=bool_arg(args.get("active", True), "active"),
            all_users=bool_arg(args.get("all_users", False), "all_users"),
            limit=int_arg(args.get("limit", 200), "limit", 1, MAX_LIST),
            user=_name_arg(args.get("user"), "user"),
            group=_name_arg(args.get("group"), "group"),
            state=_state_arg(args.get("state")),
            partitions=_names_arg(args.get("partitions"), "partitions"),
        )

    def do_show(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "show", "job_id")
        return show_job(svc, caller, _job_id(args.get("job_id")))

    def do_cancel(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "cancel", "job_ids")
        raw = args.get("job_ids")
        if not isinstance(raw, list):
            raise SpecError(f"job_ids: expected a list of job numbers, got {type(raw).__name__}")
        if len(raw) > MAX_IDS_PER_REQUEST:
            raise SpecError(f"cancel: at most {MAX_IDS_PER_REQUEST} jobs per request, got {len(raw)}",
                            hint="cancel in batches")
        return cancel_jobs(svc, caller, [_job_id(j) for j in raw])

    def do_pools(caller: Caller, args: dict[str, Any]) -> Any:
        only_args(args, "pools")
        return {"pools": pool_table(svc), "catalog": bool(svc.settings.pools)}

    return {"ping": ping, "submit": do_submit, "plan": do_plan, "list": do_list, "show": do_show, "cancel": do_cancel,
            "pools": do_pools}


# -- argument checks: every value a request carries is checked before use ---------------------
def _job_id(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"job_id: expected a job number, got {str(value)[:40]!r}")
    if not 1 <= value <= MAX_JOB_ID:
        raise NotFound(f"no job {str(value)[:40]} of yours", hint="`gbroker history` lists your jobs")
    return value


def _visible(s: Any, caller: Caller, job_ids: list[int]) -> list[Job]:
    """The named jobs, in the order named; NotFound for the first that is missing or not the caller's."""
    found = {j.id: j for j in s.execute(select(Job).where(Job.id.in_(job_ids))).scalars()}
    out = []
    for job_id in job_ids:
        job = found.get(job_id)
        if job is None or (job.owner_uid != caller.uid and not caller.is_admin):
            # Same answer for "missing" and "not yours": job numbers are not a secret, contents are.
            raise NotFound(f"no job {job_id} of yours", hint="`gbroker history` lists your jobs")
        out.append(job)
    return out


def list_jobs(
    svc: Services, caller: Caller, active: bool = True, all_users: bool = False, limit: int = 200, *,
    user: str | None = None, group: str | None = None, state: JobState | None = None,
    partitions: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Newest first: the caller's jobs (every user's with ``all_users``, admins only), those of
    ``user``, ``group``, in ``state`` (which replaces ``active``) and on one of ``partitions``
    when given (filtered by the database, so ``limit`` counts the matching jobs)."""
    if all_users:
        caller.require_admin("listing every user's jobs")
    if user is not None and user != caller.name:
        caller.require_admin(f"listing {user}'s jobs")
        all_users = True
    now = svc.clock.now()
    with svc.read() as s:  # a read waits for no submission's transaction
        q = select(Job).order_by(Job.id.desc()).limit(limit)
        if not all_users:
            q = q.where(Job.owner_uid == caller.uid)
        if user is not None:
            q = q.where(Job.owner_name == user)
        if group is not None:
            q = q.where(Job.group_name == group)
        if state is not None:
            q = q.where(Job.state == state)
        elif active:
            q = q.where(Job.state.not_in(list(TERMINAL)))
        if partitions is not None:
            q = q.where(Job.partition.in_(partitions))
        return job_summaries(s, list(s.execute(q).scalars()), now)


def _name_arg(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 64 or not value.isprintable():
        raise SpecError(f"{name}: give a name (up to 64 printable characters), not {str(value)[:40]!r}")
    return value


def _names_arg(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > 100:
        raise SpecError(f"{name}: give a list of up to 100 names")
    return [n for v in value if (n := _name_arg(v, name)) is not None]


def _state_arg(value: Any) -> JobState | None:
    if value is None:
        return None
    states = [st.value for st in JobState]
    if value not in states:
        raise SpecError(f"state {str(value)[:40]!r} is not a job state", hint="states: " + ", ".join(states))
    return JobState(value)


def show_job(svc: Services, caller: Caller, job_id: int) -> dict[str, Any]:
    with svc.read() as s:
        (job,) = _visible(s, caller, [job_id])
        return job_detail(s, job, svc.clock.now())


def cancel_jobs(svc: Services, caller: Caller, job_ids: list[int]) -> list[dict[str, Any]]:
    if not job_ids:
        raise SpecError("give at least one job number")
    job_ids = list(dict.fromkeys(job_ids))
    with svc.sessions() as s:
        jobs = _visible(s, caller, job_ids)
        live = [j.id for j in jobs if JobState(j.state) not in TERMINAL]
        bound = [
            (a.slurm_job_id or 0, j.key, j.owner_name)
            for j, a in s.execute(
                select(Job, Attempt).join(Attempt, Attempt.job_id == Job.id)
                .where(Job.id.in_(live), Attempt.slurm_job_id.is_not(None))
            ).all()
        ]
        keys = {j.id: (j.key, j.owner_name) for j in jobs}
        array_bound = [(a, *keys[j]) for j, a in arrays.slurm_arrays(s, live)]
    if array_bound:
        arrays.cancel_arrays(svc, array_bound)  # Slurm first, as below
    if bound:
        from broker.ownership import verified

        # Slurm first: if it is unreachable the error says so and nothing changes here.
        # Only ids Slurm itself shows as these jobs' (key and owner) are touched.
        ids = verified(svc, bound)
        if ids:
            svc.backend.cancel(ids)
    now = svc.clock.now()
    out = []
    with svc.tx() as s:
        for job_id in job_ids:
            job = must_get(s, Job, job_id)
            if JobState(job.state) not in TERMINAL:
                lifecycle.job_cancelled(s, job, f"cancelled by {caller.name}", now)
            out.append({"id": job.id, "state": job.state})
    return out
