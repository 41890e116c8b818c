"""The ledger tick: charge ended runs, release reservations, alert, and stop groups at their budget.

Each tick:

1. finds the Slurm jobs with an ended attempt that is not charged yet and
   reads them all with ONE ``sacct --duplicates`` call (every run of a
   requeued job is a row; sacct's elapsed time is the truth);
2. charges every ended run not charged before, cut per price period,
   semester and useful/lost part (``broker.money.charging``), in one
   transaction; ``ledger_runs`` and ``charges`` are keyed so a run can never
   be charged twice, even after a crash between "charged" and "told";
3. releases the reservation of every finished job whose runs are all charged;
4. per budget of the semester in force: announces thresholds crossed, holds
   the group's pending jobs in Slurm while it is at its limit (intent first,
   then ``scontrol hold``), releases them when the budget allows again, and
   cancels running jobs at 100 % when the budget says so; an array is held
   by its Slurm arrays and its running tasks are cancelled (docs/ARRAYS.md);
5. charges node time no job used: idle stretches, the time a pool's billing
   rounds a power-up up to (one ``rounding`` line when the power-up ends) and
   the time a stopped node keeps billing where its pool says so (``stopped``).

Every line records its pool, GPU type and capacity class (the pool's class:
owned, reserved, spot, ondemand), from the settings' pool catalog.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from broker.db import store
from broker.db.ledger_models import (
    TAG_IDLE,
    TAG_ROUNDING,
    TAG_STOPPED,
    Budget,
    BudgetAlert,
    BudgetHold,
    Charge,
    LabGroup,
    LedgerRun,
    ReservationRelease,
)
from broker.db.array_models import ArrayBatch, ArrayPiece
from broker.db.models import Attempt, Event, Job
from broker.db.node_models import USAGE_IDLE, NodeSession, NodeUsage
from broker.errors import SlurmError, SlurmUnavailable
from broker.amount import cost_micros, format_money
from broker.money import alerts, nodecost, pricebook
from broker.money import budgets as B
from broker.money.charging import MissingPrice, Run, rounding_s, split_run, stopped_price_micros
from broker.config import Settings
from broker.pools.catalog import Billing
from broker.ownership import is_ours, verified
from broker.slurm.backend import SacctRow
from broker.slurm.parse import number_attempts
from broker.spec import account_name
from broker.states import ATTEMPT_TERMINAL, BUDGET_HELD, TERMINAL, AttemptState, JobState, PieceState
from broker.state import Services

log = logging.getLogger(__name__)

MAX_SLURM_IDS_PER_TICK = 500
"""Bounds the one sacct call; the rest waits for the next tick."""
GIVE_UP_AFTER = timedelta(hours=1)
"""A finished job whose accounting row for an attempt never appears is closed (at zero) after this."""
NO_ACCOUNTING = "NO_ACCOUNTING"
ELAPSED_TOLERANCE_S = 2
"""Beyond this, the charge's event notes that sacct and the daemon's own view of a run differ."""
LOST_STATES = (AttemptState.RECLAIMED, AttemptState.PREEMPTED, AttemptState.MOVED, AttemptState.LOST)
HOLDABLE = (JobState.PENDING, JobState.RECOVERING)
NEVER_STARTED = (AttemptState.BOOT_FAILED, AttemptState.WITHDRAWN)
"""Runs whose program never started: accounting counts their nodes' boot, which is not charged."""


def ticks(svc: Services) -> list[tuple[str, Callable[[], None], float]]:
    interval = max(1.0, float(svc.settings.tick_seconds))
    return [("ledger", lambda: ledger_tick(svc), interval)]


def ledger_tick(svc: Services) -> None:
    now = svc.clock.now()
    try:
        charge_ended_runs(svc, now)
    except SlurmUnavailable as exc:
        log.info("ledger: Slurm accounting unreachable (%s); charging waits", exc)
    release_reservations(svc, now)
    charge_idle_stretches(svc, now)
    charge_rounding(svc, now)
    charge_stopped_stretches(svc, now)
    enforce_budgets(svc, now)


# -- 1 and 2: charging ------------------------------------------------------------
def _unsettled_attempts(s: Session) -> Any:
    settled = exists().where(
        LedgerRun.job_id == Attempt.job_id,
        LedgerRun.slurm_job_id == Attempt.slurm_job_id,
        LedgerRun.run_index == Attempt.slurm_restarts,
    )
    return (
        select(Attempt)
        .where(Attempt.slurm_job_id.is_not(None), Attempt.state.in_(list(ATTEMPT_TERMINAL)))
        .where(~settled)
    )


def slurm_ids_to_charge(s: Session) -> list[int]:
    q = _unsettled_attempts(s).with_only_columns(Attempt.slurm_job_id).distinct()
    ids = sorted(int(i) for i in s.execute(q).scalars())
    return ids[:MAX_SLURM_IDS_PER_TICK]


def charge_ended_runs(svc: Services, now: datetime) -> int:
    """Charge every ended, uncharged run of the Slurm jobs that need it. Returns runs charged."""
    with svc.sessions() as s:
        ids = slurm_ids_to_charge(s)
    if not ids:
        return 0
    rows = svc.backend.history(job_ids=ids)  # ONE sacct --duplicates call for all of them
    by_id: dict[int, list[SacctRow]] = {}
    for r in rows:
        by_id.setdefault(r.job_id, []).append(r)
    charged = 0
    with svc.tx() as s:
        book = pricebook.load(s, svc.settings)
        cuts = B.semester_cuts(s)
        attempts = store.attempts_by_slurm_id(s, ids)
        for sid in ids:
            mine = [a for a in attempts if a.slurm_job_id == sid]
            for job_id in sorted({a.job_id for a in mine}):
                of_job = [a for a in mine if a.job_id == job_id]
                charged += _charge_slurm_job(s, svc, sid, of_job, by_id.get(sid, []), book, cuts, now)
    if charged:
        svc.crash.reach("ledger_after_charge")
    return charged


