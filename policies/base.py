"""The placement policy contract.

A policy is a pure object: its methods read nothing but their arguments (no
database, no Slurm, no wall clock). The daemon and the simulator call the
very same objects, so a result in the simulator is a result in production.

Units: time in whole seconds, money in integer micro-units per GPU-hour.

    place(job, market)              -> Placement   at submit, at every resume,
                                                   and (simulator) every step
    on_preempt(job, history, market) -> Decision   after a reclaim/preemption
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import ClassVar
from collections.abc import Sequence


class Capacity(str, Enum):
    """Where a job (attempt) runs."""

    SPOT = "spot"
    """Cheap, can be reclaimed at any moment."""
    ONDEMAND = "ondemand"
    """Full price, never reclaimed."""
    NONE = "none"
    """Not running: wait (the simulator idles; the daemon keeps the job pending)."""
    OWNED = "owned"
    """The lab's own nodes: already paid for, never reclaimed."""
    RESERVED = "reserved"
    """Reserved for months: already paid for, never reclaimed."""


PREPAID = frozenset({Capacity.OWNED, Capacity.RESERVED})
"""Capacity already paid for: its marginal cost is its internal rate."""


@dataclass(frozen=True)
class JobView:
    """What a policy may know about one job."""

    kind: str = "other"
    nodes: int = 1
    gpus_per_node: int = 1
    interruptible: bool = True
    checkpointable: bool = True
    """False: work since the start of the attempt is lost on a reclaim."""
    work_s: int = 3600
    """Total work, in seconds of running (the time limit, or the user's estimate)."""
    done_s: int = 0
    """Work already done and safe (checkpointed)."""
    elapsed_s: int = 0
    """Seconds since submission."""
    deadline_s: int | None = None
    """Seconds from submission to the deadline; None = no deadline."""
    changeover_s: int = 0
    """Seconds lost each time the job starts on a new instance (boot, load checkpoint)."""
    current: Capacity = Capacity.NONE
    """What the job runs on right now."""
    reclaims: int = 0
    """How many of its attempts were reclaimed so far."""
    budget_left_micros: int | None = None
    """Money the job's group may still spend this semester (None = no budget)."""
    pool: int | None = None
    """Several spot pools (``Policy.place_pools``): the index of the pool of the
    job's current or last spot attempt; None = never on spot (or one pool)."""
    checkpoint_interval_s: int | None = None
    """How often the job saves; None = ``DEFAULT_CHECKPOINT_INTERVAL_S`` when it checkpoints."""
    safe_done_s: int | None = None
    """Work that survives a reclaim (last checkpoint); None = ``done_s``.

    For a job that cannot checkpoint this is 0 until it completes, so a policy
    can see how much a move would throw away."""

    @property
    def work_left_s(self) -> int:
        return max(0, self.work_s - self.done_s)

    @property
    def time_left_s(self) -> int | None:
        return None if self.deadline_s is None else self.deadline_s - self.elapsed_s

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class MarketView:
    """What a policy may know about capacity and prices right now."""

    spot_available: int = 1
    """Spot nodes (instances) that could be had now; 0 = none."""
    spot_price_micros: int = 918_000
    """Spot price per GPU-hour, micro-units."""
    ondemand_price_micros: int = 3_060_000
    """On-demand price per GPU-hour, micro-units."""
    spot_reclaim_rate_per_hour: float = 0.0
    """Reclaims per node-hour observed on spot so far (a rate, not money)."""
    step_s: int = 60
    """How often the caller will ask again (simulator step, daemon tick)."""
    spot_uptime_fraction: float | None = None
    """Share of the recent past (``lookback_s``) in which spot capacity for a job
    of this size was available; None = not observed yet."""
    lookback_s: int = 0
    """How much history the observed rate and uptime summarise (0 = none)."""
    spot_down_s: int | None = None
    """Seconds since spot capacity for this job was last available (0 when it is
    available now); None = not tracked."""
    spot_up_s: int | None = None
    """Seconds since spot capacity for this job became available (0 when it is
    not available now); None = not tracked."""
    spot_windows_s: tuple[int, ...] = ()
    """Lengths in seconds of the spot windows (spot for this job continuously
    available) that began and ended within the look-back, oldest first; the
    current, unfinished window is not included. Empty = not tracked."""
    spot_outages_s: tuple[int, ...] = ()
    """Lengths in seconds of the outages (spot for this job continuously not
    available) that began and ended within the look-back, oldest first; the
    current, unfinished outage is not included. Empty = not tracked."""


