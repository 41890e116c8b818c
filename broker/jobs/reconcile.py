"""The reconcile tick: read Slurm once, compare with the store, converge.

Level-triggered and idempotent (principle 3): every tick looks at what Slurm
says *now* and moves each active job towards it. Running a tick twice, or
after a crash, changes nothing more. Slurm calls per tick do not grow with the
number of jobs: one ``squeue`` for all jobs, one ``sacct`` for the jobs that
left the queue (or were requeued), and one more only to adopt submissions
that a crashed daemon left behind.

A job Slurm does not answer about is *unknown*, never failed or completed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session, lazyload

from broker.db import store
from broker.db.ledger_models import BudgetHold
from broker.db.models import Attempt, Event, Job
from broker.errors import BrokerError, SlurmError, SlurmUnavailable, SpecError
from broker.money import budgets
from broker.state import Services, must_get
from broker.jobs import arrays, lifecycle
from broker.jobs.chains import chain_blocks
from broker.jobs.placement import (
    attempt_views,
    fitting_pools,
    job_view,
    market_view,
    place_in_pools,
    pool_index,
    pool_price,
    pool_views,
    progress_s,
    reclaim_history,
    reclaim_history_by_partition,
)
from broker.ownership import is_ours
from broker.jobs.submit import (
    checkpoint_dir_of,
    log_path_of,
    sbatch_attempt,
    sbatch_batch,
    slurm_name,
    stored_spec,
)
from broker.userfiles import SaveFacts
from broker.checkpoint.manifest import RESUME_EXIT
from broker.slurm.backend import SacctRow, SlurmJob
from broker.slurm.reasons import pending_in_words
from broker.slurm.script import TIMED_OUT_EXIT
from broker.slurm.statemap import FLAG_NOT_RESPONDING, is_failure_hold, normalize_job_state
from broker.spec import JobSpec
from broker.states import ATTEMPT_RUNNING, ATTEMPT_TERMINAL, BUDGET_HELD, TERMINAL, AttemptState, JobState
from broker.market import ReclaimHistory, build_market
from broker.money import pricebook
from broker.money.pricebook import market_prices
from broker.pools import PREPAID as PREPAID_CLASSES
from broker.pools import partition_refuses
from policies import PREPAID, Action, Capacity, Decision, JobView, Placement

log = logging.getLogger(__name__)

Row = TypeVar("Row", SlurmJob, SacctRow)
"""A queue or accounting row: both carry the name, comment and user that say whose job it is."""

KEY_PREFIX = "gb-"
ADOPT_LOOKBACK = timedelta(hours=1)
"""How far back sacct is searched for a submission that a crashed daemon left unconfirmed."""


@dataclass
class TickPlan:
    """Slurm actions decided in one tick, sent batched at its end."""

    start_now: list[int] = field(default_factory=list)
    move: list[tuple[int, str]] = field(default_factory=list)
    """(pending Slurm job, partition): move it to another pool's partition."""
    cancel: list[int] = field(default_factory=list)
    off_spot: list[int] = field(default_factory=list)
    """Running jobs to requeue so they run elsewhere: on-demand in time for a deadline, or owned capacity."""
    sbatch: list[tuple[int, int]] = field(default_factory=list)
    """(job id, attempt id) to submit afresh."""
    release: list[int] = field(default_factory=list)
    """Jobs Slurm held after failing to launch them itself."""
    exclude: list[tuple[int, str]] = field(default_factory=list)
    """(pending Slurm job, node list): keep it off nodes that failed to boot for it."""
    silent_nodes: frozenset[str] = frozenset()
    """Nodes Slurm marks not responding, as this tick read them (only when a job is completing)."""


def _utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _refresh_market(s: Session, svc: Services, now: datetime) -> None:
    """The market the policies see: the reclaim rates seen so far (the whole cluster's and each
    spot pool's), prices in force, and the node tick's last census."""
    history = reclaim_history(s, now)
    prices = market_prices(s, svc.settings, now)
    svc.market.refresh(build_market(svc.settings, svc.market.observer, now, history.rate(1), prices), history, now)
    _refresh_pools(s, svc, now)


def _refresh_pools(s: Session, svc: Services, now: datetime) -> None:
    """Each pool's price in force and each spot pool's own reclaims, for the pools' market views."""
    book = pricebook.load(s, svc.settings)
    by_partition = reclaim_history_by_partition(s, now)
    catalog = svc.settings.catalog()
    svc.market.refresh_pools(
        {p.name: by_partition.get(p.partition, ReclaimHistory()) for p in catalog.of_class("spot")},
        {p.name: pool_price(book, p, now) for p in catalog.pools},
    )


def active_with_latest(session: Session) -> list[tuple[Job, Attempt]]:
    """Every active job with its latest attempt, in one query."""
    latest = (
        select(Attempt.job_id, func.max(Attempt.number).label("n")).group_by(Attempt.job_id).subquery()
    )
    q = (
        select(Job, Attempt)
        .join(latest, latest.c.job_id == Job.id)
        .join(Attempt, (Attempt.job_id == Job.id) & (Attempt.number == latest.c.n))
        .where(Job.state.not_in(list(TERMINAL)))
        .where(arrays.not_an_array())  # arrays follow their pieces (broker/jobs/arrays.py)
        .order_by(Job.id)
        .options(lazyload(Job.attempts))  # the latest attempt is already in the row
    )
    return [(j, a) for j, a in session.execute(q).all()]


