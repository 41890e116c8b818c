"""Arrays: one gbroker job, one Slurm job array, a state per piece.

An array job (``pieces = "1-400"``, ``--array``, or a sweep file) is stored
with a row per piece (one Slurm array task: a chunk of indices) and a batch
per Slurm array submitted for it. The first batch holds every piece; a piece
that fails on its own is retried, up to ``max_retries``, in a later batch
that holds only the pieces to retry. A piece whose node is reclaimed is
requeued by Slurm itself (every gbroker job may be requeued), in the same
task: only the pieces that ran on that node run again, the finished ones
never do.

The reconcile tick reads the queue once for every job (a row per started
task, one row for an array's tasks not started yet) and calls
:func:`reconcile_arrays` with it. An array whose tasks the queue shows
exactly as at the last tick that settled it is skipped without reading its
pieces (``Services.array_seen``), so a tick over a hundred arrays of a
thousand waiting tasks costs the one ``squeue`` and a pass over the listing.
The arrays that changed are followed together in one pass (``_follow``): a
fixed number of statements and one savepoint, however many changed. Tasks that left the queue, or were
requeued, are read from accounting with one ``sacct --duplicates`` for all
arrays together (their task names, ``123_7``, tell the pieces apart). Each
ended run becomes an attempt of the job with the task's own Slurm id, so the
ledger charges it like any run: useful when it completed or failed, lost
when its node was taken. At its group's budget the ledger holds the array's
Slurm arrays (``budget_held`` here: no retry batch is submitted meanwhile).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, exists, func, select, text
from sqlalchemy.orm import Session, lazyload

from broker.db import store
from broker.db.array_models import ArrayBatch, ArrayPiece
from broker.db.ledger_models import BudgetHold
from broker.db.models import Job
from broker.errors import SlurmUnavailable
from broker.jobs import lifecycle
from broker.jobs.chains import chain_blocks
from broker.jobs.placement import job_view, market_view
from broker.ownership import is_ours
from broker.pieces import Pieces, PiecesError, compress, parse_pieces, progress_line, slurm_array
from broker.slurm.backend import ArrayRow, SlurmJob
from broker.slurm.script import ArrayPart
from broker.slurm.statemap import normalize_job_state
from broker.spec import JobSpec, spec_from_dict
from broker.state import Services, must_get
from broker.states import ATTEMPT_TERMINAL, BUDGET_HELD, PIECE_FINAL, TERMINAL, AttemptState, JobState, PieceState
from policies import Action, Capacity

log = logging.getLogger(__name__)

BATCH_CLAIM_BASE = -1
"""Batches are claimed for sbatch under negative ids (attempt ids are positive)."""


def batch_name(key: str, number: int) -> str:
    """The Slurm job name of batch ``number`` of array ``key``."""
    return f"{key}-a{number}"


def claim_id(batch_id: int) -> int:
    return BATCH_CLAIM_BASE - batch_id


def is_array(s: Session, job_id: int) -> bool:
    return s.execute(select(exists().where(ArrayBatch.job_id == job_id))).scalar_one()


def not_an_array() -> Any:
    """A WHERE clause for jobs that are not arrays (the single-job reconcile path)."""
    return ~exists().where(ArrayBatch.job_id == Job.id)


def array_part(spec: JobSpec, pieces: Pieces | None = None) -> ArrayPart:
    """What the batch script of ``spec``'s tasks needs: chunk ends, the step, a sweep's arguments."""
    pieces = pieces or spec.array()
    lasts = tuple((a, b) for a, b in pieces.chunks() if a != b)
    sweep = tuple((i, args) for i, args in zip(pieces.indices, spec.sweep, strict=False)) if spec.sweep else ()
    return ArrayPart(step=pieces.step, lasts=lasts, sweep=sweep, own_checkpoint=spec.checkpoint_style != "pieces")


def piece_log(log_path: str, index: int | str) -> str:
    """The log of one piece, next to the job's log: ``gbroker-x-AbCdEf.piece-7.out`` (``%a`` for Slurm)."""
    base = log_path[:-4] if log_path.endswith(".out") else log_path
    return f"{base}.piece-{index}.out"


