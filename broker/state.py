"""The daemon's state: what every use case needs, and everything kept across ticks.

``Services`` is built once by ``broker.wiring`` (settings, database, Slurm
backend, policy, clock) and holds every piece of cross-tick state as a
declared field or an owning object: the market watch, the sbatch claims, the
Slurm-down backoff, the preflight cache, users' files and saves, and the
warnings already given. There are no global singletons: tests build a
``Services`` with a fake clock or a recorded backend and throw it away.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

from sqlalchemy.orm import Session, sessionmaker

import policies
from broker.clock import Clock, SystemClock
from broker.config import Settings
from broker.market import MarketWatch
from broker.db import store
from broker.db.migrate import upgrade_to_head
from broker.slurm.backend import Backend
from broker.userfiles import SaveWatcher, UserFiles

log = logging.getLogger(__name__)

SBATCH_MEMORY_S = 600.0
"""How long the time of a committed sbatch is remembered (far longer than one tick)."""


class CrashPoints:
    """Named points where a test can make the daemon die (SIGKILL-like).

    Set ``GBROKER_CRASH_AT=after_sbatch`` (comma-separated names) in the
    daemon's environment; reaching that point kills the process at once, so
    crash safety is tested against real interruptions, not simulated ones.
    """

    def __init__(self, names: str | None = None) -> None:
        raw = os.environ.get("GBROKER_CRASH_AT", "") if names is None else names
        self.names = {n.strip() for n in raw.split(",") if n.strip()}

    def reach(self, name: str) -> None:
        if name in self.names:
            log.critical("crash point %s reached: dying now", name)
            os._exit(137)


@dataclass
class Services:
    settings: Settings
    sessions: sessionmaker[Session]
    backend: Backend
    policy: policies.Policy
    clock: Clock = field(default_factory=SystemClock)
    crash: CrashPoints = field(default_factory=CrashPoints)
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Serialises writers inside the daemon (API threads and the reconcile tick)."""
    market: MarketWatch = field(default_factory=MarketWatch)
    """The spot market as the ticks saw it: availability samples, the last view, reclaims by gang size."""
    inflight: set[int] = field(default_factory=set)
    """Attempt ids claimed for an sbatch in this process (from the moment the
    attempt is stored until its Slurm id is committed): the tick leaves them alone."""
    sbatched_at: dict[int, float] = field(default_factory=dict)
    """Attempt id -> monotonic time its sbatch was committed, for recent ones."""
    slurm_down_since: datetime | None = None
    next_try_at: datetime | None = None
    backoff_s: float = 0.0
    files: UserFiles = field(default_factory=UserFiles)
    """What is done with users' files (logs, checkpoint directories), as the user."""
    saves: SaveWatcher = field(init=False)
    """Running jobs' last checkpoint saves, learned as their owners in the background."""
    unclear_since: dict[int, datetime] = field(default_factory=dict)
    """Attempt id -> when the tick first saw its run end without a clear cause (see reconcile)."""
    tick_errors: dict[int, str] = field(default_factory=dict)
    """Job id -> the error that stopped its share of the last tick (logged once, not every tick)."""
    preflight_passed: dict[tuple[object, ...], datetime] = field(default_factory=dict)
    """(user, group, partition, nodes, gpus) -> until when Slurm's ``sbatch --test-only`` pass holds."""
    warned: set[tuple[object, ...]] = field(default_factory=set)
    """Warnings already logged once (a missing price is retried every tick, said once)."""
    reads: sessionmaker[Session] | None = None
    """Sessions for reading only (``session_factory(readonly=True)``: on SQLite a plain BEGIN, so a
    read waits for no writer); None: ``sessions``. Never write through them."""
    array_seen: dict[int, int] = field(default_factory=dict)
    """Array job id -> a digest of what the queue showed of its tasks at the last tick that
    settled everything: an array the queue shows the same again is skipped (broker/jobs/arrays.py)."""

    def __post_init__(self) -> None:
        self.saves = SaveWatcher(self.files)
        if self.reads is None:
            self.reads = self.sessions

    def read(self) -> Session:
        """A session for reading only (a user's ``status`` does not queue behind submissions)."""
        assert self.reads is not None  # set in __post_init__
        return self.reads()

    # -- one sbatch per attempt ----------------------------------------------
    def claim_sbatch(self, attempt_id: int) -> bool:
        """True when this caller may sbatch the attempt (nobody else is doing it)."""
        with self.lock:
            if attempt_id in self.inflight:
                return False
            self.inflight.add(attempt_id)
            return True

    def sbatch_finished(self, attempt_id: int, committed: bool) -> None:
        with self.lock:
            self.inflight.discard(attempt_id)
            if committed:
                t = time.monotonic()
                self.sbatched_at.pop(attempt_id, None)
                self.sbatched_at[attempt_id] = t  # last in the dict: it is ordered by time
                while self.sbatched_at:  # forget the oldest, from the front (not a scan per submission)
                    oldest = next(iter(self.sbatched_at))
                    if self.sbatched_at[oldest] >= t - SBATCH_MEMORY_S:
                        break
                    del self.sbatched_at[oldest]

    def sbatch_busy(self, attempt_id: int, since: float) -> bool:
        """True while the attempt's sbatch is under way, or when it was committed
        after `since` (a Slurm queue listing taken at `since` may not show it yet)."""
        with self.lock:
            return attempt_id in self.inflight or self.sbatched_at.get(attempt_id, float("-inf")) >= since

    @contextmanager
    def tx(self) -> Iterator[Session]:
        """One locked unit of work: commit on success, roll back on error."""
        with self.lock, self.sessions() as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    # -- lease and start-up ---------------------------------------------------
    def migrate(self) -> None:
        upgrade_to_head(self.settings.db_url)

    def try_lease(self, name: str, holder: str, ttl_s: float) -> str | None:
        """None when `holder` has the lease now; else who holds it."""
        with self.tx() as s:
            if store.acquire_lease(s, name, holder, ttl_s, self.clock.now()):
                return None
            return store.lease_holder(s, name, self.clock.now()) or "unknown"

    def take_over_lease(self, name: str, dead_holder: str, holder: str, ttl_s: float) -> bool:
        with self.tx() as s:
            return store.take_over_lease(s, name, dead_holder, holder, ttl_s, self.clock.now())

    def release_lease(self, name: str, holder: str) -> None:
        with self.tx() as s:
            store.release_lease(s, name, holder)

    # -- backoff while Slurm is down -----------------------------------------
    def slurm_down(self, now: datetime, why: str) -> None:
        if self.slurm_down_since is None:
            self.slurm_down_since = now
            log.warning("Slurm controller unreachable (%s); jobs are unknown until it answers", why)
        self.backoff_s = min(
            self.settings.backoff_max_seconds, max(self.settings.tick_seconds, self.backoff_s * 2 or 1.0)
        )
        self.next_try_at = now + timedelta(seconds=self.backoff_s)

    def slurm_up(self, now: datetime) -> None:
        if self.slurm_down_since is not None:
            log.warning("Slurm controller answers again after %s", now - self.slurm_down_since)
        self.slurm_down_since = None
        self.next_try_at = None
        self.backoff_s = 0.0


M = TypeVar("M")


def must_get(session: Session, model: type[M], ident: int) -> M:
    """A row we know exists (we wrote it in this process); its absence is a bug."""
    row = session.get(model, ident)
    if row is None:
        raise LookupError(f"{model.__name__} {ident} vanished from the database")
    return row
