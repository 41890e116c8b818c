"""Which idle nodes to release, and which to power up for a warm minimum. Pure.

``plan_release(nodes, pending, rules, now)`` reads nothing but its arguments
(no Slurm, no database, no clock), so every rule below is tested table-driven
and the daemon only carries the plan out:

1. Only nodes of managed partitions, powered up (not booting, not on their way
   down), usable (not DOWN or drained: that is the admin's call) and without
   a job are candidates.
2. A candidate is released once it has been idle at least its partition's idle
   time (a node in several managed partitions uses the longest).
3. Pending jobs that could start on a candidate keep it: each waiting job holds
   as many fitting candidates as it needs nodes. Jobs that cannot start whatever
   the nodes do (held, waiting for a dependency or a begin time, over a limit)
   hold nothing, or a held job would keep a node billing forever.
4. A partition's warm minimum keeps that many nodes powered up (longest-idle
   nodes go first when some may go), and powers nodes up to reach it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum


class Power(str, Enum):
    """A node's power as Slurm reports it."""

    OFF = "off"
    """Powered down: no instance, no bill."""
    BOOTING = "booting"
    """Resume requested or under way."""
    ON = "on"
    STOPPING = "stopping"
    """Power down requested or under way."""


BLOCKED_REASON_PREFIXES: tuple[str, ...] = (
    "JobHeld",  # JobHeldUser, JobHeldAdmin
    "Dependency",  # Dependency, DependencyNeverSatisfied
    "BeginTime",
    "PartitionDown",
    "PartitionInactive",
    "PartitionTimeLimit",
    "PartitionNodeLimit",
    "InvalidAccount",
    "InvalidQOS",
    "Assoc",  # AssocGrp*Limit, AssocMax*Limit
    "QOS",  # QOSGrp*Limit, QOSMax*Limit, QOSJobLimit
    "AccountNotAllowed",
    "BadConstraints",
    "FrontEndDown",
    "Licenses",
)
"""Pending reasons that mean "cannot start now, whatever the nodes do".

``ReqNodeNotAvail`` is judged by its node list instead: cloud nodes that are
powering up or down show up there too, and those will be available; a job
waiting for a DOWN or drained node holds nothing (it would leak the others)."""
REQ_NODE_NOT_AVAIL = "ReqNodeNotAvail"


@dataclass(frozen=True)
class NodeView:
    """One node as the release decision needs it."""

    name: str
    partitions: tuple[str, ...]
    power: Power
    busy: bool
    """A job is on it (allocated, completing, planned by backfill, or listed by squeue)."""
    usable: bool = True
    """False when DOWN, drained, failing or in maintenance."""
    gpus: int = 0
    features: tuple[str, ...] = ()
    idle_since: datetime | None = None
    """Start of the current idle stretch; None when unknown (never released then)."""


@dataclass(frozen=True)
class PendingJob:
    """A job waiting in Slurm, with what it needs of a node."""

    job_id: int
    partitions: tuple[str, ...]
    nodes: int = 1
    gpus_per_node: int = 0
    constraint: str = ""
    """Slurm --constraint text: 'spot', 'a&b', 'a|b'; '' for none."""
    required_nodes: tuple[str, ...] = ()
    reason: str = ""
    unavailable: tuple[str, ...] = ()
    """Nodes named by ``ReqNodeNotAvail, UnavailableNodes:...``."""


@dataclass(frozen=True)
class PartitionRule:
    name: str
    idle_s: float
    warm_min: int = 0


@dataclass(frozen=True)
class ReleasePlan:
    release: list[str] = field(default_factory=list)
    """Nodes to power down now, longest idle first."""
    power_up: list[str] = field(default_factory=list)
    """Powered-down nodes to wake for a warm minimum."""
    kept: dict[str, str] = field(default_factory=dict)
    """Powered-up nodes that stay, and why (for `gbroker node list` and the log)."""
    reasons: dict[str, str] = field(default_factory=dict)
    """Why each released or woken node was chosen."""


def job_can_start(job: PendingJob, nodes: Mapping[str, NodeView] | None = None) -> bool:
    """False for pending reasons that no idle node can help with."""
    reason = job.reason.strip()
    if reason.startswith(REQ_NODE_NOT_AVAIL):
        if not job.unavailable:
            return False  # reserved, or a reason we cannot tie to nodes
        known = nodes or {}
        return all(n in known and known[n].usable for n in job.unavailable)
    return not any(reason.startswith(p) for p in BLOCKED_REASON_PREFIXES)


