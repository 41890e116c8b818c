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
import re
import secrets
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from broker import joblog, proc
from broker.amount import format_money
from broker.pieces import capped
from broker.caller import Caller
from broker.db import store
from broker.db.models import Attempt, Job
from broker.errors import NotFound, PermissionDenied, SlurmError, SlurmUnavailable, SpecError
from broker.money import totals
from broker.money.admission import admit
from broker.money.charging import billable_limit_s
from broker.state import Services, must_get
from broker.db.array_models import ArrayBatch
from broker.jobs import arrays, lifecycle
from broker.jobs.chains import chain_blocks, check_after
from broker.jobs.placement import fitting_pools, gres_type_for, job_view, place_in_pools, refused_by_limits
from broker.jobs.views import job_summary, summary_of
from broker.pools import Pool
from broker.slurm.backend import StartedSubmit, SubmitRequest
from broker.slurm.script import ArrayPart, render_batch_script
from broker.spec import WARNING_MARGIN_S, JobSpec, spec_from_dict
from broker.states import TERMINAL, JobState
from policies import Capacity

log = logging.getLogger(__name__)


KEY_RE = re.compile(r"^gb-[0-9a-z]{8,40}$")
"""A job key: made by the client (so a retry after a lost answer names the same job) or by the daemon."""


def new_key() -> str:
    return "gb-" + secrets.token_hex(6)


def slurm_name(key: str, attempt_number: int) -> str:
    """The Slurm job name of an sbatch made for `attempt_number` of job `key`."""
    return f"{key}-{attempt_number}"


def submit(svc: Services, caller: Caller, spec_data: Any, key: Any = None, log: Any = None) -> dict[str, Any]:
    """Admit and submit one job; with a key that names a job of the caller's, return that job.

    Everything that can refuse the job (the spec, the batch script and sbatch
    options, Slurm's pre-flight, the job log, quota and budget) runs before
    anything is stored: a refused submission leaves no row.

    ``log``: the job's log file, made by the client as the caller (``broker.joblog``);
    without one the daemon makes it, as the caller. The daemon never opens it.
    """
    now = svc.clock.now()
    key = _job_key(key)
    spec = _parse(svc, spec_data, now)
    again = _already_submitted(svc, caller, key, spec, now)
    if again is not None:
        return _with_cautions(again, spec)
    pool, placed_by, _ = _place_checked(svc, caller, spec, key, now)
    partition, capacity = pool.partition, pool.capacity
    workdir = default_workdir(spec, caller.name)
    made_here = log is None
    log_path = svc.files.create_log(caller.name, workdir, spec.name) if made_here else _given_log(log, workdir, spec)

    def first_request(job_id: int) -> SubmitRequest:
        return request_for(spec, job_id=job_id, key=key, attempt_number=1, partition=partition,
                           capacity=Capacity(capacity), owner_name=caller.name, log_path=log_path,
                           gres_type=gres_type_for(spec, pool))

    early: Early | None = None
    try:
        if not spec.after and not spec.is_array:
            early = start_sbatch(svc, first_request(0))
        try:
            job_id, attempt_id, note = _store_intent(svc, caller, spec, key, capacity, partition, placed_by,
                                                     log_path, now)
        except _KeyTaken:
            if made_here:
                svc.files.remove(caller.name, log_path)
            again = _already_submitted(svc, caller, key, spec, now)
            assert again is not None, "the key's job is gone"
            return _with_cautions(again, spec)
        except BaseException:
            if made_here:  # refused after all: leave nothing behind (a client removes the log it made)
                svc.files.remove(caller.name, log_path)
            raise
        svc.crash.reach("after_intent")
        plain = not spec.after and not spec.is_array
        answer = _submit_stored(svc, spec, job_id, attempt_id, note, now, early,
                                first_request(job_id) if plain else None)
        answer["log"] = log_path
        return _with_cautions(answer, spec)
    finally:
        if early is not None:
            early[1].abort()  # not given its script (refused, or the request changed): nothing is queued


