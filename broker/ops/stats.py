"""What only the running daemon knows, for the metrics and the health pages.

``DaemonStats`` is owned by the ``Daemon`` (one per process, no global): the
times and outcomes of every tick, Slurm calls and their errors (counted by
``CountingBackend``, a thin proxy in front of the real backend), and whether
this daemon holds its lease.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class TickStat:
    runs: int = 0
    errors: int = 0
    seconds_total: float = 0.0
    last_seconds: float = 0.0
    last_end_mono: float | None = None
    last_end_wall: float | None = None
    running_since_mono: float | None = None


@dataclass
class DaemonStats:
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    lock: threading.Lock = field(default_factory=threading.Lock)
    ticks: dict[str, TickStat] = field(default_factory=dict)
    slurm_calls: Counter[str] = field(default_factory=Counter)
    slurm_errors: Counter[tuple[str, str]] = field(default_factory=Counter)
    connections_refused: Counter[str] = field(default_factory=Counter)
    """Connections the ops listener answered 503 at once, by why (``Slots``: per_peer, full)."""
    holder: str = ""
    lease_renewed_mono: float | None = None
    lease_lost: bool = False
    started_wall: float = field(default_factory=time.time)

    # -- ticks ----------------------------------------------------------------
    def timed(self, name: str, fn: Callable[[], object]) -> Callable[[], None]:
        """``fn`` as the scheduler calls it, with its duration and outcome recorded."""

        def run() -> None:
            start = self.clock()
            with self.lock:
                self.ticks.setdefault(name, TickStat()).running_since_mono = start
            ok = False
            try:
                fn()
                ok = True
            finally:
                took = self.clock() - start
                with self.lock:
                    st = self.ticks[name]
                    st.runs += 1
                    st.errors += 0 if ok else 1
                    st.seconds_total += took
                    st.last_seconds = took
                    st.last_end_mono = self.clock()
                    st.last_end_wall = self.wall()
                    st.running_since_mono = None

        return run

    def tick_age(self, name: str) -> float | None:
        """Seconds since the tick last finished (None: it never has)."""
        with self.lock:
            st = self.ticks.get(name)
            if st is None or st.last_end_mono is None:
                return None
            return self.clock() - st.last_end_mono

    def snapshot(self) -> dict[str, TickStat]:
        with self.lock:
            return {k: TickStat(**vars(v)) for k, v in self.ticks.items()}

    # -- lease ----------------------------------------------------------------
    def lease_ok(self, holder: str) -> None:
        with self.lock:
            self.holder = holder
            self.lease_renewed_mono = self.clock()
            self.lease_lost = False

    def lease_gone(self) -> None:
        with self.lock:
            self.lease_lost = True

    def lease_age(self) -> float | None:
        with self.lock:
            if self.lease_lost or self.lease_renewed_mono is None:
                return None
            return self.clock() - self.lease_renewed_mono

    def connection_refused(self, why: str) -> None:
        with self.lock:
            self.connections_refused[why] += 1

    # -- Slurm calls ------------------------------------------------------------
    def slurm_call(self, call: str, error: BaseException | None) -> None:
        with self.lock:
            self.slurm_calls[call] += 1
            if error is not None:
                self.slurm_errors[(call, type(error).__name__)] += 1


class CountingBackend:
    """The Slurm backend, with every call and every error counted in ``stats``.

    Attributes pass through; only calls are wrapped. It changes nothing the
    backend does: an error is counted and raised again.
    """

    def __init__(self, inner: Any, stats: DaemonStats) -> None:
        self._inner = inner
        self._stats = stats

    @property
    def inner(self) -> Any:
        return self._inner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name.startswith("_") or not callable(attr):
            return attr
        stats = self._stats

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                out = attr(*args, **kwargs)
            except Exception as exc:
                stats.slurm_call(name, exc)
                raise
            stats.slurm_call(name, None)
            return out

        return call
