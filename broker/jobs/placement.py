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
from broker.money.pricing import PriceBook
from broker.pools import Pool, fitting, limits_hint, partition_refuses, refusal
from broker.slurm.hostlist import expand
from broker.spec import JobSpec
from broker.state import Services
from policies import AttemptView, Capacity, JobView, MarketView, PoolChoice, PoolView

RECLAIM_WINDOW = timedelta(days=7)
"""How far back the observed spot reclaim rate looks."""


def capacity_of_partition(settings: Settings, partition: str) -> str:
    """The capacity class of a partition a job may name: one of the pool catalog's."""
    capacity = settings.capacity_of(partition) if partition in settings.partitions else None
    if capacity is not None:
        return capacity
    raise SpecError(
        f"partition: {partition!r} is not managed by gbroker",
        hint=f"use one of {', '.join(sorted(settings.partitions))} (`gbroker pools` lists them), "
        "or leave it to the policy",
    )


def fitting_pools(svc: Services, spec: JobSpec) -> list[Pool]:
    """The catalog's pools that can hold the job, in catalog order; none: refused with each pool's reason."""
    catalog = svc.settings.catalog()
    if spec.partition:
        pool = catalog.by_partition(spec.partition)
        if pool is None:
            capacity_of_partition(svc.settings, spec.partition)  # raises the message
            raise AssertionError("unreachable")
        if pool.capacity == "spot" and not spec.interruptible:
            raise SpecError(f"partition {spec.partition} is spot capacity, which may be reclaimed at any time, "
                            "but the job says interruptible = false",
                            hint="drop partition to let gbroker place it, name an owned, reserved or on-demand "
                                 "partition, or set interruptible = true; nothing was stored")
        pools = [pool]
    else:
        pools = list(catalog.pools)
    nodes_of = {p.name: c.nodes for p in pools if (c := svc.market.censuses.get(p.name)) and c.nodes}
    ok, why = fitting(pools, spec.gpu_request(), nodes_of)
    if not ok:
        raise SpecError(refusal(why), hint="ask for less (gpu, gpu_mem_gb, GPUs per node, nodes, cpus, mem), "
                        "or see `gbroker pools` for what each pool has; nothing was stored")
    return within_partition_limits(svc, spec, ok, why)


def within_partition_limits(svc: Services, spec: JobSpec, pools: list[Pool], why: dict[str, str]) -> list[Pool]:
    """The pools whose Slurm partition would start the job (its time limit within MaxTime, its nodes
    within MinNodes..MaxNodes), in the same order; none: refused, naming each limit and what to do.

    Slurm takes such a job and leaves it pending for ever (PartitionTimeLimit), so a pool
    that cannot take it is skipped here, for a submission and for a move alike. The limits
    are the Slurm layer's, read at most every 30 s (``Backend.partition_limits``)."""
    over = refused_by_limits(svc, spec, pools)
    takes = [p for p in pools if p.name not in over]
    if not takes:
        limits = svc.backend.partition_limits()
        known = [limits[p.partition] for p in pools if p.partition in limits]
        raise SpecError(refusal({**over, **why}), hint=limits_hint(known, spec.time_limit_s, spec.nodes))
    return takes


def refused_by_limits(svc: Services, spec: JobSpec, pools: Sequence[Pool]) -> dict[str, str]:
    """Pool name -> why its partition would never start the job (MaxTime, MaxNodes, MinNodes, State)."""
    limits = svc.backend.partition_limits()
    over = {}
    for p in pools:
        reason = partition_refuses(limits.get(p.partition), spec.time_limit_s, spec.nodes)
        if reason is not None:
            over[p.name] = reason
    return over


def gres_type_for(spec: JobSpec, pool: Pool | None) -> str | None:
    """The gres type sbatch names: the pool's, when the job asked for a type or for GPU memory.

    A job that asked for neither gets untyped GPUs, so Slurm may requeue it
    into another pool's partition without changing its request.
    """
    if pool is None or not (spec.gpu_types or spec.gpu_mem_gb):
        return None
    return pool.gpu_type


DEFAULT_PRICES = {"spot": MarketView.spot_price_micros, "ondemand": MarketView.ondemand_price_micros}


