"""Chains: a job that starts only after other jobs completed (``after = [ID, ...]``, ``afterok``).

gbroker holds the waiting job itself and submits it when every job it waits
for has completed; it does not use Slurm's ``--dependency``. A gbroker job
is not one Slurm job: a reclaim may end its Slurm job and go on in a new
submission, a move to on-demand or back to owned capacity resubmits it, an
array retries its failed pieces in a new Slurm array. Slurm's ``afterok`` on
the first Slurm id would fire (or fail) on a run that gbroker carries on
elsewhere. gbroker's own job state is the one that says "completed".

When a job waited for fails, is cancelled, times out or misses its deadline,
the waiting job is cancelled with that reason (and so, a tick later, are the
jobs waiting for it).
"""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from broker.db.models import Job
from broker.jobs import lifecycle
from broker.state import Services
from broker.states import TERMINAL, JobState


def waits_for(job: Job) -> tuple[int, ...]:
    """The jobs ``job`` waits for, from its stored spec."""
    after = json.loads(job.spec_json).get("after") or []
    return tuple(int(a) for a in after)


def chain_blocks(s: Session, svc: Services, job: Job, now: datetime) -> str | None:
    """None when ``job`` may be submitted now; else why it waits (it is cancelled when it never can)."""
    after = waits_for(job)
    if not after:
        return None
    found = {j.id: j for j in s.execute(select(Job).where(Job.id.in_(after))).scalars()}
    waiting = []
    for dep in after:
        other = found.get(dep)
        if other is None:
            why = f"job {dep} it waits for does not exist"
        elif other.state == JobState.COMPLETED:
            continue
        elif other.state in (JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.DEADLINE_MISSED):
            why = f"job {dep} it waits for ended {other.state.value}" + (f" ({other.reason})" if other.reason else "")
        else:
            waiting.append(dep)
            continue
        lifecycle.job_cancelled(s, job, f"cancelled: {why}", now)
        return why
    if not waiting:
        return None
    reason = "waiting for job " + ", ".join(str(d) for d in waiting) + " to complete"
    lifecycle.array_moved(s, job, JobState.PENDING, reason, now)
    return reason


def check_after(s: Session, owner_uid: int, is_admin: bool, after: tuple[int, ...]) -> None:
    """At submit: every job named in ``after`` exists and is the caller's (or the caller is an admin)."""
    from broker.errors import NotFound

    found = {j.id: j for j in s.execute(select(Job).where(Job.id.in_(after))).scalars()}
    for dep in after:
        other = found.get(dep)
        if other is None or (other.owner_uid != owner_uid and not is_admin):
            raise NotFound(f"after: no job {dep} of yours to wait for", hint="`gbroker history` lists your jobs")
        if other.state in TERMINAL and other.state != JobState.COMPLETED:
            from broker.errors import SpecError

            raise SpecError(f"after: job {dep} already ended {other.state.value}, so this job could never start",
                            hint=f"resubmit job {dep} (or leave it out of --after); nothing was stored")