def _parse(svc: Services, spec_data: Any, now: datetime) -> JobSpec:
    if not isinstance(spec_data, dict):
        raise SpecError("the job spec must be a table of fields")
    largest = svc.settings.catalog().largest_gpus_per_node()  # what the pools' nodes have, when they all say
    return spec_from_dict(
        spec_data,
        now=now,
        partitions=svc.settings.partitions,
        max_gpus_per_node=min(largest, svc.settings.max_gpus_per_node) if largest else svc.settings.max_gpus_per_node,
        max_nodes=svc.settings.max_nodes,
    )


def _place_checked(svc: Services, caller: Caller, spec: JobSpec, key: str, now: datetime,
                   *, fresh: bool = False) -> tuple[Pool, str, str]:
    """Place the job and check everything about it but money: (pool, who placed it and why,
    what Slurm's pre-flight said). ``fresh``: ask Slurm even when a like job passed lately."""
    _check_can_submit(svc, caller)
    pools = fitting_pools(svc, spec)  # none fits: refused here, with each pool's reason
    if spec.partition:
        pool, placed_by = pools[0], "user"
    else:
        pool, choice = place_in_pools(svc, spec, job_view(spec, now=now), pools)
        placed_by = f"{svc.policy.name}: {choice.reason}"
    # The whole sbatch request, validated now: nothing about it can fail after the intent.
    request_for(spec, job_id=0, key=key, attempt_number=1, partition=pool.partition,
                capacity=Capacity(pool.capacity), owner_name=caller.name, log_path="/dev/null",
                gres_type=gres_type_for(spec, pool), **_array_args(spec))
    if spec.after:
        with svc.sessions() as s:
            check_after(s, caller.uid, caller.is_admin, spec.after)
    slurm = preflight(svc, caller, spec, pool.partition, Capacity(pool.capacity), fresh=fresh)
    return pool, placed_by, slurm


def plan(svc: Services, caller: Caller, spec_data: Any) -> dict[str, Any]:
    """What ``submit`` would do with this request, doing none of it (``gbroker submit --dry-run``).

    The same checks in the same order (the spec, the pools that fit, the policy's choice,
    the sbatch request, Slurm's pre-flight as the caller, asked afresh, then membership,
    quota and budget), so a refusal reads exactly as the submission's would; nothing is
    stored, no log is made, nothing is reserved and nothing is queued.
    """
    now = svc.clock.now()
    spec = _parse(svc, spec_data, now)
    pool, placed_by, slurm = _place_checked(svc, caller, spec, "gb-dryrun0000", now, fresh=True)
    with svc.read() as s:
        admission = admit(s, svc, caller, spec, pool.capacity, pool.partition, now)
    budget = admission.budget
    answer: dict[str, Any] = {
        "dry_run": True,
        "name": spec.name,
        "user": caller.name,
        "group": spec.group,
        "pool": pool.name,
        "partition": pool.partition,
        "capacity": pool.capacity,
        "gpu_type": pool.gpu_type,
        "zone": pool.zone or None,
        "placed_by": placed_by,
        "gpus": spec.gpus,
        "tasks": len(spec.array().chunks()) if spec.is_array else 1,
        "pieces": len(spec.array().indices) if spec.is_array else None,
        "time_limit_s": spec.time_limit_s,
        "slurm_limit_s": billable_limit_s(spec.time_limit_s),
        "estimate_micros": admission.estimate_micros,
        "estimate": format_money(admission.estimate_micros),
        "estimates_micros": {c: v for c, v in admission.estimates},
        "estimates": {c: None if v is None else format_money(v) for c, v in admission.estimates},
        "budget": None if budget is None else {
            "semester": budget.semester, "amount_micros": budget.amount_micros,
            "spent_micros": budget.spent_micros, "reserved_micros": budget.reserved_micros,
            "left_after_micros": budget.left_micros - admission.reserved_micros,
            "amount": format_money(budget.amount_micros),
            "left_after": format_money(budget.left_micros - admission.reserved_micros),
        },
        "slurm": slurm,
    }
    skipped = refused_by_limits(svc, spec, svc.settings.catalog().pools)
    if skipped:  # placed elsewhere: say which pools' Slurm limits would never have started it
        answer["partition_limits"] = skipped
    if admission.note:
        answer["note"] = admission.note
    return _with_cautions(answer, spec)


