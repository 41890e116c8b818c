"""The contract between gbroker and Slurm.

::

    service layer ──► Backend ──► (CLI tools | pyslurm) ──► slurmctld / slurmdbd
                        │
                        ├─ submit(SubmitRequest) -> job id         (sbatch, as the user)
                        ├─ jobs()     -> [SlurmJob]   ONE squeue call, filtered in Python
                        ├─ history()  -> [SacctRow]   ONE sacct call, every attempt
                        ├─ cancel/hold/release/requeue/start_now(ids)   ONE call per list
                        ├─ update(job_id, partition=...)
                        ├─ nodes()    -> [NodeInfo]   ONE sinfo call
                        ├─ partitions() -> [PartitionInfo]  ONE scontrol call (kept a while:
                        │                    partition_limits())
                        ├─ power_down/power_up(names)  ONE call per list
                        └─ ping()     -> bool

Rules every backend keeps:

* Read calls are batched: one Slurm call per method call, whatever the
  number of jobs; the reconcile tick must cost O(1) Slurm calls.
* Times are timezone-aware UTC datetimes, or None when Slurm has none.
* State strings are mapped by :mod:`broker.slurm.statemap` only; the raw
  string travels along (``state_raw``) for logs and reports.
* A controller that does not answer raises SlurmUnavailable ("unknown");
  a refusal raises SlurmError carrying Slurm's own message.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from broker.errors import SpecError
from broker.slurm.partitions import PartitionCache, PartitionInfo
from broker.states import AttemptState, NodeState

UPDATE_FIELDS: dict[str, str] = {
    "partition": "Partition",
    "account": "Account",
    "comment": "Comment",
    "job_name": "JobName",
    "nodes": "NumNodes",
    "constraint": "Features",
    "time_limit_s": "TimeLimit",
    "gpus_per_node": "Gres",
    "exclude_nodes": "ExcNodeList",
}
"""Fields :meth:`Backend.update` accepts, and the ``scontrol update job`` key for each."""


@dataclass(frozen=True)
class SubmitRequest:
    """One sbatch. Every option goes on the command line, so it overrides any
    ``#SBATCH`` line in the script; the script text goes on stdin."""

    script: str
    partition: str
    job_name: str
    comment: str
    account: str | None
    user: str | None
    workdir: str
    nodes: int
    gpus_per_node: int
    time_limit_s: int
    output: str | None = None
    requeue: bool = True
    hold: bool = False
    ntasks_per_node: int = 1
    """Slurm tasks per node (SLURM_NTASKS and friends follow, which frameworks read)."""
    constraint: str | None = None
    signal: str | None = None
    gres_type: str | None = None
    """The GPU type (``--gres=gpu:TYPE:N``); None: any type (``--gres=gpu:N``)."""
    cpus_per_gpu: int | None = None
    cpus_per_task: int | None = None
    mem_mb: int | None = None
    """Memory per node, MB (``--mem``); at most one of ``mem_mb`` and ``mem_per_gpu_mb``."""
    mem_per_gpu_mb: int | None = None
    array: str | None = None
    """A job array's task indices (``--array``, e.g. ``1-40%8``); None: one job."""


@dataclass(frozen=True)
class SlurmJob:
    """A job as the controller sees it now (from squeue).

    ``restarts`` is Slurm's restart count (squeue ``RestartCnt``): how many
    times the job was requeued, i.e. the zero-based index of its current
    attempt.
    """

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    state_raw: str
    state: AttemptState
    reason: str
    nodes: list[str]
    restarts: int
    comment: str
    submit_time: datetime | None
    start_time: datetime | None
    time_limit_s: int | None
    array_job_id: int | None = None
    """The job array this row is a task of (squeue lists every task of an array on its own row)."""
    array_task: int | None = None
    """The task's index in its array; None: not an array task (or a row of several, below)."""
    array_tasks: str | None = None
    """Tasks of an array that have not started yet, listed by squeue as one row (``5-29:2``, ``%N`` cut)."""


@dataclass(frozen=True)
class ArrayRow:
    """One run of one array task from accounting: its array, its index and the run's row."""

    array_id: int
    task: int
    row: SacctRow


@dataclass(frozen=True)
class SacctRow:
    """One attempt of a job from accounting (``sacct --duplicates -X``).

    A requeued job has one row per attempt with the same ``job_id``;
    ``restarts`` is the attempt's zero-based index among those rows (sacct
    has no restart-count column, so it is derived from row order by submit
    and start time).
    """

    job_id: int
    name: str
    user: str
    account: str
    partition: str
    state_raw: str
    state: AttemptState
    nodelist: list[str]
    submit: datetime | None
    start: datetime | None
    end: datetime | None
    elapsed_s: int
    alloc_gpus: int
    exit_code: int
    exit_signal: int
    comment: str
    restarts: int = 0


@dataclass(frozen=True)
class NodeInfo:
    """One node, merged over all partitions it belongs to."""

    name: str
    state_raw: str
    state: NodeState
    partitions: list[str]
    features: list[str]
    gpus: int
    reason: str
    flags: frozenset[str] = frozenset()

    @property
    def powered_down(self) -> bool:
        return self.state is NodeState.POWERED_DOWN

    @property
    def powering_up(self) -> bool:
        return self.state is NodeState.POWERING_UP

    @property
    def idle(self) -> bool:
        return self.state is NodeState.IDLE


class StartedSubmit(abc.ABC):
    """An sbatch started by ``Backend.start_submit``, waiting for its script."""

    argv: list[str]
    """The sbatch command line it runs (``finish`` is for the request with this command line only)."""

    @abc.abstractmethod
    def finish(self, script: str) -> int:
        """Give it the batch script; the Slurm job id (or SlurmError / SlurmUnavailable, as ``submit``)."""

    @abc.abstractmethod
    def abort(self) -> None:
        """End it without a script: nothing is queued. Nothing happens once it finished or was aborted."""