# -- submission ----------------------------------------------------------------------
def store_pieces(s: Session, job: Job, spec: JobSpec, partition: str, capacity: Capacity, now: datetime) -> ArrayBatch:
    """The pieces of a new array and its first batch (all of them), before any sbatch."""
    pieces = spec.array()
    chunks = pieces.chunks()
    s.add_all([ArrayPiece(job_id=job.id, idx=a, last=b, state=PieceState.WAITING, batch=1, runs=0, failures=0,
                          reclaims=0, nodes="", reason="", updated_at=now) for a, b in chunks])
    batch = ArrayBatch(job_id=job.id, number=1, indices=compress(a for a, _ in chunks), partition=partition,
                       capacity=capacity, created_at=now)
    s.add(batch)
    s.flush()
    return batch


# -- the tick --------------------------------------------------------------------------
@dataclass
class ArrayPlan:
    start_now: list[int] = field(default_factory=list)
    """Requeued tasks (their own Slurm ids) to start without Slurm's requeue delay."""
    sbatch: list[tuple[int, int]] = field(default_factory=list)
    """(job id, batch id) to submit."""
    move: list[tuple[int, str]] = field(default_factory=list)
    """(task's own Slurm id, partition): requeued tasks the policy sends to another pool."""


def stored_spec(job: Job) -> JobSpec:
    """The job's spec as stored at submit (``broker.jobs.submit.stored_spec``, which imports this module)."""
    return spec_from_dict(json.loads(job.spec_json))


def _utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _digest(tasks: list[SlurmJob]) -> int:
    h = hashlib.blake2b(digest_size=8)
    for t in tasks:
        h.update(f"{t.array_task}|{t.state_raw}|{t.restarts}|{','.join(t.nodes)}|{t.reason}\n".encode())
    return int.from_bytes(h.digest(), "big")


def reconcile_arrays(svc: Services, queue: list[SlurmJob], now: datetime, listed_at: float) -> ArrayPlan:
    """Follow every active array with the tick's one queue listing; settle ended runs with one sacct.

    Returns the Slurm actions to take after the commit (``broker.jobs.reconcile`` takes them)."""
    tasks: dict[int, list[SlurmJob]] = {}
    by_name: dict[str, list[int]] = {}
    for j in queue:
        if j.array_job_id is not None and (j.array_task is not None or j.array_tasks is not None):
            tasks.setdefault(j.array_job_id, []).append(j)
            ids = by_name.setdefault(j.name, [])  # anyone may name an array gb-...: every one is kept
            if j.array_job_id not in ids:
                ids.append(j.array_job_id)
    plan = ArrayPlan()
    need: dict[int, list[int]] = {}
    """array job id -> Slurm array ids whose tasks must be read from accounting."""
    with svc.tx() as s:
        jobs = list(s.execute(
            select(Job).where(Job.state.not_in(list(TERMINAL)), exists().where(ArrayBatch.job_id == Job.id))
            .order_by(Job.id).options(lazyload(Job.attempts))  # an array's runs are many; not needed here
        ).scalars())
        live = {j.id for j in jobs}
        for jid in [j for j in svc.array_seen if j not in live]:
            del svc.array_seen[jid]
        if not jobs:
            return plan
        batches: dict[int, list[ArrayBatch]] = {}
        for b in s.execute(select(ArrayBatch).where(ArrayBatch.job_id.in_(live)).order_by(ArrayBatch.number)
                           ).scalars():
            batches.setdefault(b.job_id, []).append(b)
        held = budget_held(s, list(live))
        todo: list[_Todo] = []
        for job in jobs:
            mine = batches.get(job.id, [])
            if any(svc.sbatch_busy(claim_id(b.id), since=listed_at) for b in mine):
                continue
            seen = [t for b in mine if b.slurm_array_id is not None for t in tasks.get(b.slurm_array_id, [])]
            digest = _digest(seen)
            unsent = [b for b in mine if b.slurm_array_id is None]
            if svc.array_seen.get(job.id) == digest and not unsent:
                continue  # the queue shows it as it did when it was last settled
            todo.append(_Todo(job, mine, digest, job.id in held))
        # Every changed array in one pass: a handful of statements for all of them, one savepoint.
        # Only when that pass fails is each array followed on its own, so one bad array cannot
        # stop everyone's tick.
        done: list[_Followed] = []
        if todo:
            try:
                with s.begin_nested():
                    done = [_follow(s, svc, todo, tasks, by_name, now)]
            except Exception as exc:  # noqa: BLE001 - one bad array must not stop everyone's tick
                log.warning("arrays: the tick's pass over %d arrays failed (%s); following each on its own",
                            len(todo), exc)
                done = []
                for item in todo:
                    try:
                        with s.begin_nested():
                            done.append(_follow(s, svc, [item], tasks, by_name, now))
                    except Exception as exc1:  # noqa: BLE001
                        log.exception("array job %s: %s", item.job.id, exc1)
                        svc.array_seen.pop(item.job.id, None)
        for f in done:
            plan.sbatch.extend(f.plan.sbatch)
            plan.start_now.extend(f.plan.start_now)
            plan.move.extend(f.plan.move)
            need.update(f.need)
            for jid, remembered in f.settled.items():
                if remembered is not None:
                    svc.array_seen[jid] = remembered
                else:
                    svc.array_seen.pop(jid, None)
    if need:
        try:
            rows = svc.backend.array_history(sorted({a for ids in need.values() for a in ids}))
        except SlurmUnavailable as exc:
            svc.slurm_down(now, str(exc))
            return ArrayPlan()
        runs: dict[tuple[int, int], list[ArrayRow]] = {}
        for r in rows:
            runs.setdefault((r.array_id, r.task), []).append(r)
        with svc.tx() as s:
            held = budget_held(s, list(need))
            for job_id in need:
                job = must_get(s, Job, job_id)
                try:
                    with s.begin_nested():
                        _settle(s, svc, job, tasks, runs, now, plan, job_id in held)
                except Exception as exc:  # noqa: BLE001
                    log.exception("array job %s: %s", job.id, exc)
                    svc.array_seen.pop(job.id, None)
    return plan