def _with_cautions(answer: dict[str, Any], spec: JobSpec) -> dict[str, Any]:
    """The answer with what the request wrote that Slurm reads otherwise than people often mean
    (``JobSpec.cautions``: "1:30" is 90 seconds), so the user sees it at once."""
    if spec.cautions:
        answer["cautions"] = list(spec.cautions)
    return answer


Early = tuple[SubmitRequest, StartedSubmit]
"""An sbatch started before its intent was stored (``start_sbatch``) and the request it was started for."""


def start_sbatch(svc: Services, request: SubmitRequest) -> Early | None:
    """Start a plain job's sbatch (as the user) while its intent is being stored: sbatch
    starts up meanwhile and then waits for its script on stdin, which only
    ``sbatch_attempt`` writes, after the intent is committed (principle 4 holds: an
    sbatch without its script queues nothing; if the daemon dies first, the pipe
    closes and sbatch refuses the empty script). None when the backend cannot."""
    started = svc.backend.start_submit(request)
    return None if started is None else (request, started)


def _submit_stored(svc: Services, spec: JobSpec, job_id: int, attempt_id: int, note: str, now: datetime,
                   early: Early | None, request: SubmitRequest | None) -> dict[str, Any]:
    """Submit a stored job's first attempt (or leave a chain to the tick); the submit answer.

    ``request``: a plain job's first sbatch request, made from the spec in hand."""
    if spec.after:
        # A chain: the tick submits it once every job it waits for has completed (broker/jobs/chains.py).
        svc.sbatch_finished(arrays.claim_id(-attempt_id) if spec.is_array else attempt_id, committed=False)
        with svc.tx() as s:
            job = must_get(s, Job, job_id)
            why = chain_blocks(s, svc, job, now)
            result = job_summary(s, job, now)
        result["note"] = why or "submitted at the next tick"
        result["slurm_job_id"] = None
        return result
    answer: dict[str, Any] = {}
    try:
        if spec.is_array:
            slurm_id = sbatch_batch(svc, job_id, -attempt_id, claimed=True)
        else:
            slurm_id = sbatch_attempt(svc, job_id, attempt_id, claimed=True, early=early, request=request,
                                      summary_into=answer, now=now)
    except SlurmUnavailable as exc:
        slurm_id = None
        note = "Slurm is unreachable right now; the job is stored and will be submitted when it answers"
        log.warning("submit of job %s deferred: %s", job_id, exc)
    except SlurmError as exc:
        # The pre-flight passed but sbatch refused anyway (the cluster changed in between): say why.
        with svc.tx() as s:
            job = must_get(s, Job, job_id)
            store.set_job_state(s, job, JobState.FAILED, f"Slurm refused the job: {exc.stderr.strip()}", now=now)
        raise SpecError(
            f"Slurm refused the job: {_slurm_reason(exc)}",
            hint=f"check --group (your Slurm account) and the partition; job {job_id} is recorded as failed",
        ) from None
    if answer:
        result = answer  # made in the transaction that stored the Slurm job id
    else:
        with svc.read() as s:  # a read: waits for no writer
            result = job_summary(s, must_get(s, Job, job_id), now)
    if note:
        result["note"] = note
    result["slurm_job_id"] = slurm_id
    return result