def runs_of_job(rows: list[SacctRow], key: str, owner: str) -> list[SacctRow]:
    """The rows of one gbroker job, numbered 0.. in run order.

    Slurm reuses job ids once its state is reset, so a Slurm id alone can name
    runs of two jobs; the owner and the job name (``<key>-<attempt>``) tell them
    apart. Anyone may name a job ``<key>-1``: a row of another user is never this job's.
    """
    mine = [r for r in rows if r.user == owner and (not r.name or r.name.startswith(key + "-"))]
    if len(mine) == len(rows):
        return rows
    return number_attempts(mine)


def _charge_slurm_job(
    s: Session, svc: Services, sid: int, attempts: list[Attempt], all_rows: list[SacctRow],
    book: Any, cuts: list[datetime], now: datetime,
) -> int:
    job = s.get(Job, attempts[0].job_id)
    assert job is not None
    rows = runs_of_job(all_rows, job.key, job.owner_name)
    settled = {
        (sid, idx)
        for idx in s.execute(
            select(LedgerRun.run_index).where(LedgerRun.job_id == job.id, LedgerRun.slurm_job_id == sid)
        ).scalars()
    }
    by_index = {a.slurm_restarts or 0: a for a in attempts}
    furthest = max(by_index)
    done = 0
    for row in sorted(rows, key=lambda r: r.restarts):
        key = (sid, row.restarts)
        att = by_index.get(row.restarts)
        forgotten = att is not None and att.state == AttemptState.LOST and row.end is None
        if key in settled or ((row.end is None or row.state not in ATTEMPT_TERMINAL) and not forgotten):
            continue  # still running; or a run the controller forgot, which reconcile closed as lost
        if att is not None and att.state not in ATTEMPT_TERMINAL:
            continue  # reconcile has not closed this attempt yet (its lost work is not known)
        if att is None and not (row.restarts < furthest or job.state in TERMINAL):
            continue  # a run the daemon has not caught up with yet
        try:
            _charge_run(s, svc, job, att, row, book, cuts, now)
        except MissingPrice as exc:
            _warn_once(svc, ("run", sid, row.restarts),
                       "ledger: run %s of Slurm job %s stays uncharged: %s", row.restarts, sid, exc.message)
            continue
        settled.add(key)
        done += 1
    _close_missing(s, svc.settings, sid, job, attempts, rows, settled, now)
    return done


def _charge_run(
    s: Session, svc: Services, job: Job, att: Attempt | None, row: SacctRow, book: Any,
    cuts: list[datetime], now: datetime,
) -> None:
    partition = row.partition or (att.partition if att is not None else None) or job.partition or ""
    # The settings' map; a partition it does not know keeps the capacity gbroker placed the run on.
    capacity = svc.settings.capacity_of(partition) or (att.capacity.value if att is not None else "ondemand")
    gpus = row.alloc_gpus or B.job_size(job).gpus
    elapsed = max(0, row.elapsed_s)
    start = row.start
    seen = _seen_s(att)
    source = "sacct"
    if row.end is None or row.state not in ATTEMPT_TERMINAL:
        elapsed = 0  # accounting never closed this run: its elapsed time is not a figure to charge
    if att is not None and att.state in NEVER_STARTED:
        elapsed = 0  # its program never started: accounting's time is the wait for a boot, not the job's
    lost_by_slurm = att is not None and att.state == AttemptState.LOST
    if lost_by_slurm and seen and seen > elapsed and att is not None and att.started_at is not None:
        # Slurm lost this run (a controller restart as it started) and accounting kept less
        # than gbroker saw it hold its nodes: charge what gbroker saw, and say so.
        elapsed, start, source = seen, att.started_at, "observed"
    if att is not None:
        # The attempt knows how its run ended (a self-requeue shows in accounting as a
        # requeue too, but its work was saved and goes on).
        lost = (att.lost_s or 0) if att.state in LOST_STATES else 0
    else:
        lost = elapsed if row.state in LOST_STATES else 0
    lines = []
    if start is not None and elapsed > 0:
        run = Run(row.job_id, row.restarts, start, elapsed, gpus, partition, capacity, lost)
        ondemand = (svc.settings.partition_for("ondemand"), "ondemand")
        lines = split_run(run, book, cuts=cuts, ondemand=ondemand)
    # The account whose budget admitted the job: an owner may move a waiting job to another
    # account of hers in Slurm (scontrol update), past that account's admission.
    account = job.group_name
    moved = bool(row.account) and account_name(row.account) != account_name(job.group_name)
    user = job.owner_name or row.user
    pool, gpu_type = pool_and_gpu(svc.settings, partition)
    for line in lines:
        s.add(Charge(
            line_key=line.key(row.job_id, row.restarts), slurm_job_id=row.job_id, run_index=row.restarts,
            job_id=job.id, attempt_id=att.id if att is not None else None, account=account, user_name=user,
            kind=job.kind, partition=partition, capacity=capacity, pool=pool, gpu_type=gpu_type, node="",
            tag=line.tag,
            period_start=line.period_start, period_end=line.period_end, seconds=line.seconds, gpus=line.gpus,
            price_micros=line.price_micros, amount_micros=line.amount_micros,
            ondemand_micros=line.ondemand_micros, created_at=now,
        ))
    total = sum(line.amount_micros for line in lines)
    s.add(LedgerRun(
        slurm_job_id=row.job_id, run_index=row.restarts, job_id=job.id,
        attempt_id=att.id if att is not None else None, account=account, user_name=user,
        partition=partition, capacity=capacity, pool=pool, gpu_type=gpu_type, state_raw=row.state_raw[:64],
        gpus=gpus,
        started_at=start, elapsed_s=elapsed, elapsed_source=source, lost_s=min(lost, elapsed), total_micros=total,
        settled_at=now,
    ))
    s.flush()
    parts = f" in {len(lines)} parts" if len(lines) > 1 else ""
    differs = seen is not None and abs(seen - elapsed) > ELAPSED_TOLERANCE_S
    note = f"; sacct's {elapsed}s used, the daemon saw {seen}s" if differs else ""
    if source == "observed":
        note = (f"; accounting recorded {max(0, row.elapsed_s)} s for this run (Slurm lost it), "
                "charged the time gbroker saw it run")
    if moved:
        note += (f"; Slurm ran it under account {row.account} (changed after submission), charged to "
                 f"{job.group_name}, whose budget admitted it")
        log.warning("job %s: Slurm job %s ran under account %s, not its group's %s; charged to %s",
                    job.id, row.job_id, row.account, job.group_name, job.group_name)
    store.add_event(
        s, "charged",
        f"run {row.restarts} of Slurm job {row.job_id} ({row.state_raw}, {elapsed}s x {gpus} GPU on "
        f"{partition}): {format_money(total)}{parts}{note}",
        now=now, job_id=job.id,
        data={"slurm_job_id": row.job_id, "run_index": row.restarts, "total_micros": total, "lines": len(lines),
              "sacct_elapsed_s": row.elapsed_s, "daemon_seen_s": seen, "elapsed_source": source},
    )


