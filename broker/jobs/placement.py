"""Build the policy's views (JobView, MarketView) from what the daemon knows.

The policies are pure; this is where the daemon's facts are turned into their
arguments: the job's size and deadline, and the spot reclaim rate observed on
the real cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from broker.config import Settings
from broker.db.models import Attempt
from broker.errors import SpecError
from broker.market import ReclaimHistory
from broker.slurm.hostlist import expand
from broker.spec import JobSpec
from broker.state import Services
from policies import AttemptView, Capacity, JobView, MarketView

RECLAIM_WINDOW = timedelta(days=7)
"""How far back the observed spot reclaim rate looks."""


def capacity_of_partition(settings: Settings, partition: str) -> str:
    """The capacity of a partition a job may name: one of the ``[partitions]`` table's."""
    capacity = settings.capacity_of(partition) if partition in settings.partitions else None
    if capacity is not None:
        return capacity
    raise SpecError(
        f"partition: {partition!r} is not managed by gbroker",
        hint=f"use {settings.spot_partition} or {settings.ondemand_partition}, or leave it to the policy",
    )


def job_view(
    spec: JobSpec,
    *,
    now: datetime,
    submitted_at: datetime | None = None,
    done_s: int = 0,
    reclaims: int = 0,
    current: Capacity = Capacity.NONE,
    changeover_s: int = 60,
    safe_done_s: int | None = None,
) -> JobView:
    start = submitted_at or now
    deadline_s = int((spec.deadline - start).total_seconds()) if spec.deadline else None
    return JobView(
        kind=spec.kind,
        nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        interruptible=spec.interruptible,
        checkpointable=spec.checkpoint_style != "none",
        work_s=spec.time_limit_s,
        done_s=done_s,
        elapsed_s=max(0, int((now - start).total_seconds())),
        deadline_s=deadline_s,
        changeover_s=changeover_s,
        current=current,
        reclaims=reclaims,
        safe_done_s=safe_done_s,
    )


def progress_s(
    spec: JobSpec, attempts: Sequence[Attempt], now: datetime, saved_at: float | None = None
) -> tuple[int, int]:
    """(work done, work that survives a reclaim now), in seconds of running.

    Ended runs count what they kept (run time minus the work they lost); the
    running one counts all its time as done and, for a job that checkpoints,
    its time up to its last save (``saved_at``, epoch seconds, as its
    checkpoint directory last showed it) as safe. A job that cannot checkpoint
    keeps nothing from any run until it completes.
    """
    checkpoints = spec.checkpoint_style != "none" and bool(spec.checkpoint_dir)
    kept = 0
    current_run = current_safe = 0
    for a in attempts:
        if a.started_at is None:
            continue
        start = _aware(a.started_at)
        if a.ended_at is None:
            current_run = max(0, int((now - start).total_seconds()))
            saved = saved_at if checkpoints else None
            if saved is not None:
                current_safe = min(current_run, max(0, int(saved - start.timestamp())))
        elif checkpoints:
            run = max(0, int((_aware(a.ended_at) - start).total_seconds()))
            kept += max(0, run - (a.lost_s or 0))
    if not checkpoints:
        return current_run, 0
    return min(spec.time_limit_s, kept + current_run), min(spec.time_limit_s, kept + current_safe)


def reclaim_history(session, now: datetime) -> ReclaimHistory:  # type: ignore[no-untyped-def]
    """Spot attempts started in the recent window: reclaims and hours, by gang size."""
    since = now - RECLAIM_WINDOW
    rows = session.execute(
        select(Attempt.state, Attempt.started_at, Attempt.ended_at, Attempt.nodes).where(
            Attempt.capacity == "spot", Attempt.started_at.is_not(None), Attempt.started_at >= since
        )
    ).all()
    by_nodes: dict[int, tuple[int, float]] = {}
    for state, started, ended, nodes in rows:
        end = ended or now
        hours = max(0.0, (_aware(end) - _aware(started)).total_seconds()) / 3600
        size = len(expand(nodes)) or 1
        r, h = by_nodes.get(size, (0, 0.0))
        by_nodes[size] = (r + (state in ("reclaimed", "preempted")), h + hours)
    return ReclaimHistory(by_nodes)


def market_view(svc: Services, nodes: int = 1) -> MarketView:
    """The market as of the last tick, as a gang of ``nodes`` nodes sees it."""
    return svc.market.for_gang(nodes)


def attempt_views(attempts: Sequence[Attempt]) -> list[AttemptView]:
    out = []
    for a in attempts:
        run_s = 0
        if a.started_at and a.ended_at:
            run_s = int((_aware(a.ended_at) - _aware(a.started_at)).total_seconds())
        out.append(AttemptView(Capacity(a.capacity), run_s, a.state, a.lost_s or 0))
    return out


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)
