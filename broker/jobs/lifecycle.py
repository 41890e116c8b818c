"""What happens to a job and its attempts: one named function per transition.

Each function moves the attempt (checked against ``ATTEMPT_ALLOWED`` in
``broker.states``), the job (through ``store.set_job_state``, checked against
``ALLOWED``), their times and the event together, so a state never changes
without the rest. Nothing else assigns a state (``tests/unit/test_lifecycle.py``
scans the tree); the callers decide *when*, from what Slurm shows. A move of
the job alone (seen waiting, held or unknown, given up) is one call of
``store.set_job_state`` and needs no function here.

A function that moves the job to a state it is in already only updates its
reason (as ``store.set_job_state`` does), so the reconcile tick may call it
at every tick.
"""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select, update
from sqlalchemy.orm import Session

from broker.db import store
from broker.db.models import Attempt, Job
from broker.db.store import IllegalTransition
from broker.db.array_models import ArrayPiece
from broker.states import (
    ATTEMPT_RUNNING,
    ATTEMPT_TERMINAL,
    PIECE_FINAL,
    AttemptState,
    JobState,
    PieceState,
    can_move_attempt,
    can_move_piece,
)
from policies import Capacity

MAX_CONTINUATIONS = 200
"""Runs a job may go on to by itself (time-limit continuations) before gbroker stops it."""


def _to(att: Attempt, state: AttemptState) -> None:
    old = AttemptState(att.state)
    if not can_move_attempt(old, state):
        raise IllegalTransition(
            f"attempt {att.number} of job {att.job_id}: cannot move from {old.value} to {state.value}",
            hint="this is a gbroker bug or a stale view of the job; reload it and retry",
        )
    att.state = state


def run_s(att: Attempt) -> int:
    """How long the attempt ran (0 when it has no start or no end yet)."""
    if att.started_at is None or att.ended_at is None:
        return 0
    return max(0, int((_utc(att.ended_at) - _utc(att.started_at)).total_seconds()))