def reconcile(svc: Services) -> None:
    now = svc.clock.now()
    if svc.next_try_at is not None and now < svc.next_try_at:
        return
    listed_at = time.monotonic()
    try:
        queue = svc.backend.jobs(name_prefix=KEY_PREFIX)
    except SlurmUnavailable as exc:
        svc.slurm_down(now, str(exc))
        _mark_unknown(svc, now, "Slurm controller unreachable")
        return
    svc.slurm_up(now)
    # squeue also lists jobs that just ended; sacct is the truth for those. A job
    # being requeued (REQUEUED...) is alive: its next run is coming.
    queue = [j for j in queue if j.state not in ATTEMPT_TERMINAL or j.state_raw.startswith("REQUEUE")]
    tasks = [j for j in queue if j.array_task is not None or j.array_tasks is not None]
    queue = [j for j in queue if j.array_task is None and j.array_tasks is None]  # tasks are the arrays' own
    by_id = {j.job_id: j for j in queue}
    by_name: dict[str, list[SlurmJob]] = {}
    for j in queue:
        by_name.setdefault(j.name, []).append(j)  # anyone may name a job gb-...: every one is kept
    plan = TickPlan(silent_nodes=_silent_nodes(svc, queue))

    need_history: dict[int, tuple[Job, Attempt]] = {}
    unconfirmed: list[tuple[Job, Attempt]] = []
    with svc.tx() as s:
        _refresh_market(s, svc, now)
        active = active_with_latest(s)
        live = {job.id for job, _ in active}
        for job_id in [j for j in svc.tick_errors if j not in live]:
            del svc.tick_errors[job_id]  # errors are remembered (to be said once) while the job is active
        attempts = {att.id for _, att in active}
        for att_id in [a for a in svc.unclear_since if a not in attempts]:
            del svc.unclear_since[att_id]
        for job, att in active:
            if svc.sbatch_busy(att.id, since=listed_at):
                # Being submitted by another thread, or submitted after the
                # queue listing: the next tick sees it in squeue.
                continue
            with _isolated(s, svc, job, now):
                _look(s, svc, job, att, by_id, by_name, now, plan, need_history, unconfirmed)

    rows: list[SacctRow] = []
    try:
        if need_history:
            rows = svc.backend.history(job_ids=sorted(need_history))
        if unconfirmed:
            # The intent's own time: a crash between sbatch and the commit leaves submitted_at empty.
            since = min(_utc(a.submitted_at or a.created_at) or now for _, a in unconfirmed) - timedelta(minutes=5)
            rows += svc.backend.history(since=max(since, now - ADOPT_LOOKBACK))
    except SlurmUnavailable as exc:
        svc.slurm_down(now, str(exc))
        return
    by_job: dict[int, list[SacctRow]] = {}
    for r in rows:
        by_job.setdefault(r.job_id, []).append(r)
    # What ended runs had saved, learned as their owners, outside any lock or transaction.
    saves = _probe_saves(svc, [pair for pair in need_history.values()])

    with svc.tx() as s:
        for slurm_id, (job0, att0) in need_history.items():
            job, att = must_get(s, Job, job0.id), must_get(s, Attempt, att0.id)
            with _isolated(s, svc, job, now):
                _settle(s, svc, job, att, _ours(job, by_job.get(slurm_id, [])), by_id.get(slurm_id), now, plan,
                        saves.get(job.id))
        names: dict[str, list[SacctRow]] = {}
        for r in rows:
            names.setdefault(r.name, []).append(r)
        for job0, att0 in unconfirmed:
            job, att = must_get(s, Job, job0.id), must_get(s, Attempt, att0.id)
            with _isolated(s, svc, job, now):
                row = next(iter(_ours(job, names.get(slurm_name(job.key, att.number), []))), None)
                if row is not None:
                    att.slurm_job_id = row.job_id
                    store.add_event(s, "adopted", f"found Slurm job {row.job_id} by key after a restart",
                                    now=now, job_id=job.id)
                    _settle(s, svc, job, att, _ours(job, by_job.get(row.job_id, [row])), None, now, plan, None)
                else:
                    # The intent is stored but Slurm never got the job: submit it now.
                    plan.sbatch.append((job.id, att.id))

    _act(svc, plan, now)
    if svc.next_try_at is None or svc.next_try_at <= now:
        _act_arrays(svc, arrays.reconcile_arrays(svc, tasks, now, listed_at), now)


def _completing(sj: SlurmJob) -> bool:
    """Slurm is ending this run (squeue COMPLETING): signalled or ended, its nodes cleaning up."""
    return sj.state_raw.strip().upper() in ("COMPLETING", "CG")


def _silent_nodes(svc: Services, queue: list[SlurmJob]) -> frozenset[str]:
    """The nodes Slurm marks not responding, read (one sinfo) only when a listed job is completing:
    a run whose node stopped answering stays COMPLETING until Slurm gives up on the node."""
    if not any(_completing(j) for j in queue):
        return frozenset()
    try:
        return frozenset(n.name for n in svc.backend.nodes() if FLAG_NOT_RESPONDING in n.flags)
    except SlurmError as exc:
        log.info("nodes not read this tick: %s", exc)
        return frozenset()


def _ending_why(sj: SlurmJob, silent: frozenset[str]) -> str:
    """Why a completing run has not ended, in Slurm's words: which of its nodes do not respond."""
    quiet = [n for n in sj.nodes if n in silent]
    if quiet:
        return (f"Slurm is ending it and waits for {', '.join(quiet)}, not responding; it ends when the "
                "node answers or Slurm gives up on it")
    return "Slurm is ending it (the program was signalled or ended; the node is cleaning up)"


def _look(
    s: Session, svc: Services, job: Job, att: Attempt, by_id: dict[int, SlurmJob],
    by_name: dict[str, list[SlurmJob]],
    now: datetime, plan: TickPlan, need_history: dict[int, tuple[Job, Attempt]],
    unconfirmed: list[tuple[Job, Attempt]],
) -> None:
    """Compare one active job's latest attempt with the queue listing."""
    if att.slurm_job_id is None:
        # Only a job that is this one's (owner and key) is adopted; another user's job of the
        # same name is not this job's, and is no reason to fail it.
        found = next(iter(_ours(job, by_name.get(slurm_name(job.key, att.number), []))), None)
        if found is not None:
            _adopt(s, job, att, found, now)
            _follow(s, svc, job, att, found, now, plan, need_history)
        else:
            if att.number == 1 and att.submitted_at is None and chain_blocks(s, svc, job, now) is not None:
                return  # a chain: waits for the jobs named in `after` (or was just cancelled with them)
            unconfirmed.append((job, att))
    elif att.slurm_job_id in by_id:
        sj = by_id[att.slurm_job_id]
        if _verify(s, job, att, sj, now):
            _follow(s, svc, job, att, sj, now, plan, need_history)
    else:
        need_history[att.slurm_job_id] = (job, att)


def _verify(s: Session, job: Job, att: Attempt, sj: SlurmJob, now: datetime) -> bool:
    """True when Slurm shows ``sj`` as this job's (owner and key); else the binding is dropped, never acted on."""
    if is_ours(job.key, job.owner_name, name=sj.name, comment=sj.comment, user=sj.user):
        return True
    why = (f"Slurm job {sj.job_id} belongs to {sj.user} (name {sj.name!r}), not to this job of "
           f"{job.owner_name}; gbroker will not touch it")
    log.error("job %s: %s", job.id, why)
    lifecycle.job_ended(s, job, att, JobState.FAILED, why, now, ended_at=now, outcome=why)
    return False


def _ours(job: Job, rows: list[Row]) -> list[Row]:
    """The queue or accounting rows that are this job's (owner and key); others never count for it."""
    return [r for r in rows if is_ours(job.key, job.owner_name, name=r.name, comment=r.comment, user=r.user)]


@contextmanager
def _isolated(s: Session, svc: Services, job: Job, now: datetime) -> Iterator[None]:
    """One job's share of a tick: a failure rolls back that job's changes only, is logged
    once, and is written on the job as its reason; the tick goes on with the others."""
    savepoint = s.begin_nested()
    try:
        yield
        savepoint.commit()
    except Exception as exc:  # noqa: BLE001 - one bad job must not stop everyone's tick
        savepoint.rollback()
        message = f"gbroker could not process this job: {type(exc).__name__}: {exc}"[:500]
        if svc.tick_errors.get(job.id) != message:
            svc.tick_errors[job.id] = message
            log.exception("job %s: %s", job.id, message)
            with s.begin_nested():
                row = s.get(Job, job.id)
                if row is not None:
                    row.reason = message + "; an admin should look at the daemon log"
                    row.updated_at = now
                    store.add_event(s, "tick_error", message, now=now, job_id=job.id)


def _probe_saves(svc: Services, pairs: list[tuple[Job, Attempt]]) -> dict[int, SaveFacts]:
    """job id -> what its checkpoint directory shows, for the jobs whose attempt just ended."""
    wanted: dict[str, list[str]] = {}
    dirs: dict[int, tuple[str, str]] = {}
    for job, _att in pairs:
        try:
            directory = checkpoint_dir_of(job)
        except Exception as exc:  # noqa: BLE001 - a job whose spec cannot be read has no directory to look at
            log.debug("job %s: no checkpoint directory (%s)", job.id, exc)
            continue
        dirs[job.id] = (job.owner_name, directory)
        wanted.setdefault(job.owner_name, []).append(directory)
    found = svc.files.probe_many(wanted)
    out = {}
    for job_id, (owner, directory) in dirs.items():
        facts = found.get((owner, directory))
        if facts is not None:
            out[job_id] = facts
            svc.saves.remember(owner, {directory: facts})
    return out