def _given_log(log: Any, workdir: str, spec: JobSpec) -> str:
    """The log a client made for the job: only a name ``broker.joblog`` makes, in the job's workdir."""
    if not isinstance(log, str) or not joblog.is_log_name(log, workdir, spec.name):
        raise SpecError(
            f"log: {str(log)[:80]!r} is not a log made for job {spec.name} in {workdir}",
            hint=f"leave it out (gbroker makes the log), or name {joblog.mktemp_template(workdir, spec.name)}"
            f"{joblog.SUFFIX} with the Xs random letters or digits",
        )
    return log


def _job_key(key: Any) -> str:
    if key is None:
        return new_key()
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise SpecError(f"key: {str(key)[:60]!r} is not a job key",
                        hint="leave it out (gbroker makes one), or use 'gb-' and 8-40 lower-case letters or digits")
    return key


def _already_submitted(svc: Services, caller: Caller, key: str, spec: JobSpec, now: datetime) -> dict[str, Any] | None:
    """The job a retried submission (same key) made the first time, or None for a new key."""
    with svc.read() as s:
        if not store.key_is_stored(s, key):
            return None
        job = store.get_job_by_key(s, key)
        if job is None:
            return None
        store.check_same_request(job, caller.uid, store.spec_json(spec))
        result = job_summary(s, job, now)
        result["log"] = job.log_path
    result["note"] = "already submitted with this key: this is the job the first request made"
    return result


def _store_intent(
    svc: Services, caller: Caller, spec: JobSpec, key: str, capacity: str, partition: str, placed_by: str,
    log_path: str, now: datetime,
) -> tuple[int, int, str]:
    """Admission and the intent in one locked transaction; (job id, attempt id, admission note)."""
    with svc.tx() as s:
        admission = admit(s, svc, caller, spec, capacity, partition, now)
        if not spec.is_array:
            # A plain job: its rows are written as they are (no object is loaded; the submit
            # path's cost is mostly the ORM's, and nothing here needs the objects).
            new_id = store.insert_job(s, store.job_values(
                key=key, spec=spec, owner_uid=caller.uid, owner_name=caller.name, now=now, state=JobState.ADMITTED,
                placement_policy=svc.policy.name, capacity=Capacity(capacity), partition=partition,
                estimate_micros=admission.estimate_micros, reserved_micros=admission.reserved_micros, reason="",
                log_path=log_path,
            ))
            if new_id is None:
                raise _KeyTaken()  # stored meanwhile under this key (another daemon): answer with that job
            if admission.counted:
                totals.expect_job(s, spec.group, Capacity(capacity), partition, spec.gpus, admission.reserved_micros)
            attempt_id = store.insert_first_attempt(s, new_id, partition=partition, capacity=Capacity(capacity),
                                                    now=now)
            store.insert_events(s, [store.event_row("intent", f"place on {partition} ({placed_by}); sbatch next",
                                                    now=now, job_id=new_id)])
            _commit_claimed(svc, s, attempt_id)
            return new_id, attempt_id, admission.note
        # An array: its pieces and first batch; "attempt id" -batch id (batch claims are negative).
        job = store.create_job(
            s, key=key, spec=spec, owner_uid=caller.uid, owner_name=caller.name, placement_policy=svc.policy.name,
            capacity=Capacity(capacity), partition=partition, estimate_micros=admission.estimate_micros,
            reserved_micros=admission.reserved_micros, now=now, log_path=log_path,
        )
        batch = arrays.store_pieces(s, job, spec, partition, Capacity(capacity), now)
        count = len(spec.array().chunks())
        store.add_event(s, "intent", f"place {count} pieces on {partition} ({placed_by}); sbatch next",
                        now=now, job_id=job.id)
        _commit_claimed(svc, s, arrays.claim_id(batch.id))
        return job.id, -batch.id, admission.note


def _commit_claimed(svc: Services, s: Session, claim: int) -> None:
    """Commit the intent with its sbatch claimed before it is visible: a tick must not
    sbatch it as well (the transaction holds the service lock, so no tick reads in between)."""
    svc.claim_sbatch(claim)
    try:
        s.commit()
    except BaseException:
        svc.sbatch_finished(claim, committed=False)
        raise