def _utc(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


# -- an attempt on its way ------------------------------------------------------------
def attempt_submitted(s: Session, job: Job, att: Attempt, slurm_id: int, now: datetime) -> bool:
    """sbatch took the attempt as Slurm job ``slurm_id``: it is pending, and so is a job not yet in Slurm.

    False when the attempt was cancelled while its sbatch ran: it keeps its end,
    the Slurm id is recorded all the same, and the caller must cancel that
    Slurm job (nobody else knows of it).
    """
    att.slurm_job_id = slurm_id
    att.submitted_at = now
    wanted = AttemptState(att.state) not in ATTEMPT_TERMINAL
    if wanted:
        _to(att, AttemptState.PENDING)
        if job.state in (JobState.ADMITTED, JobState.RECOVERING, JobState.UNKNOWN):
            store.set_job_state(s, job, JobState.PENDING, _submitted_reason(slurm_id), now=now)
    store.add_event(s, "submitted", _submitted_message(att.number, slurm_id, att.partition), now=now, job_id=job.id)
    return wanted


def first_attempt_submitted(s: Session, job_id: int, attempt_id: int, slurm_id: int, now: datetime) -> Any | None:
    """``attempt_submitted`` for a job just submitted, as rows (nothing is loaded): the job
    still admitted and its attempt still submitting, both become pending. The job's row as
    it is now (for its summary); None, changing nothing, when they are not in those states
    (cancelled meanwhile, say): then load them and call ``attempt_submitted``."""
    conn = s.connection()
    row = conn.execute(_JOB_AND_ATTEMPT, {"job_id": job_id, "attempt_id": attempt_id}).one_or_none()
    if row is None or row.state != JobState.ADMITTED or row.attempt_state != AttemptState.SUBMITTING:
        return None
    assert can_move_attempt(AttemptState.SUBMITTING, AttemptState.PENDING)
    reason = _submitted_reason(slurm_id)
    conn.execute(_ATTEMPT_PENDING, {"attempt_id": attempt_id, "slurm_job_id": slurm_id, "submitted_at": now,
                                    "state": AttemptState.PENDING})
    conn.execute(_JOB_PENDING, {"job_id": job_id, "state": JobState.PENDING, "reason": reason, "updated_at": now})
    store.insert_events(s, [
        store.state_event_row(job_id, JobState.ADMITTED, JobState.PENDING, reason, now),
        store.event_row("submitted", _submitted_message(row.attempt_number, slurm_id, row.attempt_partition),
                        now=now, job_id=job_id),
    ])
    return SimpleNamespace(**{**row._asdict(), "state": JobState.PENDING, "reason": reason, "updated_at": now})


_jobs, _attempts = cast(Table, Job.__table__), cast(Table, Attempt.__table__)
_JOB_AND_ATTEMPT = (
    select(_jobs, _attempts.c.state.label("attempt_state"), _attempts.c.number.label("attempt_number"),
           _attempts.c.partition.label("attempt_partition"))
    .join_from(_jobs, _attempts, _attempts.c.job_id == _jobs.c.id)
    .where(_attempts.c.id == bindparam("attempt_id"), _jobs.c.id == bindparam("job_id"))
)
_ATTEMPT_PENDING = update(_attempts).where(_attempts.c.id == bindparam("attempt_id"))
_JOB_PENDING = update(_jobs).where(_jobs.c.id == bindparam("job_id"))
"""Made once (``first_attempt_submitted`` runs on every submission; the values come with each run)."""


def _submitted_reason(slurm_id: int) -> str:
    return f"Slurm job {slurm_id}"


def _submitted_message(number: int, slurm_id: int, partition: str | None) -> str:
    return f"attempt {number} is Slurm job {slurm_id} on {partition}"


def attempt_pending(att: Attempt) -> None:
    """Slurm lists the attempt as waiting: a submitting one is pending (one further along stays as it is)."""
    if att.state == AttemptState.SUBMITTING:
        _to(att, AttemptState.PENDING)


def attempt_running(s: Session, job: Job, att: Attempt, nodes: str, started_at: datetime, now: datetime) -> None:
    """Slurm shows the attempt running on ``nodes`` since ``started_at``; so does the job.

    Said once (a "running" event) when it starts; at later ticks only the start
    time (the real one, once the nodes have booted) and the job's reason follow
    Slurm. A moving attempt stays moving.
    """
    if att.started_at != started_at:
        att.started_at = started_at
    if att.state not in ATTEMPT_RUNNING:
        _to(att, AttemptState.RUNNING)
        att.nodes = nodes
        store.add_event(s, "running", f"attempt {att.number} runs on {att.nodes}", now=now, job_id=job.id)
    store.set_job_state(s, job, JobState.RUNNING, f"running on {nodes}", now=now)


def attempt_completing(s: Session, job: Job, att: Attempt, nodes: str, why: str, now: datetime) -> None:
    """Slurm is ending the attempt on ``nodes`` (COMPLETING): the job reads as completing, for ``why``.

    The attempt still holds its nodes (it stays running, and billed, until Slurm
    says how it ended); only the job's word changes, so that nobody reads a run
    Slurm has stopped as running. Said once (a "completing" event).
    """
    if att.state not in ATTEMPT_RUNNING:
        _to(att, AttemptState.RUNNING)
        att.nodes = nodes
    if job.state != JobState.COMPLETING:
        store.add_event(s, "completing", f"attempt {att.number} is ending on {nodes}: {why}", now=now, job_id=job.id)
    store.set_job_state(s, job, JobState.COMPLETING, f"completing on {nodes}: {why}", now=now)


def move_goal(capacity: Capacity) -> str:
    """Why gbroker moves a running job to ``capacity``, in the words of its events."""
    if capacity is Capacity.ONDEMAND:
        return "to meet the deadline"
    if capacity is Capacity.SPOT:
        return "back to spot, cheaper while it lasts"
    return "to run on capacity already paid for"


def attempt_moving(
    s: Session, job: Job, att: Attempt, partition: str, why: str, now: datetime,
    capacity: Capacity = Capacity.ONDEMAND,
) -> None:
    """gbroker requeues the running attempt onto ``partition`` (until Slurm has): to keep the
    deadline on on-demand, back to owned capacity that freed up, or from on-demand back to spot.
    The job is placed there now."""
    _to(att, AttemptState.MOVING)
    was = att.capacity.value if att.capacity is not None else "?"
    job.partition, job.capacity = partition, capacity
    goal = move_goal(capacity)
    store.add_event(s, "fallback", f"running on {was}; requeued to {partition} {goal} ({why})",
                    now=now, job_id=job.id)


def attempt_next(
    s: Session, job: Job, capacity: Capacity, partition: str, reason: str, now: datetime,
    *, slurm_run: tuple[int, int] | None = None,
) -> Attempt:
    """Open the job's next attempt on ``capacity``: the job recovers, placed there.

    ``slurm_run``: (Slurm job id, restart count) of the same Slurm job's next
    run, requeued by Slurm; the attempt is that run, already in the queue
    (pending). Without it the attempt waits for sbatch.
    """
    nxt = store.add_attempt(s, job, partition=partition, capacity=capacity, now=now)
    job.capacity, job.partition = capacity, partition
    store.set_job_state(s, job, JobState.RECOVERING, reason, now=now)
    if slurm_run is not None:
        nxt.slurm_job_id, nxt.slurm_restarts = slurm_run
        _to(nxt, AttemptState.PENDING)
    return nxt


def attempt_restarted(s: Session, job: Job, att: Attempt, nodes: str, started_at: datetime, now: datetime) -> None:
    """Slurm already runs the requeued job's next run when the last one is settled: the job runs again.

    No "running" event: the event of the run that ended says it goes on.
    """
    _to(att, AttemptState.RUNNING)
    att.started_at = started_at
    att.nodes = nodes
    store.set_job_state(s, job, JobState.RUNNING, f"running on {nodes}", now=now)


# -- an attempt that ended --------------------------------------------------------------
def attempt_ended(
    att: Attempt, state: AttemptState, *, ended_at: datetime | None = None, outcome: str | None = None,
    lost_s: int | None = None,
) -> None:
    """The attempt is over as ``state``; ``ended_at``, ``outcome`` and ``lost_s`` are set when given."""
    assert state in ATTEMPT_TERMINAL, state
    _to(att, state)
    if ended_at is not None:
        att.ended_at = ended_at
    if outcome is not None:
        att.outcome = outcome
    if lost_s is not None:
        att.lost_s = lost_s


def attempt_reclaimed(job: Job, att: Attempt, state: AttemptState) -> None:
    """The node was taken back (``RECLAIMED``) or Slurm preempted the run (``PREEMPTED``): one more reclaim.

    The event follows from the caller, once the policy has said what comes next.
    """
    attempt_ended(att, state)
    job.reclaims = (job.reclaims or 0) + 1


def attempt_moved(s: Session, job: Job, att: Attempt, partition: str, now: datetime) -> None:
    """Slurm requeued the moving attempt (our own requeue): it moved off spot; the next run is on ``partition``."""
    attempt_ended(att, AttemptState.MOVED)
    store.add_event(
        s, AttemptState.MOVED.value,
        f"attempt {att.number} moved off {att.nodes or 'spot'} ({att.lost_s}s of work since the checkpoint lost); "
        f"next run on {partition}",
        now=now, job_id=job.id,
    )


def attempt_lost(s: Session, job: Job, att: Attempt, why: str, lost_s: int, now: datetime) -> None:
    """Slurm lost the run itself: neither a reclaim nor the program's failure; the job runs again."""
    attempt_ended(att, AttemptState.LOST, outcome=f"lost by Slurm: {why}", lost_s=lost_s)
    store.add_event(s, AttemptState.LOST.value, f"attempt {att.number} on {att.nodes or '?'} was lost by Slurm "
                    f"({why}); it runs again on the same capacity", now=now, job_id=job.id)


BOOT_FAILED_EVENT = AttemptState.BOOT_FAILED.value
"""Event kind of a run whose node never came up (the metrics count it)."""


def attempt_boot_failed(s: Session, job: Job, att: Attempt, why: str, now: datetime) -> None:
    """The attempt's node never came up (``why``): the program never started.

    Not a reclaim (the job's reclaims stay as they are), no work lost, and the
    ledger charges the run nothing; the caller opens the next attempt.
    """
    attempt_ended(att, AttemptState.BOOT_FAILED, outcome=f"boot failure: {why}", lost_s=0)
    att.started_at = None  # accounting's start is the allocation: no run started (nor counts as spot exposure)
    store.add_event(s, BOOT_FAILED_EVENT, f"attempt {att.number}: {att.nodes or 'its node'} never came up ({why}); "
                    "the program never started, nothing lost or charged", now=now, job_id=job.id,
                    data={"nodes": att.nodes or ""})


def attempt_withdrawn(s: Session, job: Job, att: Attempt, now: datetime) -> None:
    """The attempt went back to the queue held before its program started (its group reached
    its budget while its nodes booted): nothing ran, nothing is lost or charged. The
    caller opens the next attempt, which waits held on the same Slurm job."""
    attempt_ended(att, AttemptState.WITHDRAWN, outcome="held at its group's budget before it started", lost_s=0)
    att.started_at = None  # accounting's start is the allocation: no run started
    store.add_event(s, AttemptState.WITHDRAWN.value,
                    f"attempt {att.number}: its group reached its budget while {att.nodes or 'its nodes'} booted; "
                    "back in the queue held before it started, nothing lost or charged", now=now, job_id=job.id)


def attempt_continued(s: Session, job: Job, att: Attempt, how: str, now: datetime, *, limit: bool = True) -> bool:
    """The program stopped to go on in a new run (``how``): its work is kept, nothing was lost.

    False when the job has gone on more than ``MAX_CONTINUATIONS`` times: it failed.
    ``limit=False`` for a run Slurm has already followed with the next one, out of
    the queue by now: the limit stops a loop still going, and the runs that did
    happen are each settled (and charged) as they ended.
    """
    attempt_ended(att, AttemptState.CONTINUED, outcome=how, lost_s=0)
    done = s.execute(
        select(func.count()).select_from(Attempt).where(Attempt.job_id == job.id,
                                                        Attempt.state == AttemptState.CONTINUED)
    ).scalar_one()
    if limit and done > MAX_CONTINUATIONS:
        store.set_job_state(s, job, JobState.FAILED, f"stopped after {done} runs that each asked to go on", now=now)
        return False
    store.add_event(s, AttemptState.CONTINUED.value,
                    f"attempt {att.number} on {att.nodes or '?'} ended to go on in a new run ({how})",
                    now=now, job_id=job.id)
    return True


def attempt_retried(s: Session, job: Job, att: Attempt, reason: str, now: datetime) -> Attempt:
    """The program failed and may run again: the attempt failed, the next one waits for sbatch where it ran."""
    attempt_ended(att, AttemptState.FAILED)
    nxt = store.add_attempt(s, job, partition=att.partition, capacity=att.capacity, now=now)
    store.set_job_state(s, job, JobState.RECOVERING, reason, now=now)
    return nxt


# -- a job that ended -------------------------------------------------------------------
def job_completed(s: Session, job: Job, att: Attempt, now: datetime) -> None:
    """The program exited 0: attempt and job completed, the job's work is the whole run."""
    attempt_ended(att, AttemptState.COMPLETED)
    job.done_s = max(job.done_s or 0, run_s(att))
    store.set_job_state(s, job, JobState.COMPLETED, "completed", now=now)


_ENDED_WITH = {
    JobState.FAILED: AttemptState.FAILED,
    JobState.CANCELLED: AttemptState.CANCELLED,
    JobState.TIMEOUT: AttemptState.TIMEOUT,
}


def job_ended(
    s: Session, job: Job, att: Attempt, state: JobState, why: str, now: datetime,
    *, ended_at: datetime | None = None, outcome: str | None = None,
) -> None:
    """The job ended with its attempt: failed, cancelled or timed out, both, for ``why``."""
    attempt_ended(att, _ENDED_WITH[state], ended_at=ended_at, outcome=outcome)
    store.set_job_state(s, job, state, why, now=now)


def job_cancelled(s: Session, job: Job, why: str, now: datetime) -> None:
    """The job was cancelled (by its owner or an admin): every attempt still going ends cancelled
    too, and so does every piece of an array not done yet."""
    for a in store.job_attempts(s, job.id):
        if a.state not in ATTEMPT_TERMINAL:
            attempt_ended(a, AttemptState.CANCELLED, ended_at=a.ended_at or now)
    pieces = s.execute(select(ArrayPiece).where(ArrayPiece.job_id == job.id,
                                                ArrayPiece.state.not_in(list(PIECE_FINAL)))).scalars()
    for p in pieces:
        piece_settled(p, PieceState.CANCELLED, why, now)
    store.set_job_state(s, job, JobState.CANCELLED, why, now=now)


# -- the pieces of an array -------------------------------------------------------------
def _piece_to(p: ArrayPiece, state: PieceState) -> None:
    old = PieceState(p.state)
    if not can_move_piece(old, state):
        raise IllegalTransition(
            f"piece {p.idx} of job {p.job_id}: cannot move from {old.value} to {state.value}",
            hint="this is a gbroker bug or a stale view of the job; reload it and retry",
        )
    p.state = state


def piece_seen(p: ArrayPiece, state: PieceState, now: datetime, *, nodes: str = "",
               started_at: datetime | None = None) -> bool:
    """The queue shows the piece's task waiting (PENDING) or running (RUNNING); True when that is news."""
    if p.state == state and (state != PieceState.RUNNING or (p.nodes == nodes and p.started_at == started_at)):
        return False
    _piece_to(p, state)
    if state == PieceState.RUNNING:
        p.nodes, p.started_at = nodes, started_at
    p.updated_at = now
    return True


def piece_settled(p: ArrayPiece, state: PieceState, reason: str, now: datetime) -> None:
    """The piece is done, failed for good, cancelled, or waits (WAITING) for a retry batch or Slurm's requeue."""
    _piece_to(p, state)
    p.reason = reason
    p.updated_at = now
    if state != PieceState.RUNNING:
        p.started_at = None


def piece_run_ended(
    s: Session, job: Job, p: ArrayPiece, *, slurm_id: int, run: int, partition: str | None, capacity: Capacity,
    state: AttemptState, nodes: str, started_at: datetime | None, ended_at: datetime | None,
    exit_code: int | None, lost_s: int, outcome: str, now: datetime,
) -> Attempt:
    """One run of a piece ended: it is recorded as an attempt of the array (the ledger charges it by
    ``slurm_id``, the task's own Slurm id, and ``run``), with the work it lost."""
    att = store.add_attempt(s, job, partition=partition, capacity=capacity, now=now)
    att.slurm_job_id, att.slurm_restarts = slurm_id, run
    att.nodes, att.started_at, att.exit_code = nodes, started_at, exit_code
    att.submitted_at = started_at or now
    attempt_ended(att, state, ended_at=ended_at or now, outcome=outcome, lost_s=lost_s)
    p.runs = run + 1
    p.exit_code = exit_code
    if state in (AttemptState.RECLAIMED, AttemptState.PREEMPTED):
        p.reclaims = (p.reclaims or 0) + 1
        job.reclaims = (job.reclaims or 0) + 1
    elif state in (AttemptState.FAILED, AttemptState.TIMEOUT):
        p.failures = (p.failures or 0) + 1
    return att


def array_moved(s: Session, job: Job, state: JobState, reason: str, now: datetime) -> None:
    """The array as a whole follows its pieces: pending, running, or ended (completed, failed, cancelled)."""
    if job.state != state or (job.reason or "") != reason:
        store.set_job_state(s, job, state, reason, now=now)