@dataclass
class _Todo:
    """An array the queue shows otherwise than when it was last settled."""

    job: Job
    batches: list[ArrayBatch]
    digest: int
    held: bool
    """Its group is at its budget: gbroker holds its pending pieces and submits no retry batch."""


@dataclass
class _Followed:
    """What one pass over some arrays decided, kept only when the whole pass went through."""

    plan: ArrayPlan = field(default_factory=ArrayPlan)
    need: dict[int, list[int]] = field(default_factory=dict)
    settled: dict[int, int | None] = field(default_factory=dict)
    """job id -> its digest when nothing is left for accounting to tell, None when something is."""


@dataclass
class _Listed:
    """One array's tasks in the queue: a row per started task, ranges for the tasks not started."""

    alone: dict[tuple[int, int], tuple[int, SlurmJob]] = field(default_factory=dict)
    """(Slurm array id, index) -> (row position, its row)."""
    spans: dict[int, list[tuple[int, int, int, SlurmJob]]] = field(default_factory=dict)
    """Slurm array id -> (first, last, row position, the row) of runs of tasks not started."""

    def get(self, array_id: int, idx: int) -> SlurmJob | None:
        """The row that shows the task, the later one when two do (as a dict filled in order would)."""
        best = self.alone.get((array_id, idx))
        for lo, hi, pos, t in self.spans.get(array_id, ()):
            if lo <= idx <= hi and (best is None or pos > best[0]):
                best = (pos, t)
        return best[1] if best is not None else None

    def runs(self, array_id: int) -> list[tuple[int, int]]:
        """Every index the queue shows for the array, as disjoint runs."""
        idx = {i for a, i in self.alone if a == array_id}
        spans = [(lo, hi) for lo, hi, _, _ in self.spans.get(array_id, ())]
        return _merge([(i, i) for i in idx] + spans)


