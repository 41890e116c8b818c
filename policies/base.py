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
from dataclasses import dataclass, field
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
