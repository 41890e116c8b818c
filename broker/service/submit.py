"""Submit: validate, place, record the intent, sbatch as the caller, record the outcome.

Intent before action (principle 4): the job and its first attempt are stored
with a unique key *before* sbatch runs, and the key travels in the Slurm job's
name and comment. If the daemon dies between sbatch and the commit, the next
reconcile tick finds the Slurm job by its key and adopts it instead of
submitting again.
"""

from __future__ import annotations

import json
import logging
import secrets
from datetime import datetime, timedelta
from typing import Any

from broker.api import Caller
from broker.db import store
from broker.db.models import Attempt, Job
from broker.errors import PermissionDenied, SlurmError, SlurmUnavailable, SpecError
from broker.service.admission import admit
from broker.service.context import Services, must_get
from broker.service.placement import capacity_of_partition, job_view, market_view
from broker.service.views import job_summary
from broker.slurm.backend import SubmitRequest
from broker.slurm.script import render_batch_script
from broker.spec import JobSpec, spec_from_dict
from broker.states import AttemptState, JobState
from policies import Capacity

log = logging.getLogger(__name__)


def new_key() -> str:
    return "gb-" + secrets.token_hex(6)


def slurm_name(key: str, attempt_number: int) -> str:
    """The Slurm job name of an sbatch made for `attempt_number` of job `key`."""
    return f"{key}-{attempt_number}"


def submit(svc: Services, caller: Caller, spec_data: dict[str, Any]) -> dict[str, Any]:
    now = svc.clock.now()
    if not isinstance(spec_data, dict):
        raise SpecError("the job spec must be a table of fields")
    spec = spec_from_dict(
        spec_data,
        now=now,
        partitions=svc.settings.partitions,
        max_gpus_per_node=svc.settings.max_gpus_per_node,
        max_nodes=svc.settings.max_nodes,
    )
    _check_can_submit(svc, caller)

    if spec.partition:
        partition = spec.partition
        capacity = capacity_of_partition(svc.settings, partition)
        placed_by = "user"
    else:
        placement = svc.policy.place(job_view(spec, now=now), market_view(svc, spec.nodes))
        capacity = placement.capacity.value if placement.capacity.value != "none" else "spot"
        partition = svc.settings.partition_for(capacity)
        placed_by = f"{svc.policy.name}: {placement.reason}"

    preflight(svc, caller, spec, partition, Capacity(capacity))
    key = new_key()
    with svc.tx() as s:
        admission = admit(s, svc, caller, spec, capacity, partition, now)
        job = store.create_job(
            s,
            key=key,
            spec=spec,
            owner_uid=caller.uid,
            owner_name=caller.name,
            placement_policy=svc.policy.name,
            capacity=Capacity(capacity),
            partition=partition,
            estimate_micros=admission.estimate_micros,
            reserved_micros=admission.reserved_micros,
            now=now,
        )
        attempt = store.add_attempt(s, job, partition=partition, capacity=Capacity(capacity), now=now)
        store.add_event(s, "intent", f"place on {partition} ({placed_by}); sbatch next", now=now, job_id=job.id)
        s.flush()
        job_id, attempt_id = job.id, attempt.id
        # Claimed before it is visible: a tick must not sbatch it as well (the
        # transaction holds the service lock, so no tick reads in between).
        svc.claim_sbatch(attempt_id)
        try:
            s.commit()
        except BaseException:
            svc.sbatch_finished(attempt_id, committed=False)
            raise
    svc.crash.reach("after_intent")

    note = admission.note
    try:
        slurm_id = sbatch_attempt(svc, job_id, attempt_id, claimed=True)
    except SlurmUnavailable as exc:
        slurm_id = None
        note = "Slurm is unreachable right now; the job is stored and will be submitted when it answers"
        log.warning("submit of job %s deferred: %s", job_id, exc)
    except SlurmError as exc:
        # The pre-flight passed but sbatch refused anyway: keep the record, say why.
        with svc.tx() as s:
            job = must_get(s, Job, job_id)
            store.set_job_state(s, job, JobState.FAILED, f"Slurm refused the job: {exc.stderr.strip()}", now=now)
        raise SpecError(
            f"Slurm refused the job: {_slurm_reason(exc)}",
            hint=f"check --group (your Slurm account) and the partition; job {job_id} is recorded as failed",
        ) from None
    with svc.sessions() as s:
        job = must_get(s, Job, job_id)
        result = job_summary(s, job, now)
    if note:
        result["note"] = note
    result["slurm_job_id"] = slurm_id
    return result


def sbatch_attempt(svc: Services, job_id: int, attempt_id: int, *, claimed: bool = False) -> int | None:
    """sbatch one stored attempt (state SUBMITTING) and record the Slurm job id.

    Exactly one caller sbatches an attempt: the submit that stored it (which
    claimed it already, `claimed=True`) or a reconcile tick. Returns the Slurm
    job id, or None when someone else is submitting it right now.

    Raises SlurmUnavailable (the attempt stays SUBMITTING, to be adopted or
    retried by the reconcile tick) or SlurmError.
    """
    if not claimed and not svc.claim_sbatch(attempt_id):
        return None
    committed = False
    try:
        with svc.sessions() as s:
            job = must_get(s, Job, job_id)
            attempt = must_get(s, Attempt, attempt_id)
            if attempt.slurm_job_id is not None:
                return attempt.slurm_job_id  # already in Slurm (an earlier sbatch was committed)
            spec = spec_from_dict(json.loads(job.spec_json))
            request = build_request(svc, job, attempt, spec)
        slurm_id = svc.backend.submit(request)
        svc.crash.reach("after_sbatch")
        now = svc.clock.now()
        with svc.tx() as s:
            job = must_get(s, Job, job_id)
            attempt = must_get(s, Attempt, attempt_id)
            attempt.slurm_job_id = slurm_id
            attempt.submitted_at = now
            attempt.state = AttemptState.PENDING
            if job.state in (JobState.ADMITTED, JobState.RECOVERING, JobState.UNKNOWN):
                store.set_job_state(s, job, JobState.PENDING, f"Slurm job {slurm_id}", now=now)
            store.add_event(
                s, "submitted", f"attempt {attempt.number} is Slurm job {slurm_id} on {attempt.partition}",
                now=now, job_id=job.id,
            )
        committed = True
    finally:
        svc.sbatch_finished(attempt_id, committed=committed)
    svc.crash.reach("after_commit")
    return slurm_id