def _merge(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(runs):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _runs_of(indices: tuple[int, ...]) -> list[tuple[int, int]]:
    """Indices as runs of consecutive ones, in order."""
    return _merge([(i, i) for i in indices])


def _task_runs(expr: str) -> list[tuple[int, int]]:
    """The runs of squeue's row of tasks not started yet: ``17-1000%64`` is one run, read without
    listing its indices; anything with a step goes through the grammar (:func:`_indices`)."""
    body = expr.split("%", 1)[0]
    runs: list[tuple[int, int]] = []
    for part in body.split(","):
        lo, sep, hi = part.partition("-")
        if not (lo.isdigit() and (not sep or hi.isdigit())):
            return _runs_of(_indices(expr))
        runs.append((int(lo), int(hi) if sep else int(lo)))
    return _merge(runs)


def _indices(expr: str) -> tuple[int, ...]:
    """The indices of squeue's row of tasks not started yet (``5-29:2``, ``1,3,8-10``)."""
    try:
        return parse_pieces(expr).indices
    except PiecesError:
        log.warning("unreadable array tasks %r in squeue; they are asked about again", expr)
        return ()


def _pieces(s: Session, job_id: int) -> list[ArrayPiece]:
    return list(s.execute(select(ArrayPiece).where(ArrayPiece.job_id == job_id).order_by(ArrayPiece.idx)).scalars())


ROWS_PER_STATEMENT = 2000
"""Runs of indices sent in one statement (four parameters each: far under SQLite's 32,766)."""

_PENDING_IN_GAPS = (
    "SELECT DISTINCT l.job_id, l.batch FROM listed l JOIN array_pieces p"
    " ON p.job_id = l.job_id AND p.state = :pending AND p.idx >= l.lo AND p.idx <= l.hi WHERE p.batch = l.batch"
)
_ALONE_PENDING = (
    "SELECT p.id, p.job_id, p.idx, p.state, p.batch, p.runs, p.nodes FROM listed l JOIN array_pieces p"
    " ON p.job_id = l.job_id AND p.state = :pending AND p.idx >= l.lo AND p.idx <= l.hi"
)
FAR = 2**31 - 1
"""Beyond any index (a 32-bit integer, as the column): the open ends of the ranges the queue does not show."""


def _gaps(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The indices outside these disjoint, sorted runs, as ranges (the open ends up to ``FAR``)."""
    out, at = [], -FAR
    for lo, hi in runs:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    out.append((at, FAR))
    return out


def _with_listed(sql: str, rows: list[tuple[int, int, int, int]]) -> tuple[Any, dict[str, Any]]:
    """``sql`` over a table ``listed(job_id, batch, lo, hi)`` of these rows (a VALUES list)."""
    params: dict[str, Any] = {}
    values = []
    for n, (jid, batch, lo, hi) in enumerate(rows):
        params.update({f"j{n}": jid, f"b{n}": batch, f"l{n}": lo, f"h{n}": hi})
        if n == 0:  # typed once, so every database reads the columns as integers
            values.append(f"(CAST(:j{n} AS INTEGER), CAST(:b{n} AS INTEGER), CAST(:l{n} AS INTEGER), "
                          f"CAST(:h{n} AS INTEGER))")
        else:
            values.append(f"(:j{n}, :b{n}, :l{n}, :h{n})")
    return text(f"WITH listed(job_id, batch, lo, hi) AS (VALUES {', '.join(values)}) {sql}"), params


def _chunks(rows: list[tuple[int, int, int, int]]) -> list[list[tuple[int, int, int, int]]]:
    return [rows[i:i + ROWS_PER_STATEMENT] for i in range(0, len(rows), ROWS_PER_STATEMENT)]


def _follow(
    s: Session, svc: Services, todo: list[_Todo], tasks: dict[int, list[SlurmJob]], by_name: dict[str, list[int]],
    now: datetime,
) -> _Followed:
    """Follow the queue for these arrays together, then move each array's own state.

    The pieces the queue shows waiting, as they are stored, need nothing and are not read:
    the database counts, per batch, the stored waiting pieces and those among the indices the
    queue shows; a batch where these differ has tasks that left the queue unseen, and accounting
    says how they ended. The other pieces (running, waiting for a batch) and the waiting ones the
    queue shows started are read as plain values, for every array in one query each; only those
    whose state the queue shows otherwise are loaded as rows and changed."""
    out = _Followed()
    conn = s.connection()
    pending, running = PieceState.PENDING.value, PieceState.RUNNING.value
    follow: list[tuple[_Todo, dict[int, int | None], _Listed]] = []
    for item in todo:
        job, batches = item.job, item.batches
        in_slurm = True
        for b in batches:
            if b.slurm_array_id is None:
                found = next((a for a in by_name.get(batch_name(job.key, b.number), [])
                              if any(is_ours(job.key, job.owner_name, name=t.name, comment=t.comment, user=t.user)
                                     for t in tasks.get(a, []))), None)
                if found is not None:
                    b.slurm_array_id, b.submitted_at = found, b.submitted_at or now
                    store.add_event(s, "adopted", f"found Slurm job array {found} by key after a restart",
                                    now=now, job_id=job.id)
                elif b.number == 1:
                    blocked = chain_blocks(s, svc, job, now)
                    if blocked is None:
                        out.plan.sbatch.append((job.id, b.id))
                    in_slurm = False  # not in Slurm yet: nothing to follow
                    break
                elif not item.held:  # a held array gets no new batch until its budget allows again
                    out.plan.sbatch.append((job.id, b.id))
        if not in_slurm:
            out.settled[job.id] = None
            continue
        listed = _Listed()
        pos = 0
        for b in batches:
            if b.slurm_array_id is None:
                continue
            for t in tasks.get(b.slurm_array_id, []):
                pos += 1
                if not is_ours(job.key, job.owner_name, name=t.name, comment=t.comment, user=t.user):
                    continue
                if t.array_task is not None:
                    listed.alone[(b.slurm_array_id, t.array_task)] = (pos, t)
                elif t.array_tasks is not None:  # tasks not started yet, one row for all of them
                    spans = listed.spans.setdefault(b.slurm_array_id, [])
                    spans.extend((lo, hi, pos, t) for lo, hi in _task_runs(t.array_tasks))
        follow.append((item, {b.number: b.slurm_array_id for b in batches}, listed))
    if not follow:
        return out
    s.flush()  # adopted batches
    ids = [item.job.id for item, _, _ in follow]
    ask: dict[int, set[int]] = {jid: set() for jid in ids}
    # Stored waiting pieces of a batch outside the indices the queue shows for it.
    gap_rows: list[tuple[int, int, int, int]] = []
    alone_rows: list[tuple[int, int, int, int]] = []
    for item, number, listed in follow:
        for n, array_id in number.items():
            if array_id is not None:
                gap_rows.extend((item.job.id, n, lo, hi) for lo, hi in _gaps(listed.runs(array_id)))
        # A started task's piece, stored as waiting, in whichever batch (the queue decides below).
        alone = tuple(i for (a, i), (_p, t) in listed.alone.items() if listed.get(a, i) is t)
        alone_rows.extend((item.job.id, 0, lo, hi) for lo, hi in _runs_of(alone))
    numbers = {item.job.id: number for item, number, _ in follow}
    for chunk in _chunks(gap_rows):
        sql, params = _with_listed(_PENDING_IN_GAPS, chunk)
        for jid, batch in conn.execute(sql, {**params, "pending": pending}):
            array_id = numbers[int(jid)].get(int(batch))
            if array_id is not None:
                ask[int(jid)].add(array_id)  # never seen running, and gone: accounting says how it ended
    rows: dict[int, list[tuple[int, int, str, int, int, str]]] = {jid: [] for jid in ids}
    others = [x.value for x in PieceState if x not in PIECE_FINAL and x != PieceState.PENDING]
    for pid, jid, idx, state, batch, runs, nodes in conn.execute(OTHERS_SQL, {"ids": ids, "states": others}):
        rows[int(jid)].append((pid, idx, state, batch, runs, nodes))
    for chunk in _chunks(alone_rows):
        sql, params = _with_listed(_ALONE_PENDING, chunk)
        for pid, jid, idx, state, batch, runs, nodes in conn.execute(sql, {**params, "pending": pending}):
            rows[int(jid)].append((pid, idx, state, batch, runs, nodes))
    change: dict[int, tuple[PieceState, SlurmJob]] = {}
    for item, number, listed in follow:
        job = item.job
        mine = ask[job.id]
        for pid, idx, state, batch, runs, nodes in rows[job.id]:
            array_id = number.get(batch)
            if array_id is None:
                continue  # its batch is not in Slurm yet
            sj = listed.get(array_id, idx)
            if sj is None:
                mine.add(array_id)  # left the queue: accounting says how it ended
                continue
            if sj.restarts > runs or (sj.array_tasks is not None and state == running):
                # Requeued: the run before ended (a reclaim, most often). A requeued task that waits
                # is listed in its array's row of tasks not started (with that row's restart count).
                mine.add(array_id)
                continue
            if sj.state == AttemptState.RUNNING and sj.state_raw != "CONFIGURING":
                if state != running or nodes != ",".join(sj.nodes):
                    change[pid] = (PieceState.RUNNING, sj)
            elif sj.state in (AttemptState.PENDING, AttemptState.RUNNING):
                if state not in (running, pending):
                    change[pid] = (PieceState.PENDING, sj)
                if sj.reason == "BeginTime" and sj.restarts > 0 and sj.array_task is not None:
                    out.plan.start_now.append(sj.job_id)  # Slurm's requeue delay: gbroker asks for none
        if mine:
            out.need[job.id] = sorted(mine)
        out.settled[job.id] = None if mine else item.digest
    if change:
        keys = list(change)
        for i in range(0, len(keys), ROWS_PER_STATEMENT):
            for p in s.execute(select(ArrayPiece).where(ArrayPiece.id.in_(keys[i:i + ROWS_PER_STATEMENT]))
                               ).scalars():
                to, sj = change[p.id]
                if to == PieceState.RUNNING:
                    lifecycle.piece_seen(p, PieceState.RUNNING, now, nodes=",".join(sj.nodes),
                                         started_at=_utc(sj.start_time) or now)
                else:
                    lifecycle.piece_seen(p, PieceState.PENDING, now)
    s.flush()
    all_counts = counts_of(s, ids)
    for item, _, _ in follow:
        _progress(s, svc, item.job, now, all_counts.get(item.job.id, {}), held=item.held)
    s.flush()
    return out


OTHERS_SQL = text(
    "SELECT id, job_id, idx, state, batch, runs, nodes FROM array_pieces WHERE job_id IN :ids AND state IN :states"
).bindparams(bindparam("ids", expanding=True), bindparam("states", expanding=True))


STATE_OF_RUN = {
    "COMPLETED": AttemptState.COMPLETED,
    "FAILED": AttemptState.FAILED,
    "OUT_OF_MEMORY": AttemptState.FAILED,
    "TIMEOUT": AttemptState.TIMEOUT,
    "CANCELLED": AttemptState.CANCELLED,
    "NODE_FAIL": AttemptState.RECLAIMED,
    "PREEMPTED": AttemptState.PREEMPTED,
    "BOOT_FAIL": AttemptState.LOST,
    "REQUEUED": AttemptState.LOST,
    "DEADLINE": AttemptState.TIMEOUT,
}


def _settle(
    s: Session, svc: Services, job: Job, tasks: dict[int, list[SlurmJob]],
    runs: dict[tuple[int, int], list[ArrayRow]], now: datetime, plan: ArrayPlan, held: bool = False,
) -> None:
    """Record every ended run of the array's pieces, move each piece on, plan the retries."""
    spec = stored_spec(job)
    batches = {b.number: b for b in s.execute(select(ArrayBatch).where(ArrayBatch.job_id == job.id)).scalars()}
    requeued: list[tuple[ArrayPiece, int, str]] = []
    in_queue = {(t.array_job_id, t.array_task) for ts in tasks.values() for t in ts if t.array_task is not None}
    in_queue |= {(t.array_job_id, i) for ts in tasks.values() for t in ts if t.array_tasks is not None
                 for i in _indices(t.array_tasks)}
    retry: list[ArrayPiece] = []
    for p in _pieces(s, job.id):
        if p.state in PIECE_FINAL:
            continue
        b = batches.get(p.batch)
        if b is None or b.slurm_array_id is None:
            continue
        ordered = sorted((r for r in runs.get((b.slurm_array_id, p.idx), [])
                          if is_ours(job.key, job.owner_name, name=r.row.name, comment=r.row.comment,
                                     user=r.row.user)), key=lambda r: r.row.restarts)
        last_state: AttemptState | None = None
        for r in ordered:
            row = r.row
            if row.restarts < p.runs or row.end is None or row.state not in ATTEMPT_TERMINAL:
                continue
            state = STATE_OF_RUN.get(normalize_job_state(row.state_raw), row.state)
            run_s = max(0, row.elapsed_s)
            lost = run_s if state in (AttemptState.RECLAIMED, AttemptState.PREEMPTED, AttemptState.LOST) else 0
            outcome = {AttemptState.COMPLETED: "completed", AttemptState.RECLAIMED: "its node was reclaimed",
                       AttemptState.PREEMPTED: "preempted"}.get(state, f"{row.state_raw}, exit {row.exit_code}")
            lifecycle.piece_run_ended(
                s, job, p, slurm_id=row.job_id, run=row.restarts, partition=row.partition or b.partition,
                capacity=Capacity(svc.settings.capacity_of(row.partition) or b.capacity.value),
                state=state, nodes=",".join(row.nodelist), started_at=_utc(row.start), ended_at=_utc(row.end),
                exit_code=row.exit_code, lost_s=lost, outcome=f"piece {p.idx}: {outcome}", now=now,
            )
            if state in (AttemptState.RECLAIMED, AttemptState.PREEMPTED, AttemptState.LOST):
                store.add_event(s, "reclaimed", f"piece {p.idx} lost its run on {','.join(row.nodelist) or '?'} "
                                f"({row.state_raw}, {lost}s of work lost); Slurm requeues it", now=now,
                                job_id=job.id)
            last_state = state
        if last_state is None:
            continue
        queued = (b.slurm_array_id, p.idx) in in_queue
        if last_state == AttemptState.COMPLETED:
            lifecycle.piece_settled(p, PieceState.DONE, "completed", now)
        elif last_state in (AttemptState.RECLAIMED, AttemptState.PREEMPTED, AttemptState.LOST):
            if queued:
                lifecycle.piece_settled(p, PieceState.PENDING, "requeued after its node was reclaimed", now)
                plan.start_now.append(ordered[-1].row.job_id)  # its own Slurm id: no requeue delay
                requeued.append((p, ordered[-1].row.job_id, ordered[-1].row.partition or b.partition or ""))
            else:
                lifecycle.piece_settled(p, PieceState.WAITING, "its node was reclaimed; runs again", now)
                retry.append(p)
        elif last_state == AttemptState.CANCELLED:
            lifecycle.piece_settled(p, PieceState.CANCELLED, "cancelled in Slurm", now)
        elif p.failures > spec.max_retries:
            lifecycle.piece_settled(p, PieceState.FAILED, f"failed {p.failures} times, last exit {p.exit_code}"
                                    f"; see {piece_log(job.log_path or '', p.idx)}", now)
        else:
            lifecycle.piece_settled(p, PieceState.WAITING, f"retry {p.failures} after exit {p.exit_code}", now)
            retry.append(p)
    if retry:
        _retry_batch(s, job, batches, retry, now, plan, held)
    if requeued:
        _after_reclaim(s, svc, job, spec, requeued, now, plan)
    _progress(s, svc, job, now, held=held)


def _after_reclaim(s: Session, svc: Services, job: Job, spec: JobSpec, requeued: list[tuple[ArrayPiece, int, str]],
                   now: datetime, plan: ArrayPlan) -> None:
    """Ask the policy where the pieces Slurm requeued after a reclaim run next (as ``on_preempt`` is
    asked for a job): on spot again where they were, or on on-demand (their tasks are moved).

    The policy sees the array as one task with the most reclaims among these pieces. A forced
    partition, and pieces already off spot, stay where they are.
    """
    on_spot = [(p, raw) for p, raw, partition in requeued if svc.settings.capacity_of(partition) == "spot"]
    if spec.partition or not on_spot:
        return
    view = job_view(spec, now=now, submitted_at=_utc(job.created_at), reclaims=max(p.reclaims for p, _ in on_spot),
                    current=Capacity.SPOT)
    decision = svc.policy.on_preempt(view, [], market_view(svc, spec.nodes))
    if decision.action != Action.MOVE_ONDEMAND:
        return
    partition = svc.settings.partition_for("ondemand")
    plan.move.extend((raw, partition) for _, raw in on_spot)
    store.add_event(s, "moved", f"pieces {compress(p.idx for p, _ in on_spot)} requeued on {partition} "
                    f"(policy: {decision.reason})", now=now, job_id=job.id,
                    data={"to_capacity": Capacity.ONDEMAND.value})


def _retry_batch(s: Session, job: Job, batches: dict[int, ArrayBatch], retry: list[ArrayPiece], now: datetime,
                 plan: ArrayPlan, held: bool = False) -> None:
    """The pieces to run again as a new batch; submitted at once, or once the budget allows (``held``)."""
    first = batches[min(batches)]
    number = max(batches) + 1
    indices = compress(p.idx for p in retry)
    batch = ArrayBatch(job_id=job.id, number=number, indices=indices, partition=first.partition,
                       capacity=first.capacity, created_at=now)
    s.add(batch)
    for p in retry:
        p.batch, p.runs = number, 0
    s.flush()
    if held:
        store.add_event(s, "retry", f"pieces {indices} run again as batch {number} once the group's budget "
                        f"allows ({BUDGET_HELD})", now=now, job_id=job.id)
        return
    store.add_event(s, "retry", f"pieces {indices} run again as batch {number}", now=now, job_id=job.id)
    plan.sbatch.append((job.id, batch.id))


def counts(s: Session, job_id: int) -> dict[str, int]:
    return counts_of(s, [job_id]).get(job_id, {})


def counts_of(s: Session, job_ids: list[int]) -> dict[int, dict[str, int]]:
    """job id -> pieces per state, for these arrays, in one query."""
    out: dict[int, dict[str, int]] = {}
    if not job_ids:
        return out
    rows = s.execute(select(ArrayPiece.job_id, ArrayPiece.state, func.count()).where(ArrayPiece.job_id.in_(job_ids))
                     .group_by(ArrayPiece.job_id, ArrayPiece.state)).all()
    for jid, state, n in rows:
        out.setdefault(int(jid), {})[PieceState(state).value] = int(n)
    return out


def budget_held(s: Session, job_ids: list[int]) -> set[int]:
    """The jobs among these whose pending Slurm jobs gbroker holds for their group's budget (open holds)."""
    if not job_ids:
        return set()
    rows = s.execute(select(BudgetHold.job_id).where(BudgetHold.released_at.is_(None),
                                                     BudgetHold.job_id.in_(job_ids)).distinct()).scalars()
    return {int(j) for j in rows}


def _progress(s: Session, svc: Services, job: Job, now: datetime, c: dict[str, int] | None = None,
              held: bool = False) -> None:
    """The array's state and reason from its pieces' counts (``c``, else counted here).

    ``held``: gbroker holds its pending pieces for its group's budget (``held`` while none runs)."""
    if c is None:
        s.flush()
        c = counts(s, job.id)
    total = sum(c.values())
    line = progress_line(c, total)
    final = sum(c.get(x.value, 0) for x in PIECE_FINAL)
    if final == total and total:
        if c.get("done", 0) == total:
            lifecycle.array_moved(s, job, JobState.COMPLETED, line, now)
        elif c.get("failed", 0):
            failed = [p.idx for p in _pieces(s, job.id) if p.state == PieceState.FAILED]
            lifecycle.array_moved(s, job, JobState.FAILED, f"{line}; failed pieces: {compress(failed)}", now)
        else:
            lifecycle.array_moved(s, job, JobState.CANCELLED, line, now)
    elif c.get("running", 0):
        lifecycle.array_moved(s, job, JobState.RUNNING, f"{line}; the others {BUDGET_HELD}" if held else line, now)
    elif held:
        lifecycle.array_moved(s, job, JobState.HELD, f"{BUDGET_HELD}; {line}", now)
    elif job.state != JobState.ADMITTED:
        lifecycle.array_moved(s, job, JobState.PENDING, line, now)


# -- cancel and views -------------------------------------------------------------------
def slurm_arrays(s: Session, job_ids: list[int]) -> list[tuple[int, int]]:
    """(job id, Slurm array id) of every submitted batch of these jobs."""
    rows = s.execute(select(ArrayBatch.job_id, ArrayBatch.slurm_array_id)
                     .where(ArrayBatch.job_id.in_(job_ids), ArrayBatch.slurm_array_id.is_not(None))).all()
    return [(int(j), int(a)) for j, a in rows if a is not None]


def cancel_arrays(svc: Services, bound: list[tuple[int, str, str]]) -> None:
    """scancel the job arrays (array id, key, owner) that Slurm shows as these jobs' (one squeue, one scancel)."""
    if not bound:
        return
    wanted = {a: (key, owner) for a, key, owner in bound}
    ours = set()
    for t in svc.backend.jobs(name_prefix="gb-"):
        if t.array_job_id in wanted:
            key, owner = wanted[t.array_job_id]
            if is_ours(key, owner, name=t.name, comment=t.comment, user=t.user):
                ours.add(t.array_job_id)
    if ours:
        svc.backend.cancel(sorted(ours))


def array_summary(s: Session, job: Job) -> dict[str, Any] | None:
    """``{"total", "counts", "line"}`` for an array, None for a plain job."""
    return pieces_summary(counts(s, job.id))


def pieces_summary(c: dict[str, int]) -> dict[str, Any] | None:
    """``array_summary`` from an array's pieces per state (``counts_of``); None for none."""
    if not c:
        return None
    total = sum(c.values())
    return {"total": total, "counts": c, "line": progress_line(c, total)}


def array_detail(s: Session, job: Job) -> dict[str, Any]:
    """Pieces by state as compressed ranges, each piece's own record, and the batches."""
    pieces = _pieces(s, job.id)
    by_state: dict[str, list[int]] = {}
    for p in pieces:
        by_state.setdefault(PieceState(p.state).value, []).append(p.idx)
    batches = s.execute(select(ArrayBatch).where(ArrayBatch.job_id == job.id).order_by(ArrayBatch.number)).scalars()
    return {
        "by_state": {k: compress(v) for k, v in by_state.items()},
        "pieces": [
            {"piece": p.idx, "last": p.last, "state": PieceState(p.state).value, "batch": p.batch,
             "failures": p.failures, "reclaims": p.reclaims, "nodes": p.nodes, "exit_code": p.exit_code,
             "reason": p.reason, "log": piece_log(job.log_path, p.idx) if job.log_path else None}
            for p in pieces
        ],
        "batches": [{"number": b.number, "pieces": b.indices, "slurm_array_id": b.slurm_array_id,
                     "partition": b.partition} for b in batches],
    }


def array_indices(spec: JobSpec) -> str:
    """The ``--array`` value of the first batch: every chunk's first index, ``%N`` when capped."""
    pieces = spec.array()
    return slurm_array((a for a, _ in pieces.chunks()), pieces.limit)