def pool_and_gpu(settings: Settings, partition: str) -> tuple[str | None, str | None]:
    """The pool of ``partition`` and its GPU type, as a charge line records them (None, None: no pool)."""
    pool = settings.pool_of(partition)
    return (pool.name, pool.gpu_type) if pool is not None else (None, None)


def _seen_s(att: Attempt | None) -> int | None:
    """The run time the daemon itself observed (squeue start to the tick that saw the end)."""
    if att is None or att.started_at is None or att.ended_at is None:
        return None
    return int((att.ended_at - att.started_at).total_seconds())


def _close_missing(
    s: Session, svc_settings: Settings, sid: int, job: Job, attempts: list[Attempt], rows: list[SacctRow],
    settled: set[tuple[int, int]], now: datetime,
) -> None:
    """Close attempts whose accounting row never came, once nothing more can come."""
    if job.state not in TERMINAL:
        return
    finished = job.finished_at or job.updated_at
    if finished is None or now - finished < GIVE_UP_AFTER:
        return
    if any(r.end is None or (sid, r.restarts) not in settled for r in rows):
        return
    for att in attempts:
        idx = att.slurm_restarts or 0
        if att.state in ATTEMPT_TERMINAL and (sid, idx) not in settled:
            log.warning("ledger: no accounting row for run %s of Slurm job %s; closing it at zero", idx, sid)
            pool, gpu_type = pool_and_gpu(svc_settings, att.partition or "")
            s.add(LedgerRun(
                slurm_job_id=sid, run_index=idx, job_id=job.id, attempt_id=att.id, account=job.group_name,
                user_name=job.owner_name, partition=att.partition or "", capacity=att.capacity.value,
                pool=pool, gpu_type=gpu_type,
                state_raw=NO_ACCOUNTING, gpus=0, started_at=None, elapsed_s=0, lost_s=0, total_micros=0,
                settled_at=now,
            ))
            settled.add((sid, idx))


# -- 3: reservations ----------------------------------------------------------------
def release_reservations(svc: Services, now: datetime) -> int:
    """Finished jobs whose every run is charged stop holding money against the budget."""
    with svc.tx() as s:
        waiting = exists().where(
            Attempt.job_id == Job.id,
            Attempt.slurm_job_id.is_not(None),
            ~exists().where(
                LedgerRun.job_id == Attempt.job_id,
                LedgerRun.slurm_job_id == Attempt.slurm_job_id,
                LedgerRun.run_index == Attempt.slurm_restarts,
            ),
        )
        q = (
            select(Job)
            .where(Job.state.in_(list(TERMINAL)), Job.released_at.is_(None))
            .where(~exists().where(ReservationRelease.job_id == Job.id))
            .where(~waiting)
        )
        jobs = list(s.execute(q).scalars())
        charged = B.charged_by_job(s, [j.id for j in jobs])
        for job in jobs:
            s.add(ReservationRelease(job_id=job.id, charged_micros=charged.get(job.id, 0), released_at=now))
            job.released_at = now  # with its row: admission looks only at jobs without one (budgets.py)
            if job.reserved_micros:
                store.add_event(
                    s, "released",
                    f"reservation of {format_money(job.reserved_micros)} released; charged "
                    f"{format_money(charged.get(job.id, 0))}",
                    now=now, job_id=job.id,
                )
        return len(jobs)