def pool_price(book: PriceBook, pool: Pool, now: datetime) -> int:
    """Per GPU-hour for the policy: the price book's (with the pools' configured prices,
    ``pricebook.load``), else the policies' default for the class."""
    price = book.price_at(pool.partition, pool.capacity, now)
    return DEFAULT_PRICES.get(pool.capacity, 0) if price is None else price


def pool_views(svc: Services, spec: JobSpec, pools: Sequence[Pool]) -> list[PoolView]:
    """The policy's picture of each pool for this job: class, price, speed, room, own spot market."""
    watch = svc.market
    base = watch.for_gang(spec.nodes)
    out = []
    for p in pools:
        room = watch.room(p.name, spec.nodes, spec.gpus_per_node)
        market = watch.for_pool(p.name, spec.nodes) if p.spot else base
        price = watch.pool_prices.get(p.name, DEFAULT_PRICES.get(p.capacity, 0))
        out.append(PoolView(p.name, Capacity(p.capacity), price, p.speed, True if room is None else room, market))
    return out


def place_in_pools(svc: Services, spec: JobSpec, view: JobView, pools: Sequence[Pool]) -> tuple[Pool, PoolChoice]:
    """Ask the policy among ``pools``; (the pool to submit to, the choice). A choice to wait
    without a pool waits in the first pool's queue."""
    choice = svc.policy.place_catalog(view, pool_views(svc, spec, pools))
    pool = pools[choice.pool] if choice.pool is not None else pools[0]
    return pool, choice


def pool_index(pools: Sequence[Pool], partition: str | None) -> int | None:
    for k, p in enumerate(pools):
        if p.partition == partition:
            return k
    return None


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
    return _reclaims(session, now)[0]


def reclaim_history_by_partition(session, now: datetime) -> dict[str, ReclaimHistory]:  # type: ignore[no-untyped-def]
    """The same, per partition (each spot pool's own reclaim rate)."""
    return _reclaims(session, now)[1]


def _reclaims(session, now: datetime) -> tuple[ReclaimHistory, dict[str, ReclaimHistory]]:  # type: ignore[no-untyped-def]
    since = now - RECLAIM_WINDOW
    rows = session.execute(
        select(Attempt.state, Attempt.started_at, Attempt.ended_at, Attempt.nodes, Attempt.partition).where(
            Attempt.capacity == "spot", Attempt.started_at.is_not(None), Attempt.started_at >= since
        )
    ).all()
    every: dict[int, tuple[int, float]] = {}
    parts: dict[str, dict[int, tuple[int, float]]] = {}
    for state, started, ended, nodes, partition in rows:
        end = ended or now
        hours = max(0.0, (_aware(end) - _aware(started)).total_seconds()) / 3600
        size = len(expand(nodes)) or 1
        hit = state in ("reclaimed", "preempted")
        for table in (every, parts.setdefault(partition or "", {})):
            r, h = table.get(size, (0, 0.0))
            table[size] = (r + hit, h + hours)
    return ReclaimHistory(every), {p: ReclaimHistory(t) for p, t in parts.items()}


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


def pool_table(svc: Services) -> list[dict[str, object]]:
    """The catalog as ``gbroker pools`` shows it: each pool, its GPUs free and busy, price, reclaims."""
    from broker.amount import format_money

    watch = svc.market
    out: list[dict[str, object]] = []
    for p in svc.settings.catalog().pools:
        c = watch.censuses.get(p.name)
        price = watch.pool_prices.get(p.name)
        row: dict[str, object] = {
            "name": p.name, "partition": p.partition, "capacity": p.capacity, "gpu_type": p.gpu_type,
            "gpu_mem_gb": p.gpu_mem_gb, "gpus_per_node": p.gpus_per_node, "speed": p.speed, "zone": p.zone,
            "billing": p.billing.describe(), "power_down": p.power_down,
            "nodes": c.nodes if c else None, "gpus": c.gpus if c else None,
            "busy_gpus": c.busy_gpus if c else None, "free_gpus": sum(c.free_gpus) if c else None,
            "price_micros": price, "price": format_money(price) if price is not None else None,
            "reclaims_per_hour": None, "spot_available": None,
        }
        if p.spot:
            m = watch.for_pool(p.name)
            row["reclaims_per_hour"] = round(m.spot_reclaim_rate_per_hour, 4)
            row["spot_available"] = m.spot_available if m.lookback_s or c else None
        out.append(row)
    return out