# -- following a job that is still in the queue --------------------------------
def _adopt(s: Session, job: Job, att: Attempt, sj: SlurmJob, now: datetime) -> None:
    att.slurm_job_id = sj.job_id
    att.slurm_restarts = sj.restarts
    store.add_event(s, "adopted", f"found Slurm job {sj.job_id} by key after a restart", now=now, job_id=job.id)


def _follow(
    s: Session,
    svc: Services,
    job: Job,
    att: Attempt,
    sj: SlurmJob,
    now: datetime,
    plan: TickPlan,
    need_history: dict[int, tuple[Job, Attempt]],
) -> None:
    booting = sj.state_raw == "CONFIGURING"
    running = sj.state == AttemptState.RUNNING and not booting
    new_run = (
        sj.restarts > (att.slurm_restarts or 0)
        or sj.state_raw.startswith("REQUEUE")
        or (att.state in ATTEMPT_RUNNING and sj.state == AttemptState.PENDING)
    )
    if new_run:
        # Slurm requeued it (node failure = spot reclaim, or preemption): the attempt is over.
        need_history[sj.job_id] = (job, att)
        return
    if running and att.state not in ATTEMPT_RUNNING and not _started_again(sj, job, att):
        # A requeued job still finishing its earlier run (COMPLETING, or RUNNING with that run's
        # start): this attempt has not started. Taking it for running would make a phantom run.
        return
    if booting:
        att.nodes = ",".join(sj.nodes)
        _move(s, job, JobState.PENDING, f"waiting for {att.nodes} to boot", now)
    elif running and _completing(sj):
        lifecycle.attempt_completing(s, job, att, ",".join(sj.nodes), _ending_why(sj, plan.silent_nodes), now)
    elif running:
        lifecycle.attempt_running(s, job, att, ",".join(sj.nodes), _utc(sj.start_time) or now, now)
        if att.state == AttemptState.MOVING:
            # The move is decided and stored: its requeue is asked again at each tick until Slurm
            # has done it (a refusal, or a controller that was down, loses nothing).
            plan.off_spot.append(sj.job_id)
        else:
            if job.deadline is not None and att.capacity == Capacity.SPOT:
                _deadline_while_running(s, svc, job, att, sj, now, plan)
            if att.state == AttemptState.RUNNING and att.capacity in (Capacity.SPOT, Capacity.ONDEMAND):
                _move_running(s, svc, job, att, sj, now, plan)
    elif sj.state == AttemptState.PENDING:
        lifecycle.attempt_pending(att)
        if is_failure_hold(sj.reason):
            _release_failure_hold(s, job, sj, now, plan)
            return
        if att.number > 1:  # a resubmission after boot failures starts with no exclusion of its own
            _keep_off_failed_boots(s, job, att, sj.job_id, now, plan)
        held = "held" in (sj.reason or "").lower()
        _move(s, job, JobState.HELD if held else JobState.PENDING, _pending_reason(svc, job, sj, held), now)
        if not held and job.deadline is not None and att.capacity in (Capacity.SPOT, *PREPAID):
            _deadline_fallback(s, svc, job, att, sj, now, plan)
        if not held and att.capacity == Capacity.SPOT and svc.settings.pools:
            _spot_pool_gone(s, svc, job, att, sj, now, plan)
        if (att.partition and sj.partition != att.partition and att.partition in svc.settings.partitions
                and (sj.job_id, att.partition) not in plan.move):
            # A move whose partition update did not go through yet: the attempt was opened while
            # Slurm still showed the requeued job's last run, or the update was refused. Before the
            # requeue delay is skipped below, or the job would start again where it ran.
            plan.move.append((sj.job_id, att.partition))
        if sj.reason == "BeginTime":
            # gbroker never asks for a begin time: this is Slurm's requeue delay. Skip it.
            plan.start_now.append(sj.job_id)
    elif sj.state == AttemptState.UNKNOWN:
        _move(s, job, JobState.UNKNOWN, f"Slurm state {sj.state_raw}", now)


def _pending_reason(svc: Services, job: Job, sj: SlurmJob, held: bool) -> str:
    """Slurm's reason for the pending job, in words (``broker.slurm.reasons``), from this tick's
    queue row and the partition limits as last read (no Slurm call). A job gbroker itself
    holds for its group's budget keeps that reason: Slurm only says JobHeldAdmin."""
    if held and job.state == JobState.HELD and (job.reason or "").startswith(BUDGET_HELD):
        return job.reason or ""
    limits = svc.backend.known_partition_limits().get(sj.partition)
    return pending_in_words(sj.reason or "", partition=sj.partition, job_id=sj.job_id,
                            time_limit_s=sj.time_limit_s, limits=limits)


MAX_FAILURE_RELEASES = 3
"""Times gbroker releases a job Slurm held after failing to launch it, before giving up on it."""
FAILURE_RELEASE = "released"


def _release_failure_hold(s: Session, job: Job, sj: SlurmJob, now: datetime, plan: TickPlan) -> None:
    """Slurm requeued the job held after its own launch failure: release it, at most a few times.

    Nobody asked for that hold (a node failed at launch, or the controller
    restarted while the job was starting), so waiting for a human would
    leave the job held for ever. Said once per release, on the job.
    """
    released = s.execute(
        select(func.count()).select_from(Event).where(Event.job_id == job.id, Event.kind == FAILURE_RELEASE)
    ).scalar_one()
    if released >= MAX_FAILURE_RELEASES:
        plan.cancel.append(sj.job_id)
        store.set_job_state(
            s, job, JobState.FAILED,
            f"Slurm failed to launch it {released + 1} times ({sj.reason}); see the node's slurmd log", now=now,
        )
        return
    plan.release.append(sj.job_id)
    store.add_event(s, FAILURE_RELEASE,
                    f"Slurm held Slurm job {sj.job_id} after failing to launch it ({sj.reason}); released",
                    now=now, job_id=job.id)
    _move(s, job, JobState.PENDING, f"released after Slurm's own launch failure ({sj.reason})", now)


def _deadline_fallback(
    s: Session, svc: Services, job: Job, att: Attempt, sj: SlurmJob, now: datetime, plan: TickPlan
) -> None:
    """A deadline job still waiting (for spot, or for owned capacity): ask the policy again;
    move it to on-demand if it says so.

    This is how a deadline is kept when spot or owned capacity does not come:
    the policy's safety net turns to on-demand while the time left still
    covers the work. A forced partition (the user's choice) is never moved.
    """
    spec = stored_spec(job)
    if spec.partition:
        return
    try:
        pools = fitting_pools(svc, spec)
    except SpecError:
        return  # the catalog changed under the job: leave it where it waits
    view = _view_of(job, spec, now)
    pool, choice = place_in_pools(svc, spec, view, pools)
    if choice.capacity != Capacity.ONDEMAND:
        return
    reason = choice.reason
    waiting = "owned capacity" if att.capacity in PREPAID else "spot"
    if _quota_holds(s, job, now, f"it keeps waiting for {waiting}"):
        _move(s, job, JobState.PENDING, f"waiting for {waiting}: the group's on-demand quota is full", now)
        return
    partition = pool.partition
    plan.move.append((sj.job_id, partition))
    att.partition, att.capacity = partition, Capacity.ONDEMAND
    job.partition, job.capacity = partition, Capacity.ONDEMAND
    store.add_event(
        s, "fallback", f"still waiting for {waiting}; moved to {partition} to meet the deadline ({reason})",
        now=now, job_id=job.id, data={"to_capacity": Capacity.ONDEMAND.value},
    )