# -- 4: budgets -----------------------------------------------------------------------
@dataclass
class BudgetPlan:
    alerts: list[tuple[alerts.Alert, list[str] | None, str | None]] = field(default_factory=list)
    hold: list[tuple[int, int, int]] = field(default_factory=list)
    """(job id, slurm job id, budget id) to hold."""
    release: list[tuple[int, int]] = field(default_factory=list)
    """(hold row id, slurm job id) to release."""
    cancel: list[tuple[int, int]] = field(default_factory=list)
    """(job id, slurm job id) to cancel."""
    cancel_tasks: list[tuple[int, int]] = field(default_factory=list)
    """(array job id, Slurm array id) whose running tasks to cancel (its waiting ones are held or kept)."""
    statuses: list[B.BudgetStatus] = field(default_factory=list)


_ENFORCING = threading.Lock()
"""One enforcement at a time: the ledger tick's and a budget change's would both record the same holds."""


def enforce_budgets(svc: Services, now: datetime) -> BudgetPlan:
    """Hold, release and cancel what the budgets say, now (the ledger tick, and each budget change)."""
    with _ENFORCING:
        return _enforce_budgets(svc, now)


def _enforce_budgets(svc: Services, now: datetime) -> BudgetPlan:
    plan = BudgetPlan()
    with svc.tx() as s:
        _plan_budgets(s, svc, now, plan)
        hold_ids: dict[int, int] = {}
        for job_id, sid, budget_id in plan.hold:  # intent before action
            row = BudgetHold(job_id=job_id, slurm_job_id=sid, budget_id=budget_id, held_at=now)
            s.add(row)
            s.flush()
            hold_ids[sid] = row.id
            store.add_event(s, "budget_hold", f"held in Slurm: group at its budget (Slurm job {sid})",
                            now=now, job_id=job_id)
        for job_id, sid in plan.cancel:
            store.add_event(s, "budget_cancel", f"cancelled: group spent 100 % of its budget (Slurm job {sid})",
                            now=now, job_id=job_id)
        for job_id, sid in plan.cancel_tasks:
            store.add_event(s, "budget_cancel", "running pieces cancelled: group spent 100 % of its budget "
                            f"(the running tasks of Slurm array {sid})", now=now, job_id=job_id)
    for alert, command, url in plan.alerts:
        alerts.fire(alert, command, url)
    svc.crash.reach("ledger_before_hold")
    try:
        _act_on_slurm(svc, plan, hold_ids, now)
    except SlurmUnavailable as exc:
        # Holds stay recorded as intents and releases stay open: the next tick tries again.
        log.info("ledger: Slurm unreachable for holds/releases (%s); trying next tick", exc)
    return plan


def _verified_ids(svc: Services, pairs: list[tuple[int, int]]) -> set[int]:
    """The Slurm ids among (job id, Slurm id) that Slurm shows as those jobs' own (one squeue call)."""
    if not pairs:
        return set()
    with svc.sessions() as s:
        jobs = {j.id: j for j in s.execute(select(Job).where(Job.id.in_({j for j, _ in pairs}))).scalars()}
    return set(verified(svc, [(sid, jobs[j].key, jobs[j].owner_name) for j, sid in pairs if j in jobs]))


def _act_on_slurm(svc: Services, plan: BudgetPlan, hold_ids: dict[int, int], now: datetime) -> None:
    # Root holds, releases and cancels only ids Slurm shows as the jobs' own.
    with svc.sessions() as s:
        release_jobs = {h: s.get(BudgetHold, h) for h, _ in plan.release}
    ok = _verified_ids(
        svc,
        [(job_id, sid) for job_id, sid, _ in plan.hold] + list(plan.cancel)
        + [(row.job_id, sid) for h, sid in plan.release if (row := release_jobs[h]) is not None],
    )
    # The job's own state follows at once (not at the next reconcile), so nothing
    # else sees a held job as pending, or a released one as still held.
    if plan.hold:
        to_hold = [sid for _, sid, _ in plan.hold if sid in ok]
        failed = set(_slurm_each(svc.backend.hold, to_hold) if to_hold else [])
        # Slurm holds an array's waiting tasks but exits non-zero when one of its tasks has ended
        # ("Job has already finished"): the queue says whether its waiting tasks are held.
        failed -= _arrays_held(svc, failed)
        failed |= {sid for _, sid, _ in plan.hold if sid not in ok}
        failed |= _withdraw_booting(svc, [sid for sid in to_hold if sid not in failed])
        with svc.tx() as s:
            for job_id, sid, _ in plan.hold:
                row = s.get(BudgetHold, hold_ids[sid])
                job = s.get(Job, job_id)
                if sid in failed:
                    if row is not None:
                        row.released_at = now  # it was not held (it started, or left the queue)
                elif job is not None and job.state in HOLDABLE and not _runs_pieces(s, job.id):
                    store.set_job_state(s, job, JobState.HELD, BUDGET_HELD,
                                        now=now)
    if plan.release:
        # A refusal means the job is no longer held (or gone): the hold is over either way.
        to_release = [sid for _, sid in plan.release if sid in ok]
        if to_release:
            _slurm_each(svc.backend.release, to_release)
        with svc.tx() as s:
            for hold_id, _ in plan.release:
                row = s.get(BudgetHold, hold_id)
                if row is not None and row.released_at is None:
                    row.released_at = now
                    store.add_event(s, "budget_release", f"released in Slurm (Slurm job {row.slurm_job_id})",
                                    now=now, job_id=row.job_id)
                    job = s.get(Job, row.job_id)
                    if job is not None and job.state == JobState.HELD:
                        store.set_job_state(s, job, JobState.PENDING, "released: the budget allows it again",
                                            now=now)
    to_cancel = [sid for _, sid in plan.cancel if sid in ok]
    if to_cancel:
        _slurm_each(svc.backend.cancel, to_cancel)
    tasks = _running_tasks(svc, plan.cancel_tasks)
    if tasks:
        try:
            svc.backend.cancel_tasks(tasks)
        except SlurmUnavailable:
            raise
        except SlurmError as exc:  # what it did not cancel runs on; the next run to start is cancelled
            log.info("ledger: Slurm refused to cancel array tasks %s: %s", tasks, exc.stderr.strip() or exc.message)