def constraint_met(constraint: str, features: Iterable[str]) -> bool:
    """Slurm's simple constraint forms: AND (&, ,) of ORs (|). Anything fancier
    (counts, brackets) is assumed to fit, which only ever keeps a node longer."""
    text = constraint.strip()
    if not text:
        return True
    if re.search(r"[\[\]*()]", text):
        return True
    have = set(features)
    for term in re.split(r"[&,]", text):
        options = [o.strip() for o in term.split("|") if o.strip()]
        if options and not any(o in have for o in options):
            return False
    return True


def fits(job: PendingJob, node: NodeView) -> bool:
    """Could ``job`` run on ``node`` (partition, GPUs, features, required node list)?"""
    if not set(job.partitions) & set(node.partitions):
        return False
    if job.required_nodes and node.name not in job.required_nodes:
        return False
    if job.gpus_per_node > node.gpus:
        return False
    return constraint_met(job.constraint, node.features)


def _idle_limit(node: NodeView, rules: Mapping[str, PartitionRule]) -> float:
    return max(rules[p].idle_s for p in node.partitions if p in rules)


def plan_release(
    nodes: Iterable[NodeView],
    pending: Iterable[PendingJob],
    rules: Mapping[str, PartitionRule],
    now: datetime,
) -> ReleasePlan:
    """Decide which nodes to release and which to wake. See the module docstring."""
    managed = sorted((n for n in nodes if any(p in rules for p in n.partitions)), key=lambda n: n.name)
    kept: dict[str, str] = {}
    reasons: dict[str, str] = {}
    candidates: list[NodeView] = []
    for n in managed:
        if n.power is not Power.ON:
            if n.power is Power.BOOTING:
                kept[n.name] = "powering up"
            continue
        if n.busy:
            kept[n.name] = "running a job"
        elif not n.usable:
            kept[n.name] = "down or drained: left to the admin"
        elif n.idle_since is None:
            kept[n.name] = "idle, since when not known yet"
        else:
            candidates.append(n)

    # Pending jobs that could start hold fitting candidates (one per node they need).
    free = {n.name: n for n in candidates}
    by_name = {n.name: n for n in managed}
    for job in sorted(pending, key=lambda j: j.job_id):
        if not job_can_start(job, by_name):
            continue
        want = max(1, job.nodes)
        for name in sorted(free, key=lambda nm: (free[nm].idle_since, nm)):
            if want == 0:
                break
            if fits(job, free[name]):
                kept[name] = f"held for pending job {job.job_id}"
                del free[name]
                want -= 1

    # Idle long enough?
    due: list[NodeView] = []
    for n in free.values():
        assert n.idle_since is not None
        idle_for = (now - n.idle_since).total_seconds()
        limit = _idle_limit(n, rules)
        if idle_for >= limit:
            due.append(n)
        else:
            kept[n.name] = f"idle {idle_for:.0f}s of {limit:.0f}s"

    # Warm minimum: count what is (or is becoming) powered up per partition.
    up: dict[str, int] = {p: 0 for p in rules}
    for n in managed:
        if n.power in (Power.ON, Power.BOOTING):
            for p in n.partitions:
                if p in up:
                    up[p] += 1
    release: list[str] = []
    for n in sorted(due, key=lambda n: (n.idle_since, n.name)):
        mine = [p for p in n.partitions if p in rules]
        short = [p for p in mine if up[p] - 1 < rules[p].warm_min]
        if short:
            kept[n.name] = f"warm minimum of {', '.join(short)}"
            continue
        for p in mine:
            up[p] -= 1
        release.append(n.name)
        assert n.idle_since is not None
        reasons[n.name] = (
            f"idle {(now - n.idle_since).total_seconds():.0f}s >= {_idle_limit(n, rules):.0f}s, "
            "no pending job fits it"
        )

    power_up: list[str] = []
    for p in sorted(rules):
        rule = rules[p]
        if up[p] >= rule.warm_min:
            continue
        for n in managed:
            if up[p] >= rule.warm_min:
                break
            if p in n.partitions and n.power is Power.OFF and n.usable and n.name not in power_up:
                power_up.append(n.name)
                reasons[n.name] = f"warm minimum {rule.warm_min} of {p}"
                for q in n.partitions:
                    if q in up:
                        up[q] += 1
    return ReleasePlan(release=release, power_up=power_up, kept=kept, reasons=reasons)