@dataclass(frozen=True)
class Placement:
    capacity: Capacity
    reason: str = ""
    recheck_s: int | None = None
    """The same answer holds for at least this many more seconds as long as
    only the clock and the job's own progress move (no reclaim, no change in
    spot availability or prices). None = ask again every step. The simulator
    uses it to jump ahead; the daemon may use it to skip ticks."""


@dataclass(frozen=True)
class PoolPlacement:
    """A placement among several spot pools."""

    capacity: Capacity
    pool: int | None = None
    """For SPOT: the index of the pool (into the market views) to run in."""
    reason: str = ""
    recheck_s: int | None = None
    """As ``Placement.recheck_s``: no change in any pool, only the clock moves."""


@dataclass(frozen=True)
class PoolView:
    """One pool of the catalog, as a policy may know it (``Policy.place_catalog``)."""

    name: str
    capacity: Capacity
    """OWNED, RESERVED, SPOT or ONDEMAND."""
    price_micros: int
    """Per GPU-hour, micro-units (a prepaid pool: its internal rate, 0 by default)."""
    speed: float = 1.0
    """Work per GPU-hour against the reference GPU type."""
    room: bool = True
    """The job's whole gang could start in this pool now (free GPUs on usable nodes)."""
    market: MarketView = MarketView()
    """A spot pool's own market: its availability, windows and observed reclaim rate."""

    @property
    def cost_micros(self) -> float:
        """Price per unit of work (per reference GPU-hour)."""
        return self.price_micros / self.speed


@dataclass(frozen=True)
class PoolChoice:
    """Where a job goes among the catalog's pools."""

    pool: int | None
    """Index into the pool views; None: no pool (wait where the job is)."""
    capacity: Capacity
    """The chosen pool's class; NONE: wait (pending in ``pool``'s queue when it names one)."""
    reason: str = ""


DEFAULT_CHECKPOINT_INTERVAL_S = 600
"""What ``expected_spot_cost`` assumes of a checkpointing job that does not say how often it saves."""


def expected_spot_cost(job: JobView, pool: PoolView) -> float:
    """A spot pool's cost per unit of work, with the expected loss from its reclaims.

    Price divided by speed, times (1 + reclaims per hour x the hours each
    reclaim costs: the changeover plus, for a job that checkpoints, half its
    save interval on average; for one that does not, half of its work).
    """
    if job.checkpointable:
        lost_s = (job.checkpoint_interval_s or DEFAULT_CHECKPOINT_INTERVAL_S) / 2
    else:
        lost_s = job.work_s / 2
    per_reclaim_h = (job.changeover_s + lost_s) / 3600
    return pool.cost_micros * (1 + pool.market.spot_reclaim_rate_per_hour * per_reclaim_h)


def owned_wait_margin_s(job: JobView, step_s: int) -> int:
    """Slack a job keeps when it waits for owned capacity instead of going on-demand."""
    return job.changeover_s + 2 * step_s + job.work_left_s // 20


class Action(str, Enum):
    RESUME_SPOT = "resume_spot"
    MOVE_ONDEMAND = "move_ondemand"
    WAIT = "wait"
    GIVE_UP = "give_up"


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str = ""


@dataclass(frozen=True)
class AttemptView:
    """One past attempt, for on_preempt."""

    capacity: Capacity
    run_s: int
    outcome: str
    """'completed', 'reclaimed', 'preempted', 'failed', ..."""
    lost_s: int = 0