class _KeyTaken(Exception):
    """The job key was stored between the check for it and the insert (by another daemon)."""


def stored_spec(job: Job) -> JobSpec:
    """The job's spec as stored at submit (checked again; a relative deadline was anchored then)."""
    return spec_from_dict(json.loads(job.spec_json))


def default_workdir(spec: JobSpec, owner_name: str) -> str:
    """Where a job runs: its workdir, else its owner's home (never a shared directory such as /tmp).

    A user this machine does not know has no home: "/", where nobody may write, so such a job
    is refused when its log cannot be made.
    """
    if spec.workdir:
        return spec.workdir
    try:
        return proc.identity(owner_name).home
    except NotFound:
        return "/"


def checkpoint_dir_for(spec: JobSpec, job_id: int, owner_name: str) -> str:
    """GBROKER_CHECKPOINT_DIR: the job's own, else ``<workdir>/.gbroker/<job id>``."""
    return spec.checkpoint_dir or f"{default_workdir(spec, owner_name).rstrip('/')}/.gbroker/{job_id}"


def checkpoint_dir_of(job: Job) -> str:
    return checkpoint_dir_for(stored_spec(job), job.id, job.owner_name)


def log_path_of(job: Job) -> str:
    """The job's log (jobs stored before logs were created at submit used ``gbroker-<id>.out``)."""
    return job.log_path or f"{default_workdir(stored_spec(job), job.owner_name).rstrip('/')}/gbroker-{job.id}.out"


def sbatch_attempt(svc: Services, job_id: int, attempt_id: int, *, claimed: bool = False,
                   early: Early | None = None, request: SubmitRequest | None = None,
                   summary_into: dict[str, Any] | None = None, now: datetime | None = None) -> int | None:
    """sbatch one stored attempt (state SUBMITTING) and record the Slurm job id.

    Exactly one caller sbatches an attempt: the submit that stored it (which
    claimed it already, `claimed=True`) or a reconcile tick. Returns the Slurm
    job id, or None when someone else is submitting it right now.

    ``early``: an sbatch the submit started before storing the intent; it gets the
    script when it was started for exactly this request, else it is aborted and
    sbatch runs as usual. ``request``: the attempt's request, when the caller (the
    submit that just stored the attempt) has it, so it is not read back and made
    again. ``summary_into``: filled with the job's summary (as of ``now``) in the
    transaction that records the Slurm job id.

    Raises SlurmUnavailable (the attempt stays SUBMITTING, to be adopted or
    retried by the reconcile tick) or SlurmError.
    """
    if not claimed and not svc.claim_sbatch(attempt_id):
        return None
    committed = False
    try:
        if request is None:
            with svc.read() as s:
                job = must_get(s, Job, job_id)
                attempt = must_get(s, Attempt, attempt_id)
                if attempt.slurm_job_id is not None:
                    return attempt.slurm_job_id  # already in Slurm (an earlier sbatch was committed)
                request = build_request(svc, job, attempt, stored_spec(job))
        if early is not None and replace(early[0], script=request.script) == request:
            slurm_id = early[1].finish(request.script)
        else:
            if early is not None:
                early[1].abort()
            slurm_id = svc.backend.submit(request)
        svc.crash.reach("after_sbatch")
        at = svc.clock.now()
        with svc.tx() as s:
            # The submit's own first attempt, as it usually finds it: by rows; else by objects.
            row = (lifecycle.first_attempt_submitted(s, job_id, attempt_id, slurm_id, at)
                   if summary_into is not None else None)
            if row is not None:
                totals.unchanged(s)  # admitted -> pending: the group's running totals stay as they are
                wanted = True
                summary_into.update(summary_of(row, attempts=1, slurm_job_id=slurm_id, now=now or at))  # type: ignore[union-attr]
            else:
                job = must_get(s, Job, job_id)
                wanted = lifecycle.attempt_submitted(s, job, must_get(s, Attempt, attempt_id), slurm_id, at)
                if summary_into is not None:
                    s.flush()
                    summary_into.update(job_summary(s, job, now or at))
        committed = True
    finally:
        svc.sbatch_finished(attempt_id, committed=committed)
    if not wanted:
        # Cancelled while sbatch ran: the cancel found no Slurm id to stop. This id is the
        # one our own sbatch (as the owner, clean environment) just answered for this attempt.
        log.info("job %s: cancelled during its sbatch; cancelling Slurm job %s", job_id, slurm_id)
        svc.backend.cancel([slurm_id])
    svc.crash.reach("after_commit")
    return slurm_id