def build_request(svc: Services, job: Job, attempt: Attempt, spec: JobSpec) -> SubmitRequest:
    return request_for(
        spec,
        job_id=job.id,
        key=job.key,
        attempt_number=attempt.number,
        partition=attempt.partition or svc.settings.partition_for(attempt.capacity.value),
        capacity=Capacity(attempt.capacity),
        owner_name=job.owner_name,
    )


SIGNAL_RESOLUTION_S = 60
"""sbatch(1) on --signal: "the signal may be sent up to 60 seconds earlier than specified"."""


def warning_lead_s(spec: JobSpec) -> int | None:
    """The warning lead to ask Slurm for, or None when the job is too short for one.

    Slurm may send the warning up to a minute early; for a job whose time
    limit is within a minute of its lead, that can be before the batch script
    has installed its handler, and the signal would kill the job at its start.
    """
    if spec.time_limit_s - spec.signal_lead_s < SIGNAL_RESOLUTION_S:
        return None
    return spec.signal_lead_s


def request_for(
    spec: JobSpec,
    *,
    job_id: int,
    key: str,
    attempt_number: int,
    partition: str,
    capacity: Capacity,
    owner_name: str,
) -> SubmitRequest:
    workdir = spec.workdir or "/tmp"
    lead = warning_lead_s(spec)
    checkpoint_dir = spec.checkpoint_dir or f"{workdir}/.gbroker/{job_id}"
    program: dict[str, object] = (
        {"command": list(spec.command)} if spec.command else {"script_text": spec.script}
    )
    script = render_batch_script(
        job_id=job_id,
        attempt=attempt_number,
        checkpoint_dir=checkpoint_dir,
        resume_from=checkpoint_dir if attempt_number > 1 else None,
        warning_signal_s=lead,
        **program,  # type: ignore[arg-type]
    )
    return SubmitRequest(
        script=script,
        partition=partition,
        job_name=slurm_name(key, attempt_number),
        comment=key,
        account=spec.group,
        user=owner_name if _daemon_is_root() else None,
        workdir=workdir,
        nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        time_limit_s=spec.time_limit_s,
        output=f"{workdir}/gbroker-{job_id}.out",
        requeue=capacity == Capacity.SPOT,
        env=dict(spec.env),
        signal=None if lead is None else f"B:USR1@{lead}",
    )


REFUSALS = (
    "invalid account",
    "invalid partition",
    "invalid qos",
    "not permitted",
    "access denied",
    "violates accounting/qos policy",
    "user not found",
)
"""Pre-flight answers that a real submission would get too (as opposed to "no nodes free right now")."""

PREFLIGHT_TTL = timedelta(minutes=10)
"""How long a passed `sbatch --test-only` vouches for the same user, account, partition and size."""


def preflight(svc: Services, caller: Caller, spec: JobSpec, partition: str, capacity: Capacity) -> None:
    """Let Slurm refuse a job it would refuse (wrong account, partition, size) before anything is stored.

    One `sbatch --test-only` as the user; a pass is remembered for a while, so a
    burst of submissions costs one check. Slurm unreachable: skip (the intent is
    stored and submitted later, as for any submission).
    """
    now = svc.clock.now()
    cache_key = (caller.name, spec.group, partition, spec.nodes, spec.gpus_per_node)
    cache: dict[tuple[object, ...], datetime] = svc.__dict__.setdefault("preflight_passed", {})
    if cache.get(cache_key, now) > now:
        return
    req = request_for(
        spec, job_id=0, key="gb-preflight", attempt_number=1, partition=partition, capacity=capacity,
        owner_name=caller.name,
    )
    try:
        svc.backend.check(req)
    except SlurmUnavailable:
        return
    except SlurmError as exc:
        if not any(marker in (exc.stderr or exc.message).lower() for marker in REFUSALS):
            # --test-only also fails when the nodes are merely busy or powering down right now;
            # a real submission would wait for them. Let sbatch decide.
            log.info("pre-flight for %s inconclusive: %s", caller.name, _slurm_reason(exc))
            return
        raise SpecError(
            f"Slurm refuses this job: {_slurm_reason(exc)}",
            hint=f"check --group (your Slurm account; `sacctmgr show assoc user={caller.name}` lists yours) "
            "and the size; nothing was submitted",
        ) from None
    cache[cache_key] = now + PREFLIGHT_TTL


def _slurm_reason(exc: SlurmError) -> str:
    lines = [ln.strip() for ln in (exc.stderr or exc.message).splitlines() if ln.strip()]
    return lines[-1].removeprefix("sbatch: error: ") if lines else exc.message


def _daemon_is_root() -> bool:
    import os

    return os.geteuid() == 0


def _check_can_submit(svc: Services, caller: Caller) -> None:
    import os

    if os.geteuid() != 0 and caller.uid != os.geteuid():
        raise PermissionDenied(
            f"this gbroker daemon runs as uid {os.geteuid()} and can only submit jobs for that user",
            hint="ask an admin to run the daemon as root so jobs run as their submitters",
        )