def _withdraw_booting(svc: Services, held: list[int]) -> set[int]:
    """Of jobs just held, requeue held those Slurm had already given nodes to; the ids it could not stop.

    ``scontrol hold`` succeeds on a job whose nodes are booting (CONFIGURING) but
    leaves it allocated: it starts once they are up. Requeued held, it waits in
    the queue unstarted (the reconcile tick closes that run as withdrawn, not
    charged). A job Slurm already runs is not stopped here (``--at-limit-running``).
    Arrays are left as the hold left them: their waiting tasks are held.
    """
    if not held:
        return set()
    wanted = set(held)
    started = {sj.job_id: sj.state_raw for sj in svc.backend.jobs(job_ids=held)
               if sj.job_id in wanted and sj.array_job_id is None and sj.state != AttemptState.PENDING}
    booting = sorted(sid for sid, raw in started.items() if raw == "CONFIGURING")
    failed = set(_slurm_each(svc.backend.requeue_hold, booting)) if booting else set()
    if booting:
        log.info("ledger: requeued held Slurm jobs %s (their nodes were booting)", sorted(set(booting) - failed))
    return failed | (set(started) - set(booting))


def _arrays_held(svc: Services, sids: set[int]) -> set[int]:
    """The Slurm arrays among ``sids`` whose waiting tasks Slurm shows held (one squeue, only when asked)."""
    if not sids:
        return set()
    with svc.sessions() as s:
        arrays = set(s.execute(select(ArrayBatch.slurm_array_id).where(ArrayBatch.slurm_array_id.in_(sids))
                               ).scalars())
    if not arrays:
        return set()
    waiting: dict[int, list[str]] = {}
    for t in svc.backend.jobs(name_prefix="gb-"):
        if t.array_job_id is not None and t.array_job_id in arrays and t.state == AttemptState.PENDING:
            waiting.setdefault(t.array_job_id, []).append(t.reason or "")
    return {a for a, reasons in waiting.items() if all("held" in r.lower() for r in reasons)}


def _runs_pieces(s: Session, job_id: int) -> bool:
    """Whether an array has a piece running (a held array that runs some stays running)."""
    return s.execute(select(exists().where(ArrayPiece.job_id == job_id,
                                           ArrayPiece.state == PieceState.RUNNING))).scalar_one()