def _spot_pool_gone(
    s: Session, svc: Services, job: Job, att: Attempt, sj: SlurmJob, now: datetime, plan: TickPlan
) -> None:
    """A job waiting for spot in a pool with too few usable nodes for its gang (a zone gone,
    its nodes down or drained): move it to the pool the policy picks, when that one has room.

    A pool that is merely busy is waited for (Slurm starts the job there). A forced partition,
    or GPUs asked by a type the other pool does not have, stay.
    """
    spec = stored_spec(job)
    pool = svc.settings.pool_of(att.partition or "")
    census = svc.market.censuses.get(pool.name) if pool is not None else None
    if spec.partition or pool is None or census is None or len(census.free_gpus) >= spec.nodes:
        return
    try:
        pools = fitting_pools(svc, spec)
    except SpecError:
        return
    view = _view_of(job, spec, now, pool=pool_index(pools, att.partition))
    views = pool_views(svc, spec, pools)
    choice = svc.policy.pool_after_preempt(view, Decision(Action.RESUME_SPOT, "its pool has no usable node"), views)
    if choice.pool is None or not views[choice.pool].room:
        return
    target = pools[choice.pool]
    if target.partition == att.partition or _typed_elsewhere(svc, job, target.partition):
        return
    plan.move.append((sj.job_id, target.partition))
    att.partition, att.capacity = target.partition, Capacity(target.capacity)
    job.partition, job.capacity = target.partition, Capacity(target.capacity)
    store.add_event(s, "moved", f"waiting for spot in {pool.name}, which has {len(census.free_gpus)} usable "
                    f"node(s) for a gang of {spec.nodes}; moved to {target.name} ({choice.reason})",
                    now=now, job_id=job.id)


def _view_of(job: Job, spec: JobSpec, now: datetime, *, done_s: int | None = None, pool: int | None = None,
             **kw: Any) -> JobView:
    """The policy's view of a stored job: its spec, age, progress (the stored one unless given) and reclaims."""
    view = job_view(spec, now=now, submitted_at=_utc(job.created_at),
                    done_s=job.done_s or 0 if done_s is None else done_s, reclaims=job.reclaims or 0, **kw)
    return view if pool is None else replace(view, pool=pool)


def _place_now(
    svc: Services, job: Job, spec: JobSpec, now: datetime, *, current: Capacity, done_s: int,
    safe_done_s: int | None = None,
) -> Placement:
    """The policy's placement for a job already in Slurm (waiting, or running on `current`)."""
    view = _view_of(job, spec, now, done_s=done_s, safe_done_s=safe_done_s, current=current)
    market = market_view(svc, spec.nodes)
    if current == Capacity.SPOT:
        # The job runs on spot, so spot is there for its gang whatever the last census said.
        market = replace(market, spot_available=max(market.spot_available, spec.nodes))
    return svc.policy.place(view, market)



def _deadline_while_running(
    s: Session, svc: Services, job: Job, att: Attempt, sj: SlurmJob, now: datetime, plan: TickPlan
) -> None:
    """A deadline job running on spot: ask the policy, as the simulator does at every step.

    When it says on-demand (above all when a reclaim now would leave too
    little time to finish there), requeue the job: the program gets TERM to
    checkpoint, and the next run starts on on-demand. The decision is stored
    first (the attempt is moving) and the requeue repeated each tick until
    Slurm has done it (the caller's). A forced partition (the user's choice) is never moved.
    """
    spec = stored_spec(job)
    if spec.partition:
        return
    attempts = list(s.execute(select(Attempt).where(Attempt.job_id == job.id).order_by(Attempt.number)).scalars())
    saves = svc.saves.latest(job.owner_name, checkpoint_dir_of(job)) if spec.checkpointable else None
    done, safe = progress_s(spec, attempts, now, saves.saved_at if saves else None)
    placement = _place_now(svc, job, spec, now, current=Capacity.SPOT, done_s=done, safe_done_s=safe)
    if placement.capacity != Capacity.ONDEMAND:
        return
    if _quota_holds(s, job, now, "it keeps running on spot"):
        return
    target = _cheapest_ondemand(svc, spec)
    if target is None:
        return  # no on-demand partition would start it (its limits): it keeps running on spot
    lifecycle.attempt_moving(s, job, att, target, placement.reason, now)
    plan.off_spot.append(sj.job_id)


def _cheapest_ondemand(svc: Services, spec: JobSpec) -> str | None:
    """The partition of the cheapest on-demand pool that fits the job (the first on-demand pool otherwise);
    None when that one's Slurm limits (MaxTime, MaxNodes) would never start it."""
    try:
        fit = [p for p in fitting_pools(svc, spec) if p.capacity == "ondemand"]
    except SpecError:
        fit = []
    if not fit:
        first = svc.settings.partition_for("ondemand")
        limits = svc.backend.partition_limits().get(first)
        return None if partition_refuses(limits, spec.time_limit_s, spec.nodes) else first
    prices = svc.market.pool_prices
    return min(fit, key=lambda p: (prices.get(p.name, 0) / p.speed, p.name)).partition


def _move_running(
    s: Session, svc: Services, job: Job, att: Attempt, sj: SlurmJob, now: datetime, plan: TickPlan
) -> None:
    """A checkpointing job running on paid capacity: ask the policy (``place_catalog``) whether it
    moves, and if so requeue it there. To an owned or reserved pool with room when the saving
    beats the changeover; from on-demand back to spot when the policy's rule for a job on
    on-demand says so, as the simulator asks it at every step (a reclaim or an outage sent the
    job there, and spot is back). A forced partition (the user's choice) never moves, and a
    move the group's class or GPU-type quota has no room for waits."""
    catalog = svc.settings.catalog()
    to_spot = att.capacity == Capacity.ONDEMAND and bool(catalog.of_class("spot"))
    if not catalog.of_class(*PREPAID_CLASSES) and not to_spot:
        return
    spec = stored_spec(job)
    if spec.partition or not spec.checkpointable:
        return
    try:
        pools = fitting_pools(svc, spec)
    except SpecError:
        return
    here = pool_index(pools, att.partition)
    if here is None or not any(p.prepaid or (to_spot and p.spot) for p in pools):
        return
    views = pool_views(svc, spec, pools)
    if not any(v.room for p, v in zip(pools, views, strict=True) if p.prepaid) and not (
            to_spot and spec.interruptible
            and any(v.market.spot_available >= spec.nodes and (v.market.spot_up_s or 0) > 0
                    for p, v in zip(pools, views, strict=True) if p.spot)):
        return  # nowhere to go now: skip the checkpoint probe
    attempts = list(s.execute(select(Attempt).where(Attempt.job_id == job.id).order_by(Attempt.number)).scalars())
    # A job that saves on a signal saves when the requeue's TERM reaches it: the move loses nothing.
    signal = spec.checkpoint_style == "signal"
    saves = None if signal else svc.saves.latest(job.owner_name, checkpoint_dir_of(job))
    done, safe = progress_s(spec, attempts, now, saves.saved_at if saves else None)
    if signal:
        safe = done
    view = _view_of(job, spec, now, done_s=done, safe_done_s=safe, current=Capacity(att.capacity), pool=here)
    choice = svc.policy.place_catalog(view, views)
    if choice.pool is None or choice.pool == here or choice.capacity not in (*PREPAID, Capacity.SPOT):
        return
    target = pools[choice.pool]
    full = budgets.pool_quota_full(s, job.group_name, svc.settings, budgets.job_size(job).gpus,
                                   target.partition, att.partition or "")
    if full is not None:
        _say_once(s, job, QUOTA_HELD, f"not moved to {target.name}: {full}; it keeps running on {att.partition}", now)
        return
    lifecycle.attempt_moving(s, job, att, target.partition, choice.reason, now, capacity=Capacity(target.capacity))
    plan.off_spot.append(sj.job_id)


