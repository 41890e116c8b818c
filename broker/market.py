"""What the daemon has seen of the spot market, as the policy's MarketView.

The node tick reports how many spot nodes could be had (not down, drained or
failed: a powered-down cloud node counts, it can be rented); this module keeps
a short history in memory and turns it into the numbers the policies read:
nodes available now, how long spot has been up (or down), the share of the
recent past it was up, the reclaim rate seen on the cluster, and prices from
the price book. After a restart the history starts empty and the policies fall
back to their priors.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from broker.config import Settings
from broker.pools.catalog import Catalog
from broker.slurm.backend import NodeInfo
from broker.states import NodeState
from policies import MarketView

LOOKBACK = timedelta(days=7)
"""The same window as the observed reclaim rate."""
MAX_SAMPLES = 20_000
UNUSABLE = frozenset({NodeState.DOWN, NodeState.UNKNOWN})


def usable(node: NodeInfo) -> bool:
    """A node that could run a job now or after a boot (not down, drained or failed)."""
    return node.state not in UNUSABLE and "drain" not in node.state_raw.lower()


@dataclass
class SpotObserver:
    """Samples of (time, spot nodes available), newest last."""

    samples: deque[tuple[datetime, int]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, nodes: Iterable[NodeInfo], spot_partition: str, now: datetime) -> int:
        available = sum(1 for n in nodes if spot_partition in n.partitions and usable(n))
        with self.lock:
            self.samples.append((now, available))
            while self.samples and self.samples[0][0] < now - LOOKBACK:
                self.samples.popleft()
        return available

    def summary(self, now: datetime, need: int = 1) -> dict[str, object]:
        """MarketView fields for a job that needs `need` spot nodes at once.

        A gang of `need` nodes has spot while at least `need` spot nodes are
        available; its windows and outages are the runs of that condition.
        Only runs that began and ended inside the kept history are listed
        (the first is cut by the start of the history, the last still goes on).
        """
        with self.lock:
            samples = list(self.samples)
        if not samples:
            return {}
        runs: list[tuple[bool, float]] = []  # (up, seconds), in order
        for (t0, n0), (t1, _) in zip(samples, samples[1:], strict=False):
            span = (t1 - t0).total_seconds()
            up = n0 >= need
            if runs and runs[-1][0] == up:
                runs[-1] = (up, runs[-1][1] + span)
            else:
                runs.append((up, span))
        available = samples[-1][1]
        now_up = available >= need
        # How long the current state has lasted.
        streak_start = samples[-1][0]
        for t, n in reversed(samples):
            if (n >= need) != now_up:
                break
            streak_start = t
        streak = int((now - streak_start).total_seconds())
        up_s = sum(x for u, x in runs if u)
        lookback = sum(x for _, x in runs)
        # The last run may be the current state still going on; the first is cut.
        if runs and runs[-1][0] == now_up:
            runs.pop()
        done = runs[1:]
        return {
            "spot_available": available,
            "spot_uptime_fraction": (up_s / lookback) if lookback > 0 else None,
            "lookback_s": int(lookback),
            "spot_up_s": streak if now_up else 0,
            "spot_down_s": 0 if now_up else streak,
            "spot_windows_s": tuple(int(x) for u, x in done if u),
            "spot_outages_s": tuple(int(x) for u, x in done if not u),
        }


OWN_SIZE_HOURS = 6.0
"""Spot hours a gang size needs in the window before its own reclaim rate is used."""


@dataclass(frozen=True)
class ReclaimHistory:
    """Spot attempts of the recent window by gang size: nodes -> (reclaims, attempt-hours)."""

    by_nodes: dict[int, tuple[int, float]] = field(default_factory=dict)

    def rate(self, nodes: int = 1) -> float:
        """Reclaims per hour on spot for a gang of ``nodes`` (reclaimed when any of its nodes is).

        A gang size with ``OWN_SIZE_HOURS`` of spot time in the window gets its
        own observed rate. Before that, the larger of two bounds over every
        attempt: the rate per node-hour times ``nodes`` (right when nodes are
        reclaimed one by one) and the rate per attempt-hour (right when a
        gang's nodes go together). So a gang size without history errs
        towards on-demand, never towards a missed deadline.
        """
        reclaims, hours = self.by_nodes.get(nodes, (0, 0.0))
        if hours >= OWN_SIZE_HOURS:
            return reclaims / hours
        all_reclaims = sum(r for r, _ in self.by_nodes.values())
        node_hours = sum(n * h for n, (_, h) in self.by_nodes.items())
        attempt_hours = sum(h for _, h in self.by_nodes.values())
        if attempt_hours <= 0:
            return 0.0
        return max(nodes * all_reclaims / node_hours, all_reclaims / attempt_hours)


@dataclass(frozen=True)
class PoolCensus:
    """A pool's nodes at the last node tick: free GPUs on each usable node."""

    free_gpus: tuple[int, ...] = ()
    nodes: int = 0
    """Every node of the pool's partition, usable or not."""
    gpus: int = 0
    """GPUs on the usable nodes."""
    busy_gpus: int = 0
    """GPUs allocated to jobs now."""

    def room(self, nodes: int, gpus_per_node: int) -> bool:
        """Could a gang of ``nodes`` x ``gpus_per_node`` start here now (a powered-down cloud node counts)?"""
        return sum(1 for f in self.free_gpus if f >= gpus_per_node) >= nodes


def census(nodes: Iterable[NodeInfo], used: Mapping[str, int], partition: str) -> PoolCensus:
    mine = [n for n in nodes if partition in n.partitions]
    ok = [n for n in mine if usable(n)]
    free = tuple(max(0, n.gpus - used.get(n.name, 0)) for n in ok)
    return PoolCensus(free, len(mine), sum(n.gpus for n in ok), sum(min(n.gpus, used.get(n.name, 0)) for n in ok))


@dataclass
class MarketWatch:
    """The daemon's picture of the spot market, kept across ticks.

    The node tick feeds ``observer``; the reconcile tick rebuilds ``view``
    (with the reclaim ``history`` and prices) once per tick; placement asks
    :meth:`for_gang` for the view a job of some size sees.
    """

    observer: SpotObserver = field(default_factory=SpotObserver)
    view: MarketView | None = None
    """The last view built by the reconcile tick; None before the first tick."""
    at: datetime | None = None
    """When ``view`` was built; a gang's own view is derived as of that moment."""
    history: ReclaimHistory | None = None
    """The spot reclaims behind ``view``, by gang size."""
    _gangs: dict[tuple[datetime, int, float], MarketView] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    observers: dict[str, SpotObserver] = field(default_factory=dict)
    """Per spot pool (by name); the catalog's first spot pool shares ``observer``."""
    censuses: dict[str, PoolCensus] = field(default_factory=dict)
    """Per pool: its nodes and free GPUs at the last node tick (empty before the first)."""
    pool_histories: dict[str, ReclaimHistory] = field(default_factory=dict)
    """Per spot pool: its own reclaims in the window (from the reconcile tick)."""
    pool_prices: dict[str, int] = field(default_factory=dict)
    """Per pool: price per GPU-hour in force at the last reconcile tick."""

    def observe(self, nodes: Iterable[NodeInfo], used: Mapping[str, int], catalog: Catalog, now: datetime) -> None:
        """The node tick's census: every pool's free GPUs, and every spot pool's availability sample."""
        nodes = list(nodes)
        censuses = {p.name: census(nodes, used, p.partition) for p in catalog.pools}
        first = True
        for pool in catalog.of_class("spot"):
            obs = self.observer if first else self.observers.setdefault(pool.name, SpotObserver())
            self.observers[pool.name] = obs
            obs.observe(nodes, pool.partition, now)
            first = False
        with self._lock:
            self.censuses = censuses

    def refresh_pools(self, histories: Mapping[str, ReclaimHistory], prices: Mapping[str, int]) -> None:
        with self._lock:
            self.pool_histories, self.pool_prices = dict(histories), dict(prices)

    def for_pool(self, pool: str, nodes: int = 1) -> MarketView:
        """A spot pool's own market as a gang of ``nodes`` sees it: its availability and reclaim rate."""
        with self._lock:
            base, at, history = self.view or MarketView(), self.at, self.pool_histories.get(pool)
            obs = self.observers.get(pool)
        rate = history.rate(nodes) if history is not None else 0.0
        fields: dict[str, object] = {"spot_reclaim_rate_per_hour": rate}
        if obs is not None and at is not None:
            fields.update(obs.summary(at, nodes))
        return replace(base, **fields)  # type: ignore[arg-type]

    def room(self, pool: str, nodes: int, gpus_per_node: int) -> bool | None:
        """Whether the gang could start in ``pool`` now; None before the first census of it."""
        with self._lock:
            c = self.censuses.get(pool)
        return None if c is None else c.room(nodes, gpus_per_node)

    def refresh(self, view: MarketView, history: ReclaimHistory | None, now: datetime | None) -> None:
        with self._lock:
            self.view, self.history, self.at = view, history, now

    def for_gang(self, nodes: int = 1) -> MarketView:
        """The market as of the last tick, as a gang of ``nodes`` nodes sees it: its own
        reclaim rate, availability streaks and runs."""
        with self._lock:
            market, history, at = self.view or MarketView(), self.history, self.at
            if nodes <= 1:
                return market
            rate = market.spot_reclaim_rate_per_hour if history is None else history.rate(nodes)
            if at is None:
                return replace(market, spot_reclaim_rate_per_hour=rate)
            # Every job of a tick asks as of the same moment: one view per gang size
            # (and rate: a submit thread may read this tick's time with the last one's rate).
            key = (at, nodes, rate)
            view = self._gangs.get(key)
            if view is None:
                if self._gangs and next(iter(self._gangs))[0] != at:
                    self._gangs.clear()
                view = self._gangs[key] = replace(
                    market, spot_reclaim_rate_per_hour=rate, **self.observer.summary(at, nodes)  # type: ignore[arg-type]
                )
            return view


def build_market(
    settings: Settings, observer: SpotObserver, now: datetime, reclaim_rate: float,
    prices: Mapping[str, int], need: int = 1,
) -> MarketView:
    """The market as the policies read it: availability from ``observer``, the
    reclaim rate, and ``prices`` (``spot_price_micros``/``ondemand_price_micros``
    per GPU-hour, from the price book: ``broker.money.pricebook.market_prices``)."""
    fields: dict[str, object] = {
        "spot_reclaim_rate_per_hour": reclaim_rate,
        "step_s": max(1, int(settings.tick_seconds)),
    }
    fields.update(observer.summary(now, need))
    fields.update(prices)
    return MarketView(**fields)  # type: ignore[arg-type]