def _running_tasks(svc: Services, arrays: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(Slurm array id, task index) of the running tasks of these (job id, Slurm array id) that Slurm
    shows as the jobs' own (one squeue call)."""
    if not arrays:
        return []
    with svc.sessions() as s:
        jobs = {j.id: j for j in s.execute(select(Job).where(Job.id.in_({j for j, _ in arrays}))).scalars()}
    wanted = {sid: jobs[j] for j, sid in arrays if j in jobs}
    out = []
    for t in svc.backend.jobs(name_prefix="gb-"):  # a task is listed under its own id, not its array's
        array_id = t.array_job_id
        job = wanted.get(array_id) if array_id is not None else None
        if job is None or array_id is None or t.array_task is None or t.state != AttemptState.RUNNING:
            continue
        if is_ours(job.key, job.owner_name, name=t.name, comment=t.comment, user=t.user):
            out.append((array_id, t.array_task))
        else:
            log.error("Slurm job %s is listed in Slurm array %s of gbroker job %s of %s but Slurm shows it as "
                      "%s's (name %r); not touching it", t.job_id, t.array_job_id, job.key, job.owner_name,
                      t.user, t.name)
    return sorted(out)


def _slurm_each(action: Callable[[list[int]], None], ids: list[int]) -> list[int]:
    """One call for the list; when Slurm refuses part of it, find out which ids failed, one by one.

    SlurmUnavailable propagates: nothing is known then.
    """
    try:
        action(ids)
        return []
    except SlurmUnavailable:
        raise
    except SlurmError as exc:
        log.info("ledger: Slurm refused %s for %s: %s", getattr(action, "__name__", "action"), ids,
                 exc.stderr.strip() or exc.message)
        if len(ids) == 1:
            return list(ids)
    failed = []
    for sid in ids:
        try:
            action([sid])
        except SlurmUnavailable:
            raise
        except SlurmError:
            failed.append(sid)
    return failed


def _plan_budgets(s: Session, svc: Services, now: datetime, plan: BudgetPlan) -> None:
    semester = B.semester_at(s, now)
    book = pricebook.load(s, svc.settings)
    open_holds = list(s.execute(select(BudgetHold).where(BudgetHold.released_at.is_(None))).scalars())
    over_budgets: set[int] = set()
    budgets = []
    if semester is not None:
        budgets = list(s.execute(select(Budget).where(Budget.semester_id == semester.id)).scalars())
    for budget in budgets:
        group = s.get(LabGroup, budget.group_id)
        assert group is not None and semester is not None
        status = B.budget_status(s, group, semester, budget, book, svc.settings, now)
        plan.statuses.append(status)
        _plan_alerts(s, budget, status, now, plan)
        if status.over and budget.hold_pending:
            over_budgets.add(budget.id)
            held = {h.job_id for h in open_holds}
            for job, sid in _pending_in_slurm(s, group.slurm_account):
                if job.id not in held:
                    plan.hold.append((job.id, sid, budget.id))
            # An array: each of its Slurm arrays with pieces waiting in the queue, once.
            held_arrays = {(h.job_id, h.slurm_job_id) for h in open_holds}
            for job_id, sid in _arrays_waiting(s, group.slurm_account):
                if (job_id, sid) not in held_arrays:
                    plan.hold.append((job_id, sid, budget.id))
        if status.exhausted and budget.cancel_running:
            plan.cancel.extend(_running_to_cancel(s, group.slurm_account))
            plan.cancel_tasks.extend(_arrays_to_cancel(s, group.slurm_account))
    for h in open_holds:
        held_job = s.get(Job, h.job_id)
        if held_job is None or held_job.state in TERMINAL:
            h.released_at = now  # nothing left to release in Slurm
        elif h.budget_id not in over_budgets:
            plan.release.append((h.id, h.slurm_job_id))


def _plan_alerts(s: Session, budget: Budget, status: B.BudgetStatus, now: datetime, plan: BudgetPlan) -> None:
    fired = set(
        s.execute(
            select(BudgetAlert.threshold_pct).where(
                BudgetAlert.budget_id == budget.id, BudgetAlert.amount_micros == budget.amount_micros
            )
        ).scalars()
    )
    for pct in B.parse_thresholds(budget.thresholds):
        if pct in fired or not status.crossed(pct):
            continue
        s.add(BudgetAlert(budget_id=budget.id, threshold_pct=pct, amount_micros=budget.amount_micros,
                          spent_micros=status.spent_micros, fired_at=now))
        what = "new jobs are refused" + (", pending jobs held" if budget.hold_pending else "") if pct >= 100 else ""
        message = (
            f"group {status.group} crossed {pct}% of its {status.semester} budget: spent "
            f"{format_money(status.spent_micros)} of {format_money(status.amount_micros)}"
            + (f"; {what}" if what else "")
        )
        store.add_event(s, "budget_alert", message, now=now,
                        data={"group": status.group, "semester": status.semester, "threshold_pct": pct})
        alert = alerts.Alert(
            group=status.group, semester=status.semester, threshold_pct=pct,
            spent_micros=status.spent_micros, amount_micros=status.amount_micros,
            spent=format_money(status.spent_micros), amount=format_money(status.amount_micros),
            at=now.strftime("%Y-%m-%dT%H:%M:%SZ"), message=message,
        )
        command = json.loads(budget.alert_command) if budget.alert_command else None
        plan.alerts.append((alert, command, budget.alert_url))


def _latest_attempts(s: Session, account: str, states: tuple[JobState, ...]) -> list[tuple[Job, Attempt]]:
    latest = select(Attempt.job_id, func.max(Attempt.number).label("n")).group_by(Attempt.job_id).subquery()
    q = (
        select(Job, Attempt)
        .join(latest, latest.c.job_id == Job.id)
        .join(Attempt, (Attempt.job_id == Job.id) & (Attempt.number == latest.c.n))
        .where(Job.group_name == account, Job.state.in_(list(states)))
        .where(~exists().where(ArrayBatch.job_id == Job.id))  # an array's attempts are its pieces' ended runs
        .order_by(Job.id)
    )
    return [(j, a) for j, a in s.execute(q).all()]


def _arrays_waiting(s: Session, account: str) -> list[tuple[int, int]]:
    """(job id, Slurm array id) of the group's arrays, per submitted batch with pieces waiting in the queue."""
    waiting = exists().where(ArrayPiece.job_id == ArrayBatch.job_id, ArrayPiece.batch == ArrayBatch.number,
                             ArrayPiece.state == PieceState.PENDING)
    q = (
        select(ArrayBatch.job_id, ArrayBatch.slurm_array_id)
        .join(Job, Job.id == ArrayBatch.job_id)
        .where(Job.group_name == account, Job.state.not_in(list(TERMINAL)), ArrayBatch.slurm_array_id.is_not(None),
               waiting)
        .order_by(ArrayBatch.job_id, ArrayBatch.number)
    )
    return [(int(j), int(a)) for j, a in s.execute(q).all() if a is not None]


def _arrays_to_cancel(s: Session, account: str) -> list[tuple[int, int]]:
    """(job id, Slurm array id) of the group's arrays with a piece running that started after the
    array's last budget cancel (each run is cancelled once, as a job's)."""
    q = (
        select(ArrayBatch.job_id, ArrayBatch.slurm_array_id, func.max(ArrayPiece.started_at))
        .join(Job, Job.id == ArrayBatch.job_id)
        .join(ArrayPiece, (ArrayPiece.job_id == ArrayBatch.job_id) & (ArrayPiece.batch == ArrayBatch.number))
        .where(Job.group_name == account, Job.state.not_in(list(TERMINAL)), ArrayBatch.slurm_array_id.is_not(None),
               ArrayPiece.state == PieceState.RUNNING)
        .group_by(ArrayBatch.job_id, ArrayBatch.slurm_array_id)
        .order_by(ArrayBatch.job_id, ArrayBatch.slurm_array_id)
    )
    rows = s.execute(q).all()
    if not rows:
        return []
    told = dict(s.execute(select(Event.job_id, func.max(Event.at))
                          .where(Event.kind == "budget_cancel", Event.job_id.in_({int(r[0]) for r in rows}))
                          .group_by(Event.job_id)).all())
    out = []
    for job_id, sid, started in rows:
        last = told.get(job_id)
        if sid is not None and (last is None or started is None or _aware(started) > _aware(last)):
            out.append((int(job_id), int(sid)))
    return out


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _pending_in_slurm(s: Session, account: str) -> list[tuple[Job, int]]:
    """Jobs that have not started: waiting in the queue, or for their nodes to boot (those are
    requeued held, ``_withdraw_booting``)."""
    return [
        (job, att.slurm_job_id)
        for job, att in _latest_attempts(s, account, HOLDABLE)
        if att.slurm_job_id is not None and att.state == AttemptState.PENDING
    ]


def _running_to_cancel(s: Session, account: str) -> list[tuple[int, int]]:
    out = []
    for job, att in _latest_attempts(s, account, (JobState.RUNNING,)):
        if att.slurm_job_id is None:
            continue
        told = s.execute(
            select(Event.id).where(Event.job_id == job.id, Event.kind == "budget_cancel").limit(1)
        ).first()
        if told is None:
            out.append((job.id, att.slurm_job_id))
    return out


# -- idle node time ---------------------------------------------------------------------
def charge_idle_time(
    s: Session, svc: Services, *, node: str, partition: str, capacity: str, start: datetime, end: datetime,
    gpus: int, now: datetime, account: str = "", price_micros: int | None = None,
) -> int:
    """Charge a node that was up with no job on it, as its own ``idle`` lines. Returns micro-units.

    ``price_micros``: the node's price per node-hour (a node session's, fixed
    when it resumed); None: the price a node resuming at ``start`` gets
    (``pricebook.node_hour_price``). The stretch is priced by
    ``nodecost.stretch_cost``, as ``gbroker node report`` prices it: one line
    per semester piece, whose price is per node-hour. Keyed on (node, period
    start), so reporting the same idle stretch twice charges it once. Raises
    MissingPrice when there is no price.
    """
    if end <= start:
        return 0
    if price_micros is None:
        price_micros = pricebook.node_hour_price(svc.settings, pricebook.load(s, svc.settings), partition, capacity,
                                                 gpus, start)
    if price_micros is None:
        raise MissingPrice(
            f"no price for node {node} of partition {partition} ({capacity}) at {start:%Y-%m-%d %H:%M:%S} UTC",
            hint=f"add one: gbroker price set {partition} --capacity {capacity} --price ... --from ..., "
                 f"or set price_per_node_hour in [nodes.{partition}]",
        )
    total = 0
    for piece in nodecost.stretch_cost(price_micros, start, end, cuts=B.semester_cuts(s)):
        key = f"idle:{node}:{int(piece.start.timestamp())}"
        if s.execute(select(Charge.id).where(Charge.line_key == key)).first() is not None:
            continue
        s.add(_node_line(svc.settings, key=key, tag=TAG_IDLE, node=node, partition=partition, capacity=capacity,
                         start=piece.start, end=piece.end, seconds=piece.seconds, gpus=gpus,
                         price_micros=price_micros, amount_micros=piece.amount_micros, account=account, now=now))
        total += piece.amount_micros
    s.flush()
    return total


IDLE_LOOKBACK = timedelta(days=2)
"""Idle stretches that ended this recently are (re)offered to the ledger each tick; keys make it idempotent."""


def charge_idle_stretches(svc: Services, now: datetime) -> int:
    """Put every ended idle stretch of a node (from the node manager's sessions) in the ledger.

    Each stretch is charged at its session's price per node-hour (fixed at
    resume: the partition's ``price_per_node_hour``, else the price book's
    GPU-hour price times the node's GPUs), keyed per node and period, so a
    tick that sees it again charges nothing more. A session that has no price
    yet is logged and left for a later tick (an admin may add the price; see
    ``nodecost.session_price``).
    """
    total = 0
    with svc.tx() as s:
        book = pricebook.load(s, svc.settings)
        rows = s.execute(
            select(NodeUsage, NodeSession)
            .join(NodeSession, NodeSession.id == NodeUsage.session_id)
            .where(NodeUsage.state == USAGE_IDLE, NodeUsage.ended_at.is_not(None),
                   NodeUsage.ended_at >= now - IDLE_LOOKBACK)
        ).all()
        for usage, sess in rows:
            assert usage.ended_at is not None  # selected for it
            price = nodecost.session_price(s, svc.settings, book, sess, now)
            if price is None:
                _warn_once(svc, ("idle", usage.id), "ledger: idle time of %s not charged yet: no price for "
                           "partition %s (%s) when it resumed", sess.node, sess.partition, sess.capacity)
                continue
            total += charge_idle_time(
                s, svc, node=sess.node, partition=sess.partition, capacity=sess.capacity,
                start=usage.started_at, end=usage.ended_at, gpus=sess.gpus, now=now, price_micros=price,
            )
    return total


def _node_line(
    settings: Settings, *, key: str, tag: str, node: str, partition: str, capacity: str, start: datetime,
    end: datetime, seconds: int, gpus: int, price_micros: int, amount_micros: int, now: datetime,
    account: str = "",
) -> Charge:
    """A line of node time no job used (idle, rounding, stopped): no Slurm job, priced per node-hour."""
    pool, gpu_type = pool_and_gpu(settings, partition)
    return Charge(
        line_key=key, slurm_job_id=None, run_index=None, job_id=None, attempt_id=None, account=account,
        user_name="", kind=tag, partition=partition, capacity=capacity, pool=pool, gpu_type=gpu_type, node=node,
        tag=tag, period_start=start, period_end=end, seconds=seconds, gpus=gpus, price_micros=price_micros,
        amount_micros=amount_micros, ondemand_micros=amount_micros, created_at=now,
    )


def _line_exists(s: Session, key: str) -> bool:
    return s.execute(select(Charge.id).where(Charge.line_key == key)).first() is not None


def node_billing(settings: Settings, partition: str) -> Billing:
    """How ``partition``'s nodes are billed: its pool's rule (``NodePartition.billing``), else per second."""
    rule = settings.managed_node_partitions().get(partition)
    return rule.billing if rule is not None else Billing()


def rounding_key(sess: NodeSession) -> str:
    return f"rounding:{sess.node}:{int(sess.resumed_at.timestamp())}"


def charge_rounding(svc: Services, now: datetime) -> int:
    """One ``rounding`` line per ended power-up whose pool bills more than its real length.

    A node up 61 minutes on an hourly pool has had 3,660 s charged as busy
    (its jobs) and idle time; this line charges the 3,540 s the provider bills
    beyond it, at the session's price per node-hour, from the suspend on.
    Keyed on (node, resume time), so it lands once per power-up; a session
    without a price waits like its idle time. Returns micro-units charged.
    """
    total = 0
    with svc.tx() as s:
        book = pricebook.load(s, svc.settings)
        ended = s.execute(
            select(NodeSession).where(NodeSession.suspended_at.is_not(None),
                                      NodeSession.suspended_at >= now - IDLE_LOOKBACK)
        ).scalars()
        for sess in ended:
            assert sess.suspended_at is not None  # selected for it
            up_s = int((sess.suspended_at - sess.resumed_at).total_seconds())
            extra = rounding_s(node_billing(svc.settings, sess.partition), up_s)
            key = rounding_key(sess)
            if extra <= 0 or _line_exists(s, key):
                continue
            price = nodecost.session_price(s, svc.settings, book, sess, now)
            if price is None:
                _warn_once(svc, ("rounding", sess.id), "ledger: billing rounding of %s not charged yet: no price "
                           "for partition %s (%s) when it resumed", sess.node, sess.partition, sess.capacity)
                continue
            amount = cost_micros(price, extra)
            s.add(_node_line(svc.settings, key=key, tag=TAG_ROUNDING, node=sess.node, partition=sess.partition,
                             capacity=sess.capacity, start=sess.suspended_at,
                             end=sess.suspended_at + timedelta(seconds=extra), seconds=extra, gpus=sess.gpus,
                             price_micros=price, amount_micros=amount, now=now))
            total += amount
        s.flush()
    return total


def stopped_stretches(sessions: list[NodeSession]) -> list[tuple[NodeSession, NodeSession]]:
    """(session, next session) of the same node: the node was stopped between the two. Pure."""
    by_node: dict[str, list[NodeSession]] = {}
    for sess in sessions:
        by_node.setdefault(sess.node, []).append(sess)
    out = []
    for runs in by_node.values():
        runs.sort(key=lambda x: (x.resumed_at, x.id))
        for a, b in zip(runs, runs[1:], strict=False):
            if a.suspended_at is not None and a.suspended_at < b.resumed_at:
                out.append((a, b))
    return out


def charge_stopped_stretches(svc: Services, now: datetime) -> int:
    """A ``stopped`` line per closed stretch a node of a pool with ``stopped_price_per_hour`` was stopped.

    The stretch runs from a power-up's suspend to the same node's next resume
    (a node still stopped is charged once it comes back); the price is the
    pool's stopped price per node-hour, the stretch cut at semester
    boundaries like idle time, keyed on (node, piece start). Returns micro-units.
    """
    pools = {p.partition: p for p in svc.settings.catalog().pools
             if stopped_price_micros(node_billing(svc.settings, p.partition)) is not None}
    if not pools:
        return 0
    total = 0
    with svc.tx() as s:
        recent = list(s.execute(
            select(NodeSession.node).where(NodeSession.partition.in_(list(pools)),
                                           NodeSession.resumed_at >= now - IDLE_LOOKBACK)
        ).scalars())
        if not recent:
            return 0
        sessions = list(s.execute(select(NodeSession).where(NodeSession.node.in_(set(recent)))).scalars())
        cuts = B.semester_cuts(s)
        for before, after in stopped_stretches(sessions):
            if before.partition not in pools or after.resumed_at < now - IDLE_LOOKBACK:
                continue
            assert before.suspended_at is not None  # stopped_stretches checked it
            price = stopped_price_micros(node_billing(svc.settings, before.partition))
            assert price is not None
            for piece in nodecost.stretch_cost(price, before.suspended_at, after.resumed_at, cuts):
                key = f"stopped:{before.node}:{int(piece.start.timestamp())}"
                if _line_exists(s, key):
                    continue
                s.add(_node_line(svc.settings, key=key, tag=TAG_STOPPED, node=before.node,
                                 partition=before.partition, capacity=before.capacity, start=piece.start,
                                 end=piece.end, seconds=piece.seconds, gpus=before.gpus, price_micros=price,
                                 amount_micros=piece.amount_micros, now=now))
                total += piece.amount_micros
        s.flush()
    return total


def _warn_once(svc: Services, key: tuple[object, ...], msg: str, *args: object) -> None:
    """A missing price is retried every tick; say so once per run, not once per tick."""
    warned = svc.warned
    if key not in warned:
        warned.add(key)
        log.warning(msg, *args)