QUOTA_HELD = "quota_held"
"""Event kind: a move to on-demand that the group's on-demand quota stopped."""


def _quota_holds(s: Session, job: Job, now: datetime, instead: str) -> bool:
    """True when the group's on-demand quota has no room for this job to move there.

    Quotas are the admins' hard limit, also for gbroker's own moves: the job
    stays on spot (``instead`` says how). A deadline job is asked again at
    every tick, so it moves once the quota has room; a job without a deadline
    resumes on spot and the policy is asked again at its next reclaim. Said
    once on the job (an event), not at every tick.
    """
    if job.capacity == Capacity.ONDEMAND:
        return False  # already counted there
    why = budgets.ondemand_quota_full(s, job.group_name, budgets.job_size(job).gpus)
    if why is None:
        return False
    _say_once(s, job, QUOTA_HELD, f"not moved to on-demand: {why}; {instead}", now)
    return True


def _say_once(s: Session, job: Job, kind: str, message: str, now: datetime) -> None:
    """An event on the job, unless its last event already says the same (asked again every tick)."""
    last = s.execute(
        select(Event).where(Event.job_id == job.id).order_by(Event.id.desc()).limit(1)
    ).scalar_one_or_none()
    if last is None or last.kind != kind or last.message != message:
        store.add_event(s, kind, message, now=now, job_id=job.id)


def _move(s: Session, job: Job, state: JobState, reason: str, now: datetime) -> None:
    if job.state != state or (job.reason or "") != reason:
        store.set_job_state(s, job, state, reason, now=now)


# -- settling an attempt that ended (left the queue, or was requeued) ----------
def _settle(
    s: Session,
    svc: Services,
    job: Job,
    att: Attempt,
    rows: list[SacctRow],
    still_queued: SlurmJob | None,
    now: datetime,
    plan: TickPlan,
    saves: SaveFacts | None,
) -> None:
    rows = sorted(rows, key=lambda r: (_utc(r.start) or now, r.end is None))
    if still_queued is not None:
        _requeued(s, svc, job, att, rows, still_queued, now, plan, saves)
        return
    own = att.slurm_restarts or 0
    later = sorted({r.restarts for r in rows if r.restarts > own})
    if later:
        # Slurm requeued it and ran it again while gbroker did not look (the controller was
        # down to it): settle this run, then the next one, each as its own attempt.
        nxt = _ran_again(s, svc, job, att, rows, later[0], now, saves)
        _settle(s, svc, job, nxt, rows, None, now, plan, None)
        return
    # This attempt's own run (accounting numbers a Slurm job's runs as Slurm counts restarts).
    rows = [r for r in rows if r.restarts == (att.slurm_restarts or 0)]
    if not rows:
        # Not in squeue, not (yet) in sacct: accounting may lag. Unknown, never completed.
        _move(s, job, JobState.UNKNOWN, f"Slurm job {att.slurm_job_id} not in squeue or sacct yet", now)
        return
    final = rows[-1]
    if final.end is None:
        # Accounting says it still runs (or waits), but the controller does not list it.
        if _unclear_for(svc, att, now) >= FORGOTTEN_AFTER:
            att.ended_at = svc.unclear_since[att.id]  # the first tick it was missing: last seen just before
            _lost_by_slurm(s, svc, job, att, saves, None, now, plan,
                           "the controller no longer knows it and accounting never closed it")
        else:
            _move(s, job, JobState.UNKNOWN, f"Slurm says {final.state_raw} but does not list it", now)
        return
    svc.unclear_since.pop(att.id, None)
    booting = _seen_booting(att)
    _ended_as(att, final)
    att.ended_at = att.ended_at or now
    att.exit_code = final.exit_code
    state = final.state
    if state == AttemptState.RECLAIMED and _boot_failure(normalize_job_state(final.state_raw), booting):
        _boot_failed(s, svc, job, att, None, now, plan, normalize_job_state(final.state_raw))
    elif state == AttemptState.COMPLETED:
        lifecycle.job_completed(s, job, att, now)
    elif state in (AttemptState.RECLAIMED, AttemptState.PREEMPTED):
        att.lost_s = _lost_s(att, saves)
        lifecycle.attempt_reclaimed(job, att, state)
        _recover(s, svc, job, att, now, plan, requeued=None)
    elif state == AttemptState.FAILED and final.exit_code == RESUME_EXIT:
        _continued(s, svc, job, att, None, now, plan, f"it saved and exited {RESUME_EXIT}")
    elif state == AttemptState.FAILED and final.exit_code == TIMED_OUT_EXIT:
        lifecycle.job_ended(s, job, att, JobState.TIMEOUT, "ran out of its time limit: it ended after the "
                            "time-limit warning without saving to go on", now)
    elif state == AttemptState.CANCELLED:
        lifecycle.job_ended(s, job, att, JobState.CANCELLED, f"cancelled in Slurm ({final.state_raw})", now)
    elif state == AttemptState.TIMEOUT:
        lifecycle.job_ended(s, job, att, JobState.TIMEOUT, "ran out of its time limit", now)
    elif state == AttemptState.FAILED:
        job.failures = (job.failures or 0) + 1
        spec = stored_spec(job)
        if job.failures > spec.max_retries:
            lifecycle.job_ended(s, job, att, JobState.FAILED, f"the program failed {job.failures} times (last exit "
                                f"{final.exit_code}); see {log_path_of(job)}", now)
        else:
            nxt = lifecycle.attempt_retried(s, job, att, f"retry {job.failures} after exit {final.exit_code}", now)
            s.flush()
            plan.sbatch.append((job.id, nxt.id))
    else:
        _move(s, job, JobState.UNKNOWN, f"Slurm says {final.state_raw}", now)