def _array_args(spec: JobSpec) -> dict[str, Any]:
    """request_for's arguments for an array's first batch (none for a plain job)."""
    if not spec.is_array:
        return {}
    return {"array": arrays.array_part(spec), "array_indices": arrays.array_indices(spec)}


def array_request(svc: Services, job: Job, spec: JobSpec, batch: ArrayBatch) -> SubmitRequest:
    """The sbatch request of one batch of an array: its pieces' indices as one Slurm job array."""
    partition = batch.partition or svc.settings.partition_for(batch.capacity.value)
    return request_for(
        spec, job_id=job.id, key=job.key, attempt_number=batch.number, partition=partition,
        capacity=Capacity(batch.capacity), owner_name=job.owner_name, log_path=job.log_path,
        gres_type=gres_type_for(spec, svc.settings.pool_of(partition)),
        array=arrays.array_part(spec), array_indices=capped(batch.indices, spec.array().limit),
    )


def sbatch_batch(svc: Services, job_id: int, batch_id: int, *, claimed: bool = False) -> int | None:
    """sbatch one stored batch as one Slurm job array and record its id (as ``sbatch_attempt`` does for a job)."""
    cid = arrays.claim_id(batch_id)
    if not claimed and not svc.claim_sbatch(cid):
        return None
    committed = False
    try:
        with svc.sessions() as s:
            job = must_get(s, Job, job_id)
            batch = must_get(s, ArrayBatch, batch_id)
            if batch.slurm_array_id is not None:
                return batch.slurm_array_id
            spec = stored_spec(job)
            request = array_request(svc, job, spec, batch)
        slurm_id = svc.backend.submit(request)
        svc.crash.reach("after_sbatch")
        now = svc.clock.now()
        with svc.tx() as s:
            job = must_get(s, Job, job_id)
            batch = must_get(s, ArrayBatch, batch_id)
            batch.slurm_array_id, batch.submitted_at = slurm_id, now
            wanted = JobState(job.state) not in TERMINAL
            if wanted and job.state in (JobState.ADMITTED, JobState.UNKNOWN):
                lifecycle.array_moved(s, job, JobState.PENDING, f"Slurm job array {slurm_id}", now)
            store.add_event(s, "submitted", f"batch {batch.number} (pieces {batch.indices}) is Slurm job array "
                            f"{slurm_id} on {batch.partition}", now=now, job_id=job.id)
        committed = True
    finally:
        svc.sbatch_finished(cid, committed=committed)
    if not wanted:
        svc.backend.cancel([slurm_id])
    return slurm_id



def build_request(svc: Services, job: Job, attempt: Attempt, spec: JobSpec) -> SubmitRequest:
    partition = attempt.partition or svc.settings.partition_for(attempt.capacity.value)
    return request_for(
        spec,
        job_id=job.id,
        key=job.key,
        attempt_number=attempt.number,
        partition=partition,
        capacity=Capacity(attempt.capacity),
        owner_name=job.owner_name,
        log_path=job.log_path,
        gres_type=gres_type_for(spec, svc.settings.pool_of(partition)),
    )