class Policy(ABC):
    """A placement policy. Subclasses set ``name`` and implement both methods.

    Contract:
    - pure: same arguments, same answer;
    - ``place`` never returns SPOT for a job with ``interruptible=False``;
    - a job without a deadline is never forced to on-demand by a deadline rule.
    """

    name: ClassVar[str]
    description: ClassVar[str] = ""

    @abstractmethod
    def place(self, job: JobView, market: MarketView) -> Placement: ...

    @abstractmethod
    def on_preempt(
        self, job: JobView, history: Sequence[AttemptView], market: MarketView
    ) -> Decision: ...

    # -- several spot pools ----------------------------------------------------
    def place_pools(self, job: JobView, markets: Sequence[MarketView]) -> PoolPlacement:
        """Placement when spot comes from several pools (zones, regions, clouds),
        each with its own market view; on-demand is one more choice.

        The default runs the single-pool decision on the pool ``choose_pool``
        picks: the job's own pool while its spot is there (a move costs a
        changeover), else the pool with spot for the whole gang that has been
        reclaimed least (then the cheapest); with no spot anywhere, the pool
        seen up most. A reclaim in one pool can so resume in another at once.
        Pure like ``place``.
        """
        k = self.choose_pool(job, markets)
        pl = self.place(job, markets[k])
        return PoolPlacement(pl.capacity, k if pl.capacity is Capacity.SPOT else None, pl.reason, pl.recheck_s)

    def choose_pool(self, job: JobView, markets: Sequence[MarketView]) -> int:
        """The pool whose market the single-pool decision sees."""
        if not markets:
            raise ValueError("place_pools needs at least one market view")
        up = [k for k, m in enumerate(markets) if m.spot_available >= job.nodes]
        if job.current is Capacity.SPOT and job.pool in up:
            return job.pool  # type: ignore[return-value]
        if up:
            return min(up, key=lambda k: (markets[k].spot_reclaim_rate_per_hour,
                                          markets[k].spot_price_micros, k))
        return max(range(len(markets)), key=lambda k: (markets[k].spot_uptime_fraction or 0.0, -k))


    # -- the pool catalog -------------------------------------------------------
    def place_catalog(self, job: JobView, pools: Sequence[PoolView]) -> PoolChoice:
        """Placement among the catalog's pools that can hold the job (the caller filtered them).

        1. A prepaid (owned, reserved) pool with room: the cheapest per unit of work.
        2. A job running on paid capacity stays, unless a prepaid pool has
           room and moving saves more than the changeover and the unsaved
           work cost, or it runs on on-demand and the policy's rule for a
           job on on-demand sends it back to spot (``_move_back``; never for
           a job that cannot checkpoint).
        3. Spot, when the job may be interrupted: the single-pool decision
           (``place``) on the spot pool with the lowest expected cost per unit
           of work among those with spot for its gang (its own pool first
           while spot is there: a move costs a changeover), priced against the
           cheapest on-demand pool.
        4. A job that may not be interrupted, or that the decision sends off
           spot, waits for a prepaid pool that fits while its deadline allows
           (a job without a deadline always waits there), else takes the
           cheapest on-demand pool.
        Pure like ``place``.
        """
        if not pools:
            raise ValueError("place_catalog needs at least one pool")
        ks = range(len(pools))
        prepaid = sorted((k for k in ks if pools[k].capacity in PREPAID), key=lambda k: (pools[k].cost_micros, k))
        spots = [k for k in ks if pools[k].capacity is Capacity.SPOT]
        ods = sorted((k for k in ks if pools[k].capacity is Capacity.ONDEMAND), key=lambda k: (pools[k].cost_micros, k))
        free = [k for k in prepaid if pools[k].room]
        running = job.current in (Capacity.SPOT, Capacity.ONDEMAND) and job.pool is not None
        if running:
            return self._move_back(job, pools, free)
        if free:
            return PoolChoice(free[0], pools[free[0]].capacity, f"{pools[free[0]].name} has room (already paid for)")
        od_market = pools[ods[0]].market if ods else None
        spot_k = self._spot_pool(job, pools, spots) if job.interruptible and spots else None
        if spot_k is not None:
            market = pools[spot_k].market
            if od_market is not None:
                market = replace(market, ondemand_price_micros=int(pools[ods[0]].cost_micros))
            pl = self.place(job, replace(market, spot_price_micros=int(pools[spot_k].cost_micros)))
            if pl.capacity is Capacity.SPOT:
                return PoolChoice(spot_k, Capacity.SPOT, f"{pools[spot_k].name}: {pl.reason}")
            if pl.capacity is Capacity.NONE:
                return PoolChoice(spot_k, Capacity.NONE, f"wait for spot in {pools[spot_k].name}: {pl.reason}")
            why = pl.reason
        else:
            why = "may not be interrupted" if not job.interruptible else "no spot pool fits"
        if prepaid:
            k = prepaid[0]
            left = job.time_left_s
            step = od_market.step_s if od_market is not None else 60
            if not ods or left is None or left - job.work_left_s / pools[k].speed > owned_wait_margin_s(job, step):
                return PoolChoice(k, Capacity.NONE, f"{why}; waits for {pools[k].name} (already paid for)")
        if ods:
            return PoolChoice(ods[0], Capacity.ONDEMAND, f"{why}; {pools[ods[0]].name} is the cheapest on-demand")
        if spot_k is not None:
            return PoolChoice(spot_k, Capacity.NONE, f"{why}; no on-demand pool fits, waits for spot")
        return PoolChoice(None, Capacity.NONE, f"{why}; no pool can run it now")

    def pool_after_preempt(self, job: JobView, decision: Decision, pools: Sequence[PoolView]) -> PoolChoice:
        """Where the next attempt goes after ``on_preempt`` decided (not GIVE_UP).

        A prepaid pool with room first; to resume on spot (or wait for it),
        the spot pool ``_spot_pool`` picks: with the pool just reclaimed
        (``job.pool``) down, another zone at once; to move to on-demand, the
        cheapest on-demand pool. Pure.
        """
        ks = range(len(pools))
        free = sorted((k for k in ks if pools[k].capacity in PREPAID and pools[k].room),
                      key=lambda k: (pools[k].cost_micros, k))
        if free:
            return PoolChoice(free[0], pools[free[0]].capacity, f"{pools[free[0]].name} has room (already paid for)")
        spots = [k for k in ks if pools[k].capacity is Capacity.SPOT]
        ods = sorted((k for k in ks if pools[k].capacity is Capacity.ONDEMAND), key=lambda k: (pools[k].cost_micros, k))
        if decision.action is Action.MOVE_ONDEMAND or not spots:
            if ods:
                return PoolChoice(ods[0], Capacity.ONDEMAND, f"{pools[ods[0]].name} is the cheapest on-demand")
            prepaid = [k for k in ks if pools[k].capacity in PREPAID]
            k = prepaid[0] if prepaid else 0
            return PoolChoice(k, Capacity.NONE, f"no on-demand pool fits; waits for {pools[k].name}")
        k = self._spot_pool(job, pools, spots)
        if decision.action is Action.WAIT:
            return PoolChoice(k, Capacity.NONE, f"waits for spot in {pools[k].name}")
        return PoolChoice(k, Capacity.SPOT, f"spot in {pools[k].name}")

    def _spot_pool(self, job: JobView, pools: Sequence[PoolView], spots: Sequence[int]) -> int:
        """The spot pool the single-pool decision sees: the job's own while its spot is there,
        else the lowest expected cost among those with spot and room, else the one seen up most."""
        up = [k for k in spots if pools[k].market.spot_available >= job.nodes and pools[k].room]
        if job.current is Capacity.SPOT and job.pool in up:
            return job.pool  # type: ignore[return-value]
        if up:
            return min(up, key=lambda k: (expected_spot_cost(job, pools[k]), k))
        return max(spots, key=lambda k: (pools[k].market.spot_uptime_fraction or 0.0, -k))

    def _move_back(self, job: JobView, pools: Sequence[PoolView], free: Sequence[int]) -> PoolChoice:
        """A job running on paid capacity: move to a free prepaid pool when the saving beats the
        changeover; else, from on-demand, back to spot when the policy's own rule says so
        (``_back_to_spot``). A job that cannot checkpoint never moves."""
        here = job.pool if job.pool is not None and 0 <= job.pool < len(pools) else None
        stay = PoolChoice(here, job.current, "stays where it runs")
        if here is None or not job.checkpointable:
            return stay
        unsaved = max(0, job.done_s - (job.safe_done_s if job.safe_done_s is not None else job.done_s))
        if free:
            k = free[0]
            gpus = job.gpus
            left_h = job.work_left_s / 3600
            now_cost = pools[here].cost_micros if pools[here].capacity is not Capacity.SPOT else \
                expected_spot_cost(job, pools[here])
            saving = (now_cost - pools[k].cost_micros) * gpus * left_h
            move_cost = pools[here].price_micros * gpus * (job.changeover_s + unsaved) / 3600
            if saving > move_cost:
                return PoolChoice(k, pools[k].capacity,
                                  f"moves to {pools[k].name}: saves {saving - move_cost:.0f} micro-units after the changeover")
        if job.current is Capacity.ONDEMAND and unsaved <= job.changeover_s:
            back = self._back_to_spot(job, pools, here)
            if back is not None:
                return back
        return stay

    def _back_to_spot(self, job: JobView, pools: Sequence[PoolView], here: int) -> PoolChoice | None:
        """A job on on-demand that may be interrupted: leave for spot when the policy's rule for a
        job on on-demand says so, asked as the simulator asks it (``place_pools``, one market per
        spot pool that is observed and cheaper per unit of work than the pool it runs on; a pool
        without room for the gang shows no spot). The spot pool it names, or None to stay.

        Never a move whose slack does not pay for the changeover to spot and, after a reclaim,
        the one back: that round trip would be lost for certain. The caller has checked that the
        move loses at most one changeover of unsaved work (the policy's arithmetic counts the
        changeover only)."""
        spots = [k for k, p in enumerate(pools)
                 if p.capacity is Capacity.SPOT and p.cost_micros < pools[here].cost_micros
                 and p.market.spot_up_s is not None]  # spot seen, not the prior of a market never observed
        if not job.interruptible or not spots:
            return None
        od = int(pools[here].cost_micros)
        markets = [replace(pools[k].market, spot_price_micros=int(pools[k].cost_micros), ondemand_price_micros=od,
                           spot_available=pools[k].market.spot_available if pools[k].room else 0)
                   for k in spots]
        pl = self.place_pools(replace(job, pool=None), markets)
        if pl.capacity is not Capacity.SPOT or pl.pool is None or not 0 <= pl.pool < len(spots):
            return None
        k = spots[pl.pool]
        left = job.time_left_s
        safe = job.done_s if job.safe_done_s is None else job.safe_done_s
        if left is not None and left - markets[pl.pool].step_s < job.work_s - safe + 2 * job.changeover_s:
            return None  # the changeover there and, after a reclaim, back would cost the deadline
        return PoolChoice(k, Capacity.SPOT, f"back to spot in {pools[k].name}: {pl.reason}")


@dataclass
class _Registry:
    factories: dict[str, type[Policy]] = field(default_factory=dict)


_REGISTRY = _Registry()


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy available by its ``name``."""
    _REGISTRY.factories[cls.name] = cls
    return cls


def names() -> list[str]:
    return sorted(_REGISTRY.factories)


def from_name(name: str, **kwargs: object) -> Policy:
    """Build a policy by name; an unknown name lists the valid ones."""
    try:
        cls = _REGISTRY.factories[name]
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; choose one of: {', '.join(names())}"
        ) from None
    return cls(**kwargs)  # type: ignore[arg-type]