def _requeued(
    s: Session,
    svc: Services,
    job: Job,
    att: Attempt,
    rows: list[SacctRow],
    sj: SlurmJob,
    now: datetime,
    plan: TickPlan,
    saves: SaveFacts | None,
) -> None:
    """Slurm requeued the job: close the attempt the way its cause says, open the next on the same Slurm job.

    The cause comes from accounting's row for the ended run and the queue's
    reason: NODE_FAIL is a reclaim, PREEMPTED a preemption, REQUEUED gbroker's
    own move (recorded on the attempt), Slurm's launch failure (the job is
    held), or a requeue of the job's own. While Slurm is still requeueing it
    (REQUEUE* states) or accounting has no row yet, the attempt is left for a
    later tick, up to ``UNCLEAR_GRACE``.
    """
    # This attempt's own run: accounting numbers a Slurm job's runs 0, 1, ... as Slurm counts restarts.
    ended = [r for r in rows if r.restarts == (att.slurm_restarts or 0) and r.end is not None
             and r.state in ATTEMPT_TERMINAL]
    last = ended[-1] if ended else None
    if (last is None or sj.state_raw.upper().startswith("REQUEUE")) and _unclear_for(svc, att, now) < UNCLEAR_GRACE:
        return
    svc.unclear_since.pop(att.id, None)
    booting = _seen_booting(att)
    if last is not None:
        _ended_as(att, last)
    att.ended_at = att.ended_at or now
    cause = normalize_job_state(last.state_raw) if last is not None else "NODE_FAIL"
    if cause == "REQUEUED" and is_failure_hold(sj.reason):
        _lost_by_slurm(s, svc, job, att, saves, sj, now, plan, sj.reason)
        return
    if _boot_failure(cause, booting):
        _boot_failed(s, svc, job, att, sj, now, plan, cause)
        return
    if cause == "REQUEUED" and _withdrawn_at_budget(s, job, att):
        _withdrawn(s, svc, job, att, sj, now, plan)
        return
    att.lost_s = _lost_s(att, saves)
    if att.state == AttemptState.MOVING and cause == "REQUEUED":
        # Our own requeue, not a reclaim: the next run is where the move placed the job.
        if job.partition and job.partition != att.partition:
            partition, capacity = job.partition, Capacity(job.capacity)
        else:  # a move recorded before moves named their target: they all went to on-demand
            partition, capacity = svc.settings.partition_for("ondemand"), Capacity.ONDEMAND
        lifecycle.attempt_moved(s, job, att, partition, now)
        _next_attempt(s, svc, job, capacity, f"moving to {partition} {lifecycle.move_goal(capacity)}", sj,
                      start_now=True, now=now, plan=plan, partition=partition)
        return
    if cause == "REQUEUED":
        # Requeued by the program itself (or its owner): it goes on, nothing was taken from it.
        _continued(s, svc, job, att, sj, now, plan, "it requeued itself")
        return
    preempted = last is not None and last.state == AttemptState.PREEMPTED
    lifecycle.attempt_reclaimed(job, att, AttemptState.PREEMPTED if preempted else AttemptState.RECLAIMED)
    _recover(s, svc, job, att, now, plan, requeued=sj)


def _ended_as(att: Attempt, row: SacctRow) -> None:
    """The attempt's end, and its start and nodes where not known yet, as accounting's row of its run says."""
    att.ended_at = _utc(row.end)
    att.started_at = att.started_at or _utc(row.start)
    att.nodes = att.nodes or ",".join(row.nodelist)


def _ran_again(
    s: Session, svc: Services, job: Job, att: Attempt, rows: list[SacctRow], restarts: int, now: datetime,
    saves: SaveFacts | None,
) -> Attempt:
    """The attempt's run ended in a requeue, and Slurm has already run the job again (run
    ``restarts``) and taken it out of the queue: the policy has nothing left to choose.

    Closes the attempt the way its run ended and opens the attempt of the run that
    followed, on the same Slurm job, where Slurm ran it (the caller settles it).
    """
    svc.unclear_since.pop(att.id, None)
    mine = [r for r in rows if r.restarts == (att.slurm_restarts or 0) and r.end is not None]
    after = next(r for r in rows if r.restarts == restarts)
    last = mine[-1] if mine else None
    booting = _seen_booting(att)
    if last is not None:
        _ended_as(att, last)
    att.ended_at = att.ended_at or _utc(after.start) or now
    att.lost_s = _lost_s(att, saves)
    cause = normalize_job_state(last.state_raw) if last is not None else "NODE_FAIL"
    partition = after.partition or att.partition or job.partition or ""
    capacity = Capacity(svc.settings.capacity_of(partition) or att.capacity)
    if _boot_failure(cause, booting):
        lifecycle.attempt_boot_failed(s, job, att, _boot_why(cause), now)
        reason = f"boot failure on {att.nodes or '?'}; Slurm ran it again on {partition}"
    elif att.state == AttemptState.MOVING and cause == "REQUEUED":
        lifecycle.attempt_moved(s, job, att, partition, now)
        reason = f"moved to {partition}"
    elif cause == "REQUEUED":
        lifecycle.attempt_continued(s, job, att, "it requeued itself", now, limit=False)
        reason = "continuing: it requeued itself"
    else:
        preempted = last is not None and last.state == AttemptState.PREEMPTED
        lifecycle.attempt_reclaimed(job, att, AttemptState.PREEMPTED if preempted else AttemptState.RECLAIMED)
        lost = f"{att.lost_s}s of work lost" if att.lost_s is not None else "lost work unknown"
        store.add_event(s, att.state.value,
                        f"attempt {att.number} {att.state.value} on {att.nodes or '?'} ({lost}); Slurm ran "
                        f"it again on {partition} before gbroker saw the requeue", now=now, job_id=job.id)
        reason = f"requeued by Slurm onto {partition}"
    assert att.slurm_job_id is not None  # its runs came from accounting by this id
    return lifecycle.attempt_next(s, job, capacity, partition, reason, now, slurm_run=(att.slurm_job_id, restarts))


def _continued(
    s: Session, svc: Services, job: Job, att: Attempt, sj: SlurmJob | None, now: datetime, plan: TickPlan,
    how: str,
) -> None:
    """The program stopped to go on in a new run: not a reclaim, not a failure, its work kept.

    ``sj`` is the same Slurm job requeued (Lightning's auto_requeue); without
    it the program exited 75 and the next run is a new submission. Either way
    on the same capacity, at once.
    """
    if not lifecycle.attempt_continued(s, job, att, how, now):
        if sj is not None:
            plan.cancel.append(sj.job_id)
        return
    _next_attempt(s, svc, job, Capacity(att.capacity), f"continuing: {how}", sj, start_now=True, now=now,
                  plan=plan)


UNCLEAR_GRACE = timedelta(seconds=60)
"""How long a requeued run may wait for Slurm's picture (the requeue done, accounting's row)
before it is settled with what is known."""
FORGOTTEN_AFTER = timedelta(seconds=120)
"""How long a run accounting calls running may be missing from the controller's queue
before it counts as lost (after a controller restart that forgot it)."""


def _unclear_for(svc: Services, att: Attempt, now: datetime) -> timedelta:
    """How long this attempt's end has been unclear (zero the first time it is asked)."""
    return now - svc.unclear_since.setdefault(att.id, now)


def _lost_by_slurm(
    s: Session, svc: Services, job: Job, att: Attempt, saves: SaveFacts | None, sj: SlurmJob | None,
    now: datetime, plan: TickPlan, why: str,
) -> None:
    """Slurm lost the run itself: not a reclaim, not the program's failure; it runs again.

    ``sj`` is the same Slurm job, requeued held (released here); without it the
    Slurm job is gone and the next attempt is a new submission.
    """
    svc.unclear_since.pop(att.id, None)
    att.ended_at = att.ended_at or now
    lifecycle.attempt_lost(s, job, att, why, _lost_s(att, saves), now)
    _next_attempt(s, svc, job, Capacity(att.capacity), f"Slurm lost attempt {att.number}", sj,
                  start_now=True, now=now, plan=plan)
    if sj is not None:
        _release_failure_hold(s, job, sj, now, plan)