class Backend(abc.ABC):
    """How gbroker talks to Slurm. See the module docstring for the rules."""

    name: str = "abstract"

    @abc.abstractmethod
    def submit(self, req: SubmitRequest) -> int:
        """Queue one batch job (as ``req.user`` when given); return its job id."""

    def start_submit(self, req: SubmitRequest) -> StartedSubmit | None:
        """Start the submission of ``req`` without its script: sbatch starts up and waits
        for the script, which ``StartedSubmit.finish`` gives it later (so its start-up
        overlaps the caller's own work, e.g. storing the intent). Nothing is queued until
        then; ``abort`` ends it with nothing queued. ``req.script`` is not sent (the
        caller renders the script at ``finish``). None: not supported, use ``submit``.
        """
        return None

    def check(self, req: SubmitRequest) -> None:  # noqa: B027  (optional: the default accepts)
        """Ask Slurm whether ``req`` would be accepted, creating nothing.

        Raises SlurmError with Slurm's reason (unknown account, partition the
        user may not use, impossible size). The default accepts everything.
        """

    @abc.abstractmethod
    def jobs(
        self, job_ids: Iterable[int] | None = None, name_prefix: str | None = None
    ) -> list[SlurmJob]:
        """Jobs the controller knows, in one call; filters apply in Python. A job array's id in
        ``job_ids`` selects all its tasks' rows (a running task is listed under its own id)."""

    @abc.abstractmethod
    def history(
        self, job_ids: Iterable[int] | None = None, since: datetime | None = None
    ) -> list[SacctRow]:
        """Every attempt from accounting for all users, in one call.

        ``since`` bounds the window; None with ``job_ids`` means all time,
        None without ``job_ids`` also means all time (pass ``since``).
        """

    def array_history(self, array_ids: Iterable[int]) -> list[ArrayRow]:
        """Every run of every task of these job arrays from accounting, in one call."""
        raise NotImplementedError(f"the {self.name} backend does not read job arrays")

    @abc.abstractmethod
    def cancel(self, job_ids: Iterable[int]) -> None:
        """Cancel jobs (one call for the whole list)."""

    def cancel_tasks(self, tasks: Iterable[tuple[int, int]]) -> None:
        """Cancel tasks of job arrays, as (Slurm array id, task index), in one call."""
        raise NotImplementedError(f"the {self.name} backend does not cancel array tasks")

    @abc.abstractmethod
    def hold(self, job_ids: Iterable[int]) -> None:
        """Hold pending jobs so they do not start (admin hold when run as root)."""

    @abc.abstractmethod
    def release(self, job_ids: Iterable[int]) -> None:
        """Release held jobs."""

    @abc.abstractmethod
    def requeue(self, job_ids: Iterable[int]) -> None:
        """Put running jobs back in the queue (a new attempt follows)."""

    def requeue_hold(self, job_ids: Iterable[int]) -> None:
        """Put jobs whose nodes are still booting (CONFIGURING) back in the queue, held: a plain
        hold leaves such a job allocated, and it starts once the nodes are up."""
        raise NotImplementedError(f"the {self.name} backend does not requeue jobs held")

    @abc.abstractmethod
    def start_now(self, job_ids: Iterable[int]) -> None:
        """Clear the begin time so requeued jobs may start at once (no 2-minute wait)."""

    @abc.abstractmethod
    def update(self, job_id: int, **fields: object) -> None:
        """Change a job: keys from :data:`UPDATE_FIELDS` (e.g. ``partition=``)."""

    @abc.abstractmethod
    def nodes(self) -> list[NodeInfo]:
        """Every node, in one call."""

    def partitions(self) -> list[PartitionInfo]:
        """Every partition's limits (MaxTime, MaxNodes, MinNodes, State), in one call; [] when the
        backend cannot tell (then placement knows no limits and Slurm's pending reason tells them)."""
        return []

    def partition_limits(self) -> dict[str, PartitionInfo]:
        """``partitions()`` by name, as last read: read again when older than
        ``broker.slurm.partitions.REFRESH_S`` (placement asks at every submission and move)."""
        return self._partition_cache().get()

    def known_partition_limits(self) -> dict[str, PartitionInfo]:
        """The limits as last read, asking Slurm nothing ({} before the first read)."""
        return self._partition_cache().known()

    def _partition_cache(self) -> PartitionCache:
        # Made on first use: subclasses need not call an __init__ of this class.
        cache = self.__dict__.get("_partitions")
        if cache is None:
            cache = self.__dict__.setdefault("_partitions", PartitionCache(self.partitions))
        return cache  # type: ignore[no-any-return]

    def gpus_in_use(self) -> dict[str, int]:
        """GPUs allocated to jobs now, per node, in one call; {} when the backend cannot tell."""
        return {}

    @abc.abstractmethod
    def power_down(self, names: Iterable[str], force: bool = False) -> None:
        """Ask Slurm to power nodes down (``force`` kills what runs there)."""

    @abc.abstractmethod
    def power_up(self, names: Iterable[str]) -> None:
        """Ask Slurm to power nodes up."""

    @abc.abstractmethod
    def ping(self) -> bool:
        """True when the controller answers."""


def time_limit_minutes(seconds: int) -> int:
    """Slurm limits are whole minutes; round up so a job never gets less than asked."""
    if seconds <= 0:
        raise SpecError(f"time limit must be positive, got {seconds}s")
    return max(1, math.ceil(seconds / 60))
