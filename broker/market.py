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
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from broker.slurm.backend import NodeInfo
from broker.states import NodeState
from policies import MarketView

LOOKBACK = timedelta(days=7)
"""The same window as the observed reclaim rate."""
MAX_SAMPLES = 20_000
UNUSABLE = frozenset({NodeState.DOWN, NodeState.UNKNOWN})


@dataclass
class SpotObserver:
    """Samples of (time, spot nodes available), newest last."""

    samples: deque[tuple[datetime, int]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def observe(self, nodes: Iterable[NodeInfo], spot_partition: str, now: datetime) -> int:
        available = sum(
            1 for n in nodes
            if spot_partition in n.partitions and n.state not in UNUSABLE and "drain" not in n.state_raw.lower()
        )
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


def observer(svc: object) -> SpotObserver:
    obs = getattr(svc, "spot_observer", None)
    if obs is None:
        obs = SpotObserver()
        svc.spot_observer = obs  # type: ignore[attr-defined]
    return obs


def for_gang(svc: object, market: MarketView, nodes: int) -> MarketView:
    """``market`` as a gang of ``nodes`` nodes sees it: its own reclaim rate,
    availability streaks and runs."""
    if nodes <= 1:
        return market
    history = getattr(svc, "reclaim_history", None)
    rate = market.spot_reclaim_rate_per_hour if history is None else history.rate(nodes)
    obs = getattr(svc, "spot_observer", None)
    at = getattr(svc, "market_at", None)
    if obs is None or at is None:
        return replace(market, spot_reclaim_rate_per_hour=rate)
    # Every job of a tick asks as of the same moment: one view per gang size
    # (and rate: a submit thread may read this tick's time with the last one's rate).
    cache: dict[tuple[datetime, int, float], MarketView] = svc.__dict__.setdefault("gang_markets", {})
    key = (at, nodes, rate)
    view = cache.get(key)
    if view is None:
        if cache and next(iter(cache))[0] != at:
            cache.clear()
        view = cache[key] = replace(market, spot_reclaim_rate_per_hour=rate, **obs.summary(at, nodes))
    return view


def build_market(svc: object, session: object, now: datetime, reclaim_rate: float, need: int = 1) -> MarketView:
    settings = svc.settings  # type: ignore[attr-defined]
    fields: dict[str, object] = {
        "spot_reclaim_rate_per_hour": reclaim_rate,
        "step_s": max(1, int(settings.tick_seconds)),
    }
    fields.update(observer(svc).summary(now, need))
    fields.update(_prices(svc, session, now))
    return MarketView(**fields)  # type: ignore[arg-type]


def _prices(svc: object, session: object, now: datetime) -> dict[str, int]:
    """Per GPU-hour prices in force now, from the price book when it has them."""
    from broker.money.budgets import price_book

    book = price_book(session)  # type: ignore[arg-type]
    settings = svc.settings  # type: ignore[attr-defined]
    out: dict[str, int] = {}
    spot = book.price_at(settings.spot_partition, "spot", now)
    ondemand = book.price_at(settings.ondemand_partition, "ondemand", now)
    if spot is not None:
        out["spot_price_micros"] = spot
    if ondemand is not None:
        out["ondemand_price_micros"] = ondemand
    return out