BOOT_FAILURE_CAUSES = ("NODE_FAIL", "BOOT_FAIL")
"""How accounting ends a run whose node failed: before the program started, that is a boot failure."""
BOOT_FAILURES_PER_NODE = 2
"""Boot failures of one node for a job, after which the job is kept off that node."""
NODES_EXCLUDED = "nodes_excluded"
"""Event kind: a run kept off nodes that failed to boot for the job."""


def _seen_booting(att: Attempt) -> bool:
    """True when gbroker last saw the attempt's run waiting for its nodes to boot (CONFIGURING),
    never running: call before the run's accounting row fills in its nodes."""
    return att.state == AttemptState.PENDING and bool(att.nodes)


def _withdrawn_at_budget(s: Session, job: Job, att: Attempt) -> bool:
    """True when the ledger held this Slurm job for its group's budget and the hold is still on:
    a requeue then is the ledger's own (``requeuehold`` of a job whose nodes were booting)."""
    return s.execute(select(exists().where(
        BudgetHold.job_id == job.id, BudgetHold.slurm_job_id == att.slurm_job_id,
        BudgetHold.released_at.is_(None)))).scalar_one()


def _withdrawn(s: Session, svc: Services, job: Job, att: Attempt, sj: SlurmJob, now: datetime,
               plan: TickPlan) -> None:
    """The run went back to the queue held before it started: the next attempt waits, held, on the same job."""
    lifecycle.attempt_withdrawn(s, job, att, now)
    _next_attempt(s, svc, job, Capacity(att.capacity), BUDGET_HELD, sj, start_now=False, now=now, plan=plan,
                  partition=att.partition)
    store.set_job_state(s, job, JobState.HELD, BUDGET_HELD, now=now)


def _boot_failure(cause: str, seen_booting: bool) -> bool:
    """A run whose node never came up: Slurm says BOOT_FAIL, or NODE_FAIL of a run gbroker only
    ever saw booting (Slurm's ResumeTimeout passed: node reason "ResumeTimeout reached", and the
    batch script never started, so accounting has no batch step)."""
    return cause == "BOOT_FAIL" or (cause == "NODE_FAIL" and seen_booting)


def _boot_why(cause: str) -> str:
    return f"Slurm gave up waiting for the boot and ended the run {cause}"


def _boot_failed(
    s: Session, svc: Services, job: Job, att: Attempt, sj: SlurmJob | None, now: datetime, plan: TickPlan,
    cause: str,
) -> None:
    """The run's node never came up: not a reclaim, no work lost, nothing charged; the job runs
    again at once where it was placed (``sj``: the same Slurm job requeued, else a new submission),
    kept off a node that has failed to boot for it ``BOOT_FAILURES_PER_NODE`` times."""
    lifecycle.attempt_boot_failed(s, job, att, _boot_why(cause), now)
    _next_attempt(s, svc, job, Capacity(att.capacity), f"boot failure on {att.nodes or '?'}; it runs again", sj,
                  start_now=True, now=now, plan=plan, partition=att.partition)


def _failed_boot_nodes(s: Session, job: Job) -> list[str]:
    """The nodes that failed to boot for this job ``BOOT_FAILURES_PER_NODE`` times or more."""
    counts: dict[str, int] = {}
    for a in store.job_attempts(s, job.id):
        if a.state == AttemptState.BOOT_FAILED:
            for node in filter(None, (a.nodes or "").split(",")):
                counts[node] = counts.get(node, 0) + 1
    return sorted(n for n, c in counts.items() if c >= BOOT_FAILURES_PER_NODE)


def _keep_off_failed_boots(s: Session, job: Job, att: Attempt, slurm_id: int, now: datetime,
                           plan: TickPlan) -> None:
    """Keep the waiting run off the nodes that keep failing to boot for the job (Slurm's
    ExcNodeList), once per attempt: Slurm would otherwise wake the same broken node again."""
    nodes = _failed_boot_nodes(s, job)
    if not nodes:
        return
    message = (f"attempt {att.number} (Slurm job {slurm_id}) kept off {','.join(nodes)}: failed to boot "
               f"for this job {BOOT_FAILURES_PER_NODE} times or more")
    told = s.execute(select(Event.id).where(Event.job_id == job.id, Event.kind == NODES_EXCLUDED,
                                            Event.message == message).limit(1)).first()
    if told is not None:
        return
    plan.exclude.append((slurm_id, ",".join(nodes)))
    store.add_event(s, NODES_EXCLUDED, message, now=now, job_id=job.id, data={"nodes": nodes})


def _recover(
    s: Session,
    svc: Services,
    job: Job,
    att: Attempt,
    now: datetime,
    plan: TickPlan,
    requeued: SlurmJob | None,
) -> None:
    """Ask the policy what to do after a reclaim, and plan it."""
    # The rates the policy reads count this reclaim too (the tick's first refresh did not).
    s.flush()
    _refresh_market(s, svc, now)
    spec = stored_spec(job)
    attempts = list(s.execute(select(Attempt).where(Attempt.job_id == job.id).order_by(Attempt.number)).scalars())
    view = _view_of(job, spec, now)
    decision = svc.policy.on_preempt(view, attempt_views(attempts), market_view(svc, spec.nodes))
    lost = f"{att.lost_s}s of work lost" if att.lost_s is not None else "lost work unknown"
    store.add_event(
        s, att.state.value,
        f"attempt {att.number} {att.state.value} on {att.nodes or '?'} ({lost}); "
        f"policy: {decision.action.value} — {decision.reason}",
        now=now, job_id=job.id, data={"policy": decision.action.value},
    )
    if decision.action == Action.GIVE_UP:
        if requeued is not None:
            plan.cancel.append(requeued.job_id)
        store.set_job_state(s, job, JobState.DEADLINE_MISSED, decision.reason, now=now)
        return
    capacity = Capacity(att.capacity)
    reason = f"{decision.action.value}: {decision.reason}"
    if decision.action == Action.MOVE_ONDEMAND:
        capacity = Capacity.ONDEMAND
        if _quota_holds(s, job, now, "it resumes on spot"):
            capacity, reason = Capacity.SPOT, "resume on spot: the group's on-demand quota is full"
            decision = replace(decision, action=Action.RESUME_SPOT)
    elif decision.action == Action.RESUME_SPOT:
        capacity = Capacity.SPOT
    partition = None
    if not spec.partition:
        try:
            pools = fitting_pools(svc, spec)
        except SpecError:
            pools = []
        if pools:
            choice = svc.policy.pool_after_preempt(replace(view, pool=pool_index(pools, att.partition)), decision,
                                                   pool_views(svc, spec, pools))
            if choice.pool is not None:
                pool = pools[choice.pool]
                partition, capacity = pool.partition, Capacity(pool.capacity)
                if svc.settings.pools:  # a catalog: say which pool (two legacy pools need no name)
                    reason = f"{reason}; {choice.reason}"
    _next_attempt(s, svc, job, capacity, reason, requeued,
                  start_now=decision.action != Action.WAIT, now=now, plan=plan, partition=partition)


