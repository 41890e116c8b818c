"""The node manager: release idle nodes, carry out Slurm's power hooks, sweep orphans, bill node time.

One tick (every ``node_tick_seconds``):

1. ingest the node journal (hooks that ran while the daemon was down);
2. read Slurm once each: nodes (sinfo), jobs (squeue), pending jobs' needs (squeue);
3. bring node sessions up to date (open/close, busy/idle stretches, users);
4. ``plan_release`` (pure; it gets each node's idle start and power-up start,
   and each partition's idle time, warm minimum, power-down flag, billing
   rule and the tick) and carry it out through Slurm: ``scontrol update
   NodeName=... State=POWER_DOWN`` (never FORCE: a job that landed meanwhile
   keeps running, Slurm powers the node down after it), POWER_UP for warm minimums;
5. with a provider: handle spot interruptions (drain, requeue, power down) and
   sweep orphans (terminate tagged instances Slurm does not hold up; mark nodes
   down that Slurm holds up with no instance behind them).

Slurm's ResumeProgram/SuspendProgram reach :meth:`NodeManager.resume` /
:meth:`NodeManager.suspend` through the socket (``broker.nodes.handlers``);
the steps they share with the hooks run while the daemon is down (reading
node facts, launching, failing nodes) are in ``broker.nodes.power``.
Slurm stays the source of truth for node state; the provider only makes
instances exist or not.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from broker.amount import format_money
from broker.db.node_models import SOURCE_HOOK, SOURCE_JOURNAL, SOURCE_OBSERVED, USAGE_BUSY, USAGE_IDLE
from broker.errors import SlurmError, SlurmUnavailable
from broker.nodes.providers import hooks
from broker.nodes.providers.base import Instance, Provider, ProviderError, sweep_plan
from broker.nodes import power
from broker.nodes import sessions as ns
from broker.nodes.policy import NodeView, PartitionRule, PendingJob, Power, plan_release
from broker.nodes.slurm import NodeSlurm
from broker.slurm.backend import NodeInfo, SlurmJob
from broker.slurm.statemap import (
    FLAG_DRAIN,
    FLAG_POWER_DOWN,
    FLAG_POWER_UP,
    FLAG_POWERED_DOWN,
    FLAG_POWERING_DOWN,
    FLAG_POWERING_UP,
    parse_node_state,
)
from broker.states import NodeState
from broker.state import Services

log = logging.getLogger(__name__)

TICK_ID = "nodes"
MARK_DOWN_REASON = "gbroker: no instance behind the node"
INTERRUPTION_REASON = "gbroker: spot interruption"
JOB_ON_NODE_STATES = frozenset(
    {"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING", "STAGE_OUT"}
)
"""squeue states of a job that occupies its nodes (finished jobs linger in squeue with a NodeList)."""


def running_job(info: NodeInfo, jobs: list[SlurmJob]) -> bool:
    """Whether a job's run time covers the node now: for billing, its time is then the job's.

    A node booting for the job that waits on it (the job CONFIGURING, the node
    powering up) is not: Slurm starts the job's run time (sacct's) once the
    node is up, so that boot is node time no job line charges, and it is
    billed as idle.
    """
    if power_of(info) is Power.BOOTING:
        return False
    if jobs:
        return any(j.state_raw.upper().split()[0] != "CONFIGURING" for j in jobs)
    return info.state is NodeState.ALLOCATED


def ticks(nodes: NodeManager) -> list[tuple[str, Callable[[], object], float]]:
    """The node tick, every ``node_tick_seconds``."""
    interval = max(1.0, float(nodes.svc.settings.node_tick_seconds))
    return [(TICK_ID, nodes.tick, interval)]


# --------------------------------------------------------------------------- reading Slurm


def power_of(info: NodeInfo) -> Power:
    flags = info.flags
    if FLAG_POWERED_DOWN in flags:
        return Power.OFF
    if flags & {FLAG_POWERING_DOWN, FLAG_POWER_DOWN}:
        return Power.STOPPING
    if flags & {FLAG_POWERING_UP, FLAG_POWER_UP}:
        return Power.BOOTING
    return Power.ON


def holds_instance(info: NodeInfo) -> bool:
    """Slurm counts on an instance behind this node (billing runs): everything but
    powered down or on its way down (SuspendProgram has been called)."""
    return not info.flags & {FLAG_POWERED_DOWN, FLAG_POWERING_DOWN}


def jobs_on_nodes(jobs: Iterable[SlurmJob]) -> dict[str, list[SlurmJob]]:
    out: dict[str, list[SlurmJob]] = {}
    for j in jobs:
        words = j.state_raw.upper().split()
        if words and words[0] in JOB_ON_NODE_STATES:
            for n in j.nodes:
                out.setdefault(n, []).append(j)
    return out


@dataclass
class Snapshot:
    """One read of Slurm: what the tick and the node list work from."""

    at: datetime
    nodes: dict[str, NodeInfo]
    on_node: dict[str, list[SlurmJob]]
    pending: list[PendingJob]


@dataclass
class TickReport:
    released: list[str] = field(default_factory=list)
    powered_up: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    marked_down: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    ingested: int = 0
    kept: dict[str, str] = field(default_factory=dict)
    error: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# --------------------------------------------------------------------------- the manager


class NodeManager:
    def __init__(self, svc: Services) -> None:
        self.svc = svc
        self.settings = svc.settings
        self.ops = threading.RLock()
        """Serialises node operations (ticks and hooks); the database has its own lock."""
        self.slurm = NodeSlurm(svc.backend)
        self._provider: Provider | None = None
        self.last: TickReport = TickReport()

    @property
    def provider(self) -> Provider | None:
        if self._provider is None and self.settings.node_provider:
            self._provider = hooks.make_provider(self.settings)
        return self._provider

    def rules(self) -> dict[str, PartitionRule]:
        tick = max(1.0, float(self.settings.node_tick_seconds))
        return {
            name: PartitionRule(name, self.settings.node_idle_seconds_for(name), p.warm_min,
                                power_down=p.power_down, billing=p.billing, tick_s=tick)
            for name, p in self.settings.managed_node_partitions().items()
        }

    def managed(self, info: NodeInfo) -> bool:
        rules = self.settings.managed_node_partitions()
        return any(p in rules for p in info.partitions)

    # ------------------------------------------------------------------ tick

    def tick(self) -> TickReport:
        report = TickReport()
        with self.ops:
            report.ingested = self.ingest_journal()
            try:
                snap = self.read_slurm()
            except SlurmUnavailable as exc:
                log.info("nodes: Slurm unreachable (%s); node state unknown, nothing released", exc)
                report.error = str(exc)
                self.last = report
                return report
            instances: list[Instance] | None = None
            if self.settings.node_provider:
                try:
                    instances = self.provider.instances() if self.provider else None
                except ProviderError as exc:
                    log.warning("nodes: provider %s: %s", self.settings.node_provider, exc)
                    report.error = str(exc)
            up_since: dict[str, datetime] = {}
            idle_since = self.observe(snap, instances, up_since)
            views = [self.view(info, snap, idle_since, up_since) for info in snap.nodes.values()
                     if self.managed(info)]
            plan = plan_release(views, snap.pending, self.rules(), snap.at)
            report.kept = plan.kept
            if plan.kept != self.last.kept:
                log.debug("nodes: kept %s; pending %s", plan.kept,
                          [(j.job_id, j.reason, j.required_nodes) for j in snap.pending])
            self.release(plan.release, plan.reasons, snap.at, report)
            self.power_up(plan.power_up, plan.reasons, snap.at, report)
            if instances is not None:
                try:
                    self.handle_interruptions(snap, report)
                    self.sweep(snap, instances, report)
                except ProviderError as exc:
                    log.warning("nodes: provider %s: %s", self.settings.node_provider, exc)
                    report.error = str(exc)
        self.last = report
        return report

    def read_slurm(self) -> Snapshot:
        now = self.svc.clock.now()
        nodes = {n.name: n for n in self.svc.backend.nodes()}
        self.svc.market.observe(nodes.values(), self._gpus_in_use(), self.svc.settings.catalog(), now)
        jobs = self.svc.backend.jobs()
        pending = self.slurm.pending_jobs(jobs)
        return Snapshot(at=now, nodes=nodes, on_node=jobs_on_nodes(jobs), pending=pending)

    def _gpus_in_use(self) -> dict[str, int]:
        """GPUs allocated per node, for the pools' free-GPU census; {} when Slurm does not say."""
        try:
            return self.svc.backend.gpus_in_use()
        except SlurmError as exc:
            log.info("nodes: GPUs in use unknown this tick: %s", exc)
            return {}

    def view(self, info: NodeInfo, snap: Snapshot, idle_since: dict[str, datetime],
             up_since: dict[str, datetime] | None = None) -> NodeView:
        busy = info.state is NodeState.ALLOCATED or bool(snap.on_node.get(info.name))
        return NodeView(
            name=info.name,
            partitions=tuple(info.partitions),
            power=power_of(info),
            busy=busy,
            usable=info.state is not NodeState.DOWN and FLAG_DRAIN not in info.flags,
            gpus=info.gpus,
            features=tuple(info.features),
            idle_since=None if busy else idle_since.get(info.name),
            up_since=(up_since or {}).get(info.name),
        )

    def observe(self, snap: Snapshot, instances: list[Instance] | None = None,
                up_since: dict[str, datetime] | None = None) -> dict[str, datetime]:
        """Bring sessions in line with what Slurm shows; return idle-since per node.

        ``up_since`` (filled in when given): each powered-up node's power-up
        start, its open session's resume time (what its pool bills from).

        A session the provider answers for ends when its instance is gone, not
        when Slurm lets go of the node: an instance still alive under a
        powered-down node keeps billing until the sweep (or the suspend hook)
        terminates it. ``instances`` None: the provider is unknown or did not
        answer, and Slurm's word is all there is."""
        idle_since: dict[str, datetime] = {}
        at = ns.whole(snap.at)
        alive = None if instances is None else {i.node_name for i in instances if i.alive}
        with self.svc.tx() as s:
            open_ = ns.open_sessions(s)
            for info in snap.nodes.values():
                if not self.managed(info):
                    continue
                sess = open_.get(info.name)
                if not holds_instance(info):
                    if sess is None:
                        continue
                    ours = bool(sess.provider) and sess.provider == self.settings.node_provider
                    if ours and alive is not None and info.name in alive:
                        continue
                    ns.close_session(s, sess, at, f"Slurm shows {info.state_raw}")
                    continue
                if sess is None:
                    part = hooks.home_partition(self.settings, info.partitions)
                    sess, _ = ns.open_session(
                        s, self.settings, node=info.name, partition=part,
                        capacity=self.settings.node_capacity(part), gpus=info.gpus, provider="",
                        source=SOURCE_OBSERVED, key=_key("observed", info.name, at.isoformat()), at=at,
                    )  # fmt: skip
                if up_since is not None:
                    up_since[info.name] = sess.resumed_at
                jobs = snap.on_node.get(info.name, [])
                busy = info.state is NodeState.ALLOCATED or bool(jobs)
                ns.set_usage(s, sess, USAGE_BUSY if running_job(info, jobs) else USAGE_IDLE, at)
                ns.add_users(sess, {j.user for j in jobs if j.user})
                if not busy:
                    cur = ns.current_usage(s, sess)
                    if cur is not None:
                        idle_since[info.name] = cur.started_at
        return idle_since

    # ------------------------------------------------------------------ acting through Slurm

    def release(self, names: list[str], reasons: dict[str, str], at: datetime, report: TickReport) -> None:
        if not names:
            return
        with self.svc.tx() as s:  # intent first: the event says why, even if Slurm then refuses
            for n in names:
                ns.add_event(s, "node_release", ns.whole(at), f"releasing {n}: {reasons.get(n, '')}",
                             node=n, reason=reasons.get(n, ""))
        try:
            self.svc.backend.power_down(names, force=False)
            report.released += names
            log.info("nodes: released %s", ", ".join(names))
        except SlurmError as exc:
            log.warning("nodes: power down of %s refused: %s", ", ".join(names), exc)
            report.error = str(exc)

    def power_up(self, names: list[str], reasons: dict[str, str], at: datetime, report: TickReport) -> None:
        if not names:
            return
        with self.svc.tx() as s:
            for n in names:
                ns.add_event(s, "node_power_up", ns.whole(at), f"powering up {n}: {reasons.get(n, '')}",
                             node=n, reason=reasons.get(n, ""))
        try:
            self.svc.backend.power_up(names)
            report.powered_up += names
        except SlurmError as exc:
            log.warning("nodes: power up of %s refused: %s", ", ".join(names), exc)

    # ------------------------------------------------------------------ provider side

    def handle_interruptions(self, snap: Snapshot, report: TickReport) -> None:
        """A reclaimed (or about to be reclaimed) spot node: drain it so nothing new
        starts, requeue its jobs so they run elsewhere, and power it down."""
        assert self.provider is not None
        hit = [n for n in self.provider.interruptions() if n in snap.nodes and holds_instance(snap.nodes[n])]
        if not hit:
            return
        at = ns.whole(snap.at)
        todo: list[str] = []
        with self.svc.tx() as s:
            for name in hit:
                sess = ns.open_session_of(s, name)
                if sess is not None and sess.interrupted_at is not None:
                    continue  # handled for this power-up already
                jobs = sorted(j.job_id for j in snap.on_node.get(name, []))
                if sess is not None:
                    sess.interrupted_at = at
                ns.add_event(s, "node_interrupted", at, f"{name}: spot interruption; requeueing {jobs or 'nothing'}",
                             node=name, jobs=jobs)
                todo.append(name)
        for name in todo:
            jobs = sorted(j.job_id for j in snap.on_node.get(name, []))
            try:
                self.slurm.set_state([name], "DRAIN", INTERRUPTION_REASON)
                if jobs:
                    self.svc.backend.requeue(jobs)
                self.svc.backend.power_down([name], force=False)
                report.interrupted.append(name)
            except SlurmError as exc:
                log.warning("nodes: handling the interruption of %s failed: %s", name, exc)

    def sweep(self, snap: Snapshot, instances: list[Instance], report: TickReport) -> None:
        """Terminate our instances Slurm does not hold up; mark down nodes it holds up without one.

        "Held up" here is everything but powered down: a node powering down is
        being suspended by its hook right now, and one that already has a power
        down pending still runs its last job."""
        assert self.provider is not None
        at = snap.at
        held = [n for n, info in snap.nodes.items() if FLAG_POWERED_DOWN not in info.flags]
        plan = sweep_plan(instances, held, at, int(self.settings.node_sweep_grace_seconds))
        if plan.terminate:
            ids = [i.instance_id for i in plan.terminate]
            with self.svc.tx() as s:
                for inst in plan.terminate:
                    ns.add_event(s, "node_orphan_terminated", ns.whole(at),
                                 f"terminating {inst.instance_id} ({inst.node_name or 'no node'}): "
                                 f"{plan.reasons.get(inst.instance_id, '')}",
                                 node=inst.node_name, instance_id=inst.instance_id,
                                 reason=plan.reasons.get(inst.instance_id, ""),
                                 launched_at=inst.launched_at.isoformat())
            self.provider.terminate(ids)
            report.terminated += ids
            log.warning("nodes: swept orphan instance(s) %s", ", ".join(ids))
            gone = set(ids)
            still = {i.node_name for i in instances if i.alive and i.instance_id not in gone}
            with self.svc.tx() as s:
                for name in sorted({i.node_name for i in plan.terminate if i.node_name} - still):
                    sess = ns.open_session_of(s, name)
                    if sess is not None and sess.provider == self.settings.node_provider:
                        ns.close_session(s, sess, at, "instance terminated by the orphan sweep")
        self._mark_down(plan.mark_down, snap, report)

    def _mark_down(self, candidates: list[str], snap: Snapshot, report: TickReport) -> None:
        """Only nodes gbroker resumed through its provider, up (not booting) and not
        already down: a node brought up some other way is not ours to judge."""
        grace = timedelta(seconds=self.settings.node_sweep_grace_seconds)
        at = ns.whole(snap.at)
        todo: list[str] = []
        with self.svc.tx() as s:
            for name in candidates:
                info = snap.nodes[name]
                sess = ns.open_session_of(s, name)
                if (
                    sess is None
                    or sess.source == SOURCE_OBSERVED
                    or sess.provider != self.settings.node_provider
                    or power_of(info) is not Power.ON
                    or parse_node_state(info.state_raw).held_out
                    or at - sess.resumed_at < grace
                ):
                    continue
                ns.add_event(s, "node_marked_down", at, f"{name}: Slurm holds it up but no instance backs it",
                             node=name, reason=MARK_DOWN_REASON, session=sess.id)
                ns.close_session(s, sess, at, "no instance behind the node (sweep)")
                todo.append(name)
        if todo:
            try:
                self.slurm.set_state(todo, "DOWN", MARK_DOWN_REASON)
                report.marked_down += todo
            except SlurmError as exc:
                log.warning("nodes: marking %s down failed: %s", ", ".join(todo), exc)

    # ------------------------------------------------------------------ hooks

    def resume(self, names: list[str], key: str) -> dict[str, Any]:
        """ResumeProgram: a session per node (intent), then the provider, then the outcome.

        A node that already has an open session is being resumed again (Slurm may
        do that): the provider gets the same generation, so nothing boots twice."""
        provider = self.provider
        if provider is None:
            hooks.make_provider(self.settings)  # raises the "no provider configured" error
        assert provider is not None
        with self.ops:
            self.ingest_journal()
            facts = power.read_facts(self.svc.backend, names, _facts_warning)
            at = ns.whole(self.svc.clock.now())
            generation: dict[str, str] = {}
            repeats: list[str] = []
            with self.svc.tx() as s:
                for t in hooks.targets(self.settings, names, facts):
                    sess, created = ns.open_session(
                        s, self.settings, node=t.request.name, partition=t.request.partition,
                        capacity=t.request.capacity.value, gpus=t.gpus, provider=provider.name,
                        source=SOURCE_HOOK, key=_key(key, t.request.name), at=at,
                    )  # fmt: skip
                    # Not new: either a tick saw Slurm power the node up a moment before this hook
                    # ran (a busy machine), and this is the resume itself; or a second resume.
                    if not created and not ns.claim(s, sess, source=SOURCE_HOOK, provider=provider.name, at=at):
                        repeats.append(t.request.name)
                        ns.add_event(s, "node_resume_repeat", at, f"{t.request.name}: resume again, same power-up",
                                     node=t.request.name, session=sess.id)
                    generation[t.request.name] = sess.open_key
            requests = [t.request for t in hooks.targets(self.settings, names, facts, generation)]
            instances, failures = power.launch(provider, requests)
            with self.svc.tx() as s:
                for inst in instances:
                    mine = ns.open_session_of(s, inst.node_name)
                    if mine is not None and mine.instance_id != inst.instance_id:
                        mine.instance_id = inst.instance_id
                for name, why in failures.items():
                    failed = ns.open_session_of(s, name)
                    ns.add_event(s, "node_resume_failed", at, f"{name}: {why}", node=name, error=why)
                    if failed is not None:
                        ns.close_session(s, failed, self.svc.clock.now(), f"resume failed: {why}")
            if failures:
                power.fail_nodes(self.slurm, sorted(failures), _down_warning)
        return {
            "resumed": {i.node_name: i.instance_id for i in instances},
            "repeated": repeats,
            "failed": failures,
        }

    def suspend(self, names: list[str], key: str, reason: str = "suspended by Slurm") -> dict[str, Any]:
        """SuspendProgram (and ResumeFailProgram): terminate through the provider, close the sessions."""
        provider = self.provider
        if provider is None:
            hooks.make_provider(self.settings)
        assert provider is not None
        with self.ops:
            self.ingest_journal()
            provider.suspend(names)  # an error leaves the sessions open: the sweep retries
            at = self.svc.clock.now()
            closed: list[str] = []
            with self.svc.tx() as s:
                for name in names:
                    sess = ns.open_session_of(s, name)
                    if sess is not None:
                        ns.close_session(s, sess, at, reason, key=_key(key, name))
                        closed.append(name)
        return {"suspended": names, "closed": closed}

    def resume_failed(self, names: list[str], key: str) -> dict[str, Any]:
        """ResumeFailProgram: Slurm gave up waiting (ResumeTimeout) and marked the nodes
        down; terminate whatever half-booted instance exists and stop billing."""
        with self.ops:
            at = ns.whole(self.svc.clock.now())
            with self.svc.tx() as s:
                for name in names:
                    ns.add_event(s, "node_resume_failed", at, f"{name}: Slurm's ResumeTimeout passed", node=name,
                                 error="ResumeTimeout")
            return self.suspend(names, key, reason="resume failed (ResumeTimeout)")

    # ------------------------------------------------------------------ views

    def status(self) -> list[dict[str, Any]]:
        """Every node of the managed partitions: power, capacity, price, idle since, users."""
        snap = self.read_slurm()
        at = ns.whole(snap.at)
        out = []
        with self.svc.sessions() as s:
            open_ = ns.open_sessions(s)
            for name in sorted(snap.nodes):
                info = snap.nodes[name]
                if not self.managed(info):
                    continue
                sess = open_.get(name)
                cur = ns.current_usage(s, sess) if sess is not None else None
                part = sess.partition if sess else hooks.home_partition(self.settings, info.partitions)
                jobs = snap.on_node.get(name, [])
                out.append({
                    "node": name, "partitions": info.partitions, "state": info.state_raw,
                    "power": power_of(info).value, "capacity": self.settings.node_capacity(part),
                    "gpus": info.gpus, "price_micros": sess.price_micros if sess and sess.price_known else None,
                    "price": f"{format_money(sess.price_micros)}/h" if sess and sess.price_known else "",
                    "resumed_at": sess.resumed_at.isoformat() if sess else None,
                    "billed_s": int((at - sess.resumed_at).total_seconds()) if sess else 0,
                    "idle_since": cur.started_at.isoformat() if cur and cur.state == USAGE_IDLE else None,
                    "users": sorted({j.user for j in jobs if j.user}),
                    "jobs": sorted(j.job_id for j in jobs),
                    "instance_id": sess.instance_id if sess else None,
                    "note": self.last.kept.get(name, ""),
                    "reason": info.reason,
                })  # fmt: skip
        return out

    # ------------------------------------------------------------------ journal

    def ingest_journal(self) -> int:
        """Apply what hooks recorded while the daemon was down. Idempotent by record id."""
        aside, records = hooks.take_journal(self.settings.node_journal)
        if aside is None:
            return 0
        applied = 0
        with self.svc.tx() as s:
            for rec in sorted(records, key=lambda r: r["at"]):
                applied += self._apply(s, rec)
        hooks.finish_journal(aside)
        if records:
            log.info("nodes: ingested %d journal record(s), %d change(s)", len(records), applied)
        return applied

    def _apply(self, s: Any, rec: dict[str, Any]) -> int:
        at = datetime.fromisoformat(rec["at"])
        changes = 0
        for node in rec["nodes"]:
            name = str(node["name"])
            key = _key(rec["id"], name)
            if rec["action"] == "resume":
                if node.get("error"):
                    if not ns.event_with_key(s, "node_resume_failed", key):
                        ns.add_event(s, "node_resume_failed", ns.whole(at), f"{name}: {node['error']} (journal)",
                                     node=name, error=node["error"], key=key)
                        changes += 1
                    continue
                sess, created = ns.open_session(
                    s, self.settings, node=name, partition=str(node.get("partition", "")),
                    capacity=str(node.get("capacity", "ondemand")), gpus=int(node.get("gpus") or 0),
                    provider=self.settings.node_provider, source=SOURCE_JOURNAL, key=key, at=at,
                    instance_id=node.get("instance_id"),
                )  # fmt: skip
                if not created:
                    ns.backdate(s, sess, at, SOURCE_JOURNAL)
                    # The hook did act on this power-up: a session a tick opened is the provider's now.
                    ns.claim(s, sess, source=SOURCE_JOURNAL, provider=self.settings.node_provider, at=at)
                    if node.get("instance_id") and not sess.instance_id:
                        sess.instance_id = node["instance_id"]
                changes += int(created)
            else:
                if ns.session_by_close_key(s, key) is not None:
                    continue
                current = ns.open_session_of(s, name)
                if current is None or current.resumed_at > at:
                    continue  # nothing open then: a later power-up is not this suspend's business
                reason = "suspended by Slurm (journal)" if rec["action"] == "suspend" else "resume failed (journal)"
                ns.close_session(s, current, at, reason, key=key)
                changes += 1
        return changes


def _facts_warning(exc: SlurmError) -> None:
    log.warning("nodes: could not read node partitions (%s); using defaults", exc)


def _down_warning(names: list[str], exc: SlurmError) -> None:
    log.warning("nodes: could not mark %s down after a failed resume: %s", ", ".join(names), exc)


def _key(*parts: str) -> str:
    """A session key of at most 64 characters, stable for the same parts."""
    text = ":".join(parts)
    return text if len(text) <= 64 else "h:" + hashlib.sha256(text.encode()).hexdigest()[:60]
