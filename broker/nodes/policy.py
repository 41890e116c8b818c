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
5. How the node's pool bills decides when an idle node goes:

   * a pool with ``power_down = false`` (owned and reserved, by default) is
     never released;
   * per second (or when the release window would be shorter than a node
     tick): once idle its idle time, as in 2;
   * in increments (per started hour, per minute, ...): a node whose current
     increment is already paid is kept while it lasts, and released once it
     is idle its idle time AND the end of its paid increment is at most
     ``release_margin_s`` away (two node ticks, at least 30 s, never more than
     10 % of the increment), so the suspend lands before the next increment
     starts. An idle node kept for its paid time is the one a new job gets:
     Slurm places jobs on powered-up nodes before powered-down ones.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from broker.pools.catalog import Billing


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
    up_since: datetime | None = None
    """Start of the current power-up (its billed session's resume); None when unknown."""


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
    power_down: bool = True
    """False: the partition's nodes are never released (owned and reserved pools by default)."""
    billing: Billing = Billing()
    """How the partition's pool bills node time (per second by default)."""
    tick_s: float = 30.0
    """The node tick's interval: the release window before a paid increment ends is two of them."""


MIN_MARGIN_S = 30.0
"""The release window before a paid increment ends is at least this long..."""
MAX_MARGIN_SHARE = 0.10
"""...and never more than this share of the increment."""


def release_margin_s(increment_s: int, tick_s: float) -> float:
    """How long before its paid increment ends an idle node is released.

    Two node ticks (one to decide, one of slack for the suspend to land), at
    least 30 s, never more than 10 % of the increment: 60 s for an hourly pool
    with 30 s ticks, 18 s for a 180 s increment.
    """
    return min(max(2.0 * tick_s, MIN_MARGIN_S), MAX_MARGIN_SHARE * increment_s)


def paid_left_s(billing: Billing, up_s: float) -> float:
    """Seconds until the node's paid time ends, ``up_s`` seconds after its power-up began.

    Per started increment: at exactly one increment the paid time is over (0
    left); a moment later the next one is paid for.
    """
    return billing.paid_until_s(max(1, math.ceil(up_s))) - up_s


def keeps_paid_time(rule: PartitionRule) -> bool:
    """Whether nodes of ``rule`` are kept for their paid increment: billed in increments, and the
    release window is at least a tick long (else a tick could miss it and keep a whole increment more)."""
    return rule.billing.increment_s > 1 and release_margin_s(rule.billing.increment_s, rule.tick_s) >= rule.tick_s


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


def _billing_rule(node: NodeView, rules: Mapping[str, PartitionRule]) -> PartitionRule:
    """The rule whose billing decides for ``node``: of its managed partitions, the longest increment."""
    return max((rules[p] for p in node.partitions if p in rules), key=lambda r: (r.billing.increment_s, r.name))


def _never_released(node: NodeView, rules: Mapping[str, PartitionRule]) -> list[str]:
    return [p for p in node.partitions if p in rules and not rules[p].power_down]


def _paid_window(node: NodeView, rules: Mapping[str, PartitionRule], now: datetime) -> tuple[bool, str]:
    """(release now, why) for an idle node past its idle time, by its pool's billing."""
    rule = _billing_rule(node, rules)
    if not keeps_paid_time(rule):
        return True, ""
    if node.up_since is None:
        return True, "; power-up start not known: released as if billed per second"
    up_s = (now - node.up_since).total_seconds()
    left = paid_left_s(rule.billing, up_s)
    margin = release_margin_s(rule.billing.increment_s, rule.tick_s)
    if left <= margin:
        return True, f"; its paid time ends in {left:.0f}s (<= {margin:.0f}s, billed {rule.billing.describe()})"
    return False, (f"idle, paid for {left:.0f}s more (billed {rule.billing.describe()}): "
                   f"released {margin:.0f}s before that ends")


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
        never = _never_released(n, rules)
        if never:
            kept[n.name] = f"never released: {', '.join(never)} has power_down = false"
        elif n.busy:
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
    paid_note: dict[str, str] = {}
    for n in free.values():
        assert n.idle_since is not None
        idle_for = (now - n.idle_since).total_seconds()
        limit = _idle_limit(n, rules)
        if idle_for < limit:
            kept[n.name] = f"idle {idle_for:.0f}s of {limit:.0f}s"
            continue
        go, why = _paid_window(n, rules, now)
        if go:
            due.append(n)
            paid_note[n.name] = why
        else:
            kept[n.name] = why

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
            f"no pending job fits it{paid_note.get(n.name, '')}"
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