def _next_attempt(
    s: Session,
    svc: Services,
    job: Job,
    capacity: Capacity,
    reason: str,
    requeued: SlurmJob | None,
    *,
    start_now: bool,
    now: datetime,
    plan: TickPlan,
    partition: str | None = None,
) -> None:
    """Open the job's next attempt on `capacity` (in `partition`, else the first pool of that
    class) and plan what Slurm must do for it."""
    if partition is None:
        partition = job.partition if capacity == Capacity(job.capacity) and job.partition else \
            svc.settings.partition_for(capacity.value)
    if requeued is not None and partition != requeued.partition and _typed_elsewhere(svc, job, partition):
        # Its GPUs were asked by type, and the other pool's type differs: a new submission.
        plan.cancel.append(requeued.job_id)
        requeued = None
    nxt = lifecycle.attempt_next(s, job, capacity, partition, reason, now,
                                 slurm_run=(requeued.job_id, requeued.restarts) if requeued is not None else None)
    if requeued is not None:
        # Same Slurm job, next run: no new sbatch, just skip the requeue delay.
        if requeued.state == AttemptState.PENDING:
            if partition != requeued.partition:
                plan.move.append((requeued.job_id, partition))
            _keep_off_failed_boots(s, job, nxt, requeued.job_id, now, plan)
            if start_now:
                plan.start_now.append(requeued.job_id)
        elif _started_again(requeued, job, nxt):
            lifecycle.attempt_restarted(s, job, nxt, ",".join(requeued.nodes), _utc(requeued.start_time) or now, now)
    else:
        s.flush()
        plan.sbatch.append((job.id, nxt.id))


def _typed_elsewhere(svc: Services, job: Job, partition: str) -> bool:
    """True when the job asked for GPUs by type or memory and ``partition``'s pool has another type."""
    spec = stored_spec(job)
    if not (spec.gpu_types or spec.gpu_mem_gb):
        return False
    here, there = svc.settings.pool_of(job.partition or ""), svc.settings.pool_of(partition)
    return here is None or there is None or here.gpu_type != there.gpu_type


def _started_again(sj: SlurmJob, job: Job, nxt: Attempt) -> bool:
    """True when the Slurm job runs the attempt ``nxt`` (its first run, or its next after a requeue).

    A job just requeued can still show RUNNING-like states of the run that
    ended (COMPLETING, or RUNNING with the old start time): taking the next
    attempt for running then would make a phantom run of 0 s. Only a run that
    started after every earlier attempt ended counts.
    """
    if sj.state_raw.upper() != "RUNNING" or sj.start_time is None:
        return False
    ends = [_utc(a.ended_at) for a in job.attempts if a.id != nxt.id and a.ended_at is not None]
    start = _utc(sj.start_time)
    return start is not None and all(start >= e for e in ends if e is not None)


SAVE_CLOCK_SLACK_S = 5
"""A save stamped this much after the attempt's end still counts for it (node and controller clocks)."""


def _lost_s(att: Attempt, saves: SaveFacts | None) -> int:
    """Work lost since the last save in this attempt (all of the attempt when none is known).

    ``saves`` is what the checkpoint directory showed, learned as its owner;
    a save outside this attempt's run says nothing about it.
    """
    run = lifecycle.run_s(att)
    saved = saves.saved_at if saves is not None else None
    if saved is None or att.started_at is None or att.ended_at is None:
        return run
    saved_dt = datetime.fromtimestamp(saved, UTC)
    start, end = _utc(att.started_at), _utc(att.ended_at)
    assert start is not None and end is not None
    if saved_dt < start or saved_dt > end + timedelta(seconds=SAVE_CLOCK_SLACK_S):
        return run
    return max(0, int((end - min(saved_dt, end)).total_seconds()))


# -- acting on the plan, batched -------------------------------------------------
def _slurm_step(svc: Services, now: datetime, what: str, step: Callable[[], None]) -> bool:
    """Run one batch of Slurm actions. False: Slurm is down, act no further this tick.
    A refusal is only logged: the job may have moved on meanwhile, the next tick sees the truth."""
    try:
        step()
    except SlurmUnavailable as exc:
        svc.slurm_down(now, str(exc))
        return False
    except SlurmError as exc:
        log.warning("%s failed: %s (%s)", what, exc, exc.stderr.strip())
    return True


def _act(svc: Services, plan: TickPlan, now: datetime) -> None:
    def recovery() -> None:
        if plan.cancel:
            svc.backend.cancel(plan.cancel)
        if plan.release:
            svc.backend.release(plan.release)
        for slurm_id, partition in plan.move:
            svc.backend.update(slurm_id, partition=partition)
        for slurm_id, nodes in plan.exclude:  # before the start: the run must not wake those nodes again
            svc.backend.update(slurm_id, exclude_nodes=nodes)
        if plan.start_now:
            svc.backend.start_now(plan.start_now)

    if plan.off_spot and not _slurm_step(svc, now, "requeue to move", lambda: svc.backend.requeue(plan.off_spot)):
        return
    if not _slurm_step(svc, now, "recovery action", recovery):
        return
    for job_id, attempt_id in plan.sbatch:
        try:
            sbatch_attempt(svc, job_id, attempt_id)
        except SlurmUnavailable as exc:
            svc.slurm_down(now, str(exc))
            return
        except BrokerError as exc:
            why = exc.stderr.strip() if isinstance(exc, SlurmError) else exc.message
            log.warning("job %s: resubmission refused: %s", job_id, why)
            with svc.tx() as s:
                job = must_get(s, Job, job_id)
                att = must_get(s, Attempt, attempt_id)
                lifecycle.job_ended(s, job, att, JobState.FAILED, f"the resubmission was refused: {why}", now,
                                    ended_at=now)


def _act_arrays(svc: Services, plan: arrays.ArrayPlan, now: datetime) -> None:
    """The arrays' Slurm actions: move requeued tasks, start them now, sbatch the batches decided."""
    def moves() -> None:
        for slurm_id, partition in plan.move:
            svc.backend.update(slurm_id, partition=partition)

    if plan.move and not _slurm_step(svc, now, "move requeued array tasks", moves):
        return
    if plan.start_now and not _slurm_step(svc, now, "start requeued array tasks",
                                          lambda: svc.backend.start_now(sorted(set(plan.start_now)))):
        return
    for job_id, batch_id in plan.sbatch:
        try:
            sbatch_batch(svc, job_id, batch_id)
        except SlurmUnavailable as exc:
            svc.slurm_down(now, str(exc))
            return
        except BrokerError as exc:
            why = exc.stderr.strip() if isinstance(exc, SlurmError) else exc.message
            log.warning("array job %s: batch refused: %s", job_id, why)
            with svc.tx() as s:
                job = must_get(s, Job, job_id)
                if JobState(job.state) not in TERMINAL:
                    lifecycle.job_cancelled(s, job, f"Slurm refused the array: {why}", now)


def _mark_unknown(svc: Services, now: datetime, why: str) -> None:
    with svc.tx() as s:
        for job, _ in active_with_latest(s):
            if job.state in (JobState.PENDING, JobState.RUNNING, JobState.COMPLETING, JobState.HELD,
                             JobState.RECOVERING):
                store.set_job_state(s, job, JobState.UNKNOWN, why, now=now)
