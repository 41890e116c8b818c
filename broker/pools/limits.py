"""Whether a pool's Slurm partition takes a job of this length and size, and what to do if none does.

Slurm accepts a job above its partition's MaxTime (or outside MinNodes..MaxNodes)
and leaves it pending for ever (``PartitionTimeLimit``, ``PartitionNodeLimit``).
Placement asks :func:`partition_refuses` of each pool that fits the job's GPUs,
skips the pools whose partition would never start it, and, when none is left,
refuses the submission with :func:`limits_hint`. Pure: the limits come in as
read by the Slurm layer (``broker.slurm.partitions``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from broker.durations import format_duration


class Limits(Protocol):
    """A partition's limits for one job (``broker.slurm.partitions.PartitionInfo`` is one)."""

    @property
    def name(self) -> str: ...
    @property
    def max_time_s(self) -> int | None: ...
    @property
    def max_nodes(self) -> int | None: ...
    @property
    def min_nodes(self) -> int: ...
    @property
    def state(self) -> str: ...


TAKES_NO_JOBS = frozenset({"INACTIVE", "DRAIN"})
"""Partition states in which Slurm refuses new jobs (a DOWN partition queues them, and they wait)."""


def slurm_minutes_s(time_limit_s: int) -> int:
    """The time limit Slurm is given, in seconds: whole minutes, rounded up (as sbatch is given it)."""
    return max(1, -(-time_limit_s // 60)) * 60


def slurm_duration(seconds: int) -> str:
    """Seconds as Slurm prints a time limit: ``1:00:00``, ``2-00:00:00``, ``30:00``."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours}:{minutes:02d}:{secs:02d}" if hours or days else f"{minutes}:{secs:02d}"
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}" if days else clock


def partition_refuses(limits: Limits | None, time_limit_s: int, nodes: int) -> str | None:
    """None when the partition would start a job of ``time_limit_s`` on ``nodes`` nodes
    (or its limits are not known), else why not, naming the limit (one short sentence)."""
    if limits is None:
        return None
    name = limits.name
    if limits.state.upper() in TAKES_NO_JOBS:
        return f"partition {name} is {limits.state.upper()} in Slurm and takes no new jobs"
    asked = slurm_minutes_s(time_limit_s)
    if limits.max_time_s is not None and asked > limits.max_time_s:
        return (f"partition {name} allows at most {slurm_duration(limits.max_time_s)} (MaxTime), "
                f"the job asks for {slurm_duration(asked)}")
    if limits.max_nodes is not None and nodes > limits.max_nodes:
        return f"partition {name} allows at most {limits.max_nodes} node(s) per job (MaxNodes), the job asks for {nodes}"
    if nodes < limits.min_nodes:
        return f"partition {name} needs at least {limits.min_nodes} nodes per job (MinNodes), the job asks for {nodes}"
    return None


def limits_hint(limits: Iterable[Limits], time_limit_s: int, nodes: int) -> str:
    """What to do when no pool's partition takes the job: the longest time and the most
    nodes any of these partitions allows, in the CLI's own words."""
    limits = [lim for lim in limits if lim.state.upper() not in TAKES_NO_JOBS]
    asks: list[str] = []
    times = [lim.max_time_s for lim in limits]
    if times and None not in times:
        longest = max(t for t in times if t is not None)
        if slurm_minutes_s(time_limit_s) > longest:
            asks.append(f"--time {format_duration(longest)} or less")
    counts = [lim.max_nodes for lim in limits]
    if counts and None not in counts:
        most = max(c for c in counts if c is not None)
        if nodes > most:
            asks.append(f"--nodes {most} or fewer")
    ask = f"ask for {' and '.join(asks)} (split longer work into runs that checkpoint), or " if asks else ""
    return f"{ask}ask an admin to raise the partition's limit (`scontrol show partition` shows them); nothing was stored"