def warning_lead_s(spec: JobSpec) -> int | None:
    """The warning lead to ask Slurm for, or None when the job asked for no warning or is too short.

    Only a job that asked for a warning gets one (``checkpoint.style =
    "signal"``, or ``warning_signal``): an unasked signal kills most programs.
    Slurm may send the warning up to a minute early; for a job whose time
    limit is within a minute of its lead, that can be before the batch script
    has installed its handler, and the signal would kill the job at its start.
    """
    if spec.warning_signal is None or spec.time_limit_s - spec.signal_lead_s < WARNING_MARGIN_S:
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
    log_path: str | None,
    gres_type: str | None = None,
    array: ArrayPart | None = None,
    array_indices: str | None = None,
) -> SubmitRequest:
    """The sbatch request for one attempt of ``spec``: its script, size, resources and options.

    ``gres_type`` is the GPU type to ask Slurm for (``--gres=gpu:TYPE:N``), the
    one of the pool the job is placed on; without it, a job that names exactly
    one type asks for that type, and any other job for untyped GPUs. The
    job's CPUs and memory (per GPU, per task or per node) go along as asked.
    """
    workdir = default_workdir(spec, owner_name)
    if gres_type is None and len(spec.gpu_types) == 1:
        gres_type = spec.gpu_types[0]
    lead = warning_lead_s(spec)
    checkpoint_dir = checkpoint_dir_for(spec, job_id, owner_name)
    program: dict[str, object] = (
        {"command": list(spec.command)} if spec.command else {"script_text": spec.script}
    )
    script = render_batch_script(
        job_id=job_id,
        attempt=attempt_number,
        checkpoint_dir=checkpoint_dir,
        resume_from=checkpoint_dir if attempt_number > 1 else None,
        warning_signal_s=lead,
        warning_signal=spec.warning_signal or "USR1",
        env=spec.env,
        array=array,
        **program,  # type: ignore[arg-type]
    )
    output = log_path or f"{workdir.rstrip('/')}/gbroker-{job_id}.out"
    if array_indices is not None:
        output = arrays.piece_log(output, "%a")  # a log per piece, next to the job's
    return SubmitRequest(
        script=script,
        partition=partition,
        job_name=arrays.batch_name(key, attempt_number) if array_indices is not None else slurm_name(key, attempt_number),
        comment=key,
        account=spec.group,
        user=owner_name if _daemon_is_root() else None,
        workdir=workdir,
        nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        time_limit_s=spec.time_limit_s,
        # Jobs stored before logs were made at submit keep their old name.
        output=output,
        # Every job may be requeued: by Slurm when its node fails, by gbroker to move it, by
        # the program itself to go on after its time limit (Lightning's auto_requeue).
        requeue=True,
        ntasks_per_node=spec.tasks,
        signal=None if lead is None else f"B:{spec.warning_signal}@{lead}",
        gres_type=gres_type,
        cpus_per_gpu=spec.cpus_per_gpu,
        cpus_per_task=spec.cpus_per_task,
        mem_mb=spec.mem_mb,
        mem_per_gpu_mb=spec.mem_per_gpu_mb,
        array=array_indices,
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
"""Pre-flight answers that a real submission would get too (as opposed to "no nodes free right now").

Not "requested node configuration is not available": --test-only says it also when the
partition's nodes are merely down or powering down, where a real submission would wait.
A request larger than a pool's nodes is refused earlier, by the catalog's fit."""

PREFLIGHT_TTL = timedelta(minutes=10)
"""How long a passed `sbatch --test-only` vouches for the same user, account, partition and size."""
PREFLIGHT_KEEP = 10_000
"""Passes remembered at most: past it, expired ones go, then the ones that expire soonest, down
to 90 % (a user who varies the size of every submission cannot grow the daemon's memory)."""


def remember_pass(cache: dict[tuple[object, ...], datetime], key: tuple[object, ...], now: datetime) -> None:
    """Note a pass. Submissions run in several threads: the cache is read from a snapshot
    (``list(dict.items())`` is one step under the GIL) and entries are popped, never iterated live."""
    cache[key] = now + PREFLIGHT_TTL
    if len(cache) <= PREFLIGHT_KEEP:
        return
    entries = list(cache.items())
    alive = [(until, k) for k, until in entries if until > now]
    alive.sort(key=lambda e: e[0])
    gone = [k for k, until in entries if until <= now]
    if len(alive) > PREFLIGHT_KEEP:  # down to 90 %, so the sort is paid once per 1,000 passes
        gone += [k for _, k in alive[: len(alive) - PREFLIGHT_KEEP * 9 // 10]]
    for k in gone:
        cache.pop(k, None)


def preflight(svc: Services, caller: Caller, spec: JobSpec, partition: str, capacity: Capacity,
              *, fresh: bool = False) -> str:
    """Let Slurm refuse a job it would refuse (wrong account, partition, size) before anything is stored.

    One `sbatch --test-only` as the user; a pass is remembered for a while, so a
    burst of submissions costs one check (``fresh``: ask anyway). Slurm unreachable:
    skip (the intent is stored and submitted later, as for any submission). Returns
    what was found, in words: passed, passed lately, unreachable, or inconclusive.
    """
    now = svc.clock.now()
    gres_type = gres_type_for(spec, svc.settings.pool_of(partition))
    cache_key = (caller.name, spec.group, partition, spec.nodes, spec.gpus_per_node, gres_type,
                 spec.cpus_per_gpu, spec.cpus_per_task, spec.mem_mb, spec.mem_per_gpu_mb)
    cache = svc.preflight_passed
    if not fresh and cache.get(cache_key, now) > now:
        return "accepted (a like job passed sbatch --test-only lately)"
    req = request_for(
        spec, job_id=0, key="gb-preflight", attempt_number=1, partition=partition, capacity=capacity,
        owner_name=caller.name, log_path="/dev/null", gres_type=gres_type, **_array_args(spec),
    )
    try:
        svc.backend.check(req)
    except SlurmUnavailable:
        return "not asked: Slurm is unreachable (a submission would be stored and queued when it answers)"
    except SlurmError as exc:
        if exc.hint and "directory" in exc.hint:
            raise SpecError(f"workdir {req.workdir}: {exc.message}", hint=exc.hint) from None
        if not any(marker in (exc.stderr or exc.message).lower() for marker in REFUSALS):
            # --test-only also fails when the nodes are merely busy or powering down right now;
            # a real submission would wait for them. Let sbatch decide.
            log.info("pre-flight for %s inconclusive: %s", caller.name, _slurm_reason(exc))
            return f"no refusal (sbatch --test-only: {_slurm_reason(exc)}; a submission waits for nodes)"
        if "invalid account" in (exc.stderr or exc.message).lower():
            raise SpecError(f"Slurm refuses this job: {_slurm_reason(exc)} (--group {spec.group})",
                            hint=_group_hint(svc, caller, spec.group)) from None
        raise SpecError(
            f"Slurm refuses this job: {_slurm_reason(exc)}",
            hint=f"check --group (your Slurm account; `sacctmgr show assoc user={caller.name}` lists yours) "
            "and the size; nothing was submitted",
        ) from None
    remember_pass(cache, cache_key, now)
    return f"accepted (sbatch --test-only as {caller.name})"


def _group_hint(svc: Services, caller: Caller, group: str) -> str:
    """What to give as --group instead: the caller's lab groups, the closest first."""
    from difflib import get_close_matches

    from broker.money.budgets import visible_groups

    with svc.sessions() as s:
        mine = [g.name for g in visible_groups(s, caller)]
    close = get_close_matches(group, mine, n=1, cutoff=0.6)
    listed = f"your groups: {', '.join(mine[:20])}; " if mine else ""
    return ((f"did you mean --group {close[0]}? " if close else "") + listed
            + f"`sacctmgr show assoc user={caller.name} format=account` lists your Slurm accounts; "
            "nothing was submitted")


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
