"""Slurm partitions' own limits (MaxTime, MaxNodes, MinNodes, State), read once and kept a while.

A job whose time limit is above its partition's MaxTime, or whose node count
is outside MinNodes..MaxNodes, is accepted by sbatch (unless slurm.conf sets
``EnforcePartLimits``) and then waits forever with reason
``PartitionTimeLimit`` / ``PartitionNodeLimit``. Placement reads these limits
to send such a job elsewhere, or to refuse it with the limit named.

The limits change rarely (an admin's ``scontrol update PartitionName=...``),
and placement asks for them at every submission and every move, so they are
read with one ``scontrol show partition`` for all partitions and kept for
:data:`REFRESH_S` seconds. A controller that does not answer leaves the last
limits read in force (none before the first read): placement then goes on as
if there were none, and Slurm's own pending reason says the rest.

Per-user and QOS limits (MaxJobsPerUser, MaxTRESPerUser, GrpTRES) are not
read here: they depend on what else the user runs at the moment, so Slurm's
pending reason (``QOSMaxJobsPerUserLimit``, ``AssocGrpGRES``, ...) tells them,
in words (:mod:`broker.slurm.reasons`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker.errors import SlurmError

log = logging.getLogger(__name__)

REFRESH_S = 30.0
"""How long limits once read are used before ``scontrol show partition`` runs again."""
RETRY_S = 5.0
"""After a failed read, how long before trying again (the last limits read stay in force)."""

@dataclass(frozen=True)
class PartitionInfo:
    """One partition's limits for a job, as ``scontrol show partition`` gives them."""

    name: str
    max_time_s: int | None = None
    """MaxTime in seconds; None: unlimited."""
    max_nodes: int | None = None
    """MaxNodes per job; None: unlimited."""
    min_nodes: int = 0
    """MinNodes per job (0 or 1: any)."""
    state: str = "UP"


class PartitionCache:
    """The last partitions read through ``read`` (a backend's ``partitions``), refreshed every
    :data:`REFRESH_S` seconds at most. Thread-safe: submissions ask from several threads, and
    one read serves them all. The read runs outside the lock: while it is under way (a
    controller that hangs, up to its query timeout) the others go on with the limits last
    read (none before the first read) instead of waiting for it."""

    def __init__(self, read: Callable[[], Iterable[PartitionInfo]], *,
                 refresh_s: float = REFRESH_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._refresh_s, self._clock = read, refresh_s, clock
        self._lock = threading.Lock()
        self._known: dict[str, PartitionInfo] = {}
        self._next_read = float("-inf")
        self._reading = False

    def get(self) -> dict[str, PartitionInfo]:
        """Every partition's limits by name, read afresh when the last read is old (by this
        thread; another one reading already: what was read last)."""
        with self._lock:
            if self._reading or self._clock() < self._next_read:
                return self._known
            self._reading = True
        try:
            self._refresh()
        finally:
            with self._lock:
                self._reading = False
        return self.known()

    def known(self) -> dict[str, PartitionInfo]:
        """The limits as last read, without asking Slurm (the reconcile tick's words for a reason)."""
        with self._lock:
            return self._known

    def _refresh(self) -> None:
        try:
            fresh = {p.name: p for p in self._read()}
        except SlurmError as exc:  # unavailable or refused: keep what was known, try again soon
            log.info("partition limits not read (%s); using the last ones read", exc)
            with self._lock:
                self._next_read = self._clock() + RETRY_S
            return
        with self._lock:
            self._known = fresh
            self._next_read = self._clock() + self._refresh_s
