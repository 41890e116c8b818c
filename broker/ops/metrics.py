"""Prometheus metrics, computed at scrape time from the database and the daemon's own stats.

Gauges (jobs, budgets) are read from the store on each scrape, and so are
the counters the append-only records already hold (reclaims and moves from
the event log, lost GPU time from the ledger, idle node time from the node
sessions): the daemon needs no hook in the domains to keep them. Tick
times, Slurm calls and the lease come from ``DaemonStats``.

Names follow Prometheus' conventions: ``gbroker_`` prefix, the unit in the
name (``_seconds``, ``_gpu_seconds``, ``_micros`` for money in micro-units
of the settings' currency, which is a label), ``_total`` on counters.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from broker.db.ledger_models import Budget, Charge, LabGroup, Semester
from broker.db.models import Event, Job, Lease
from broker.db.node_models import NodeSession
from broker.db.ops_models import OutboxMessage
from broker.money import budgets, pricebook
from broker.ops.stats import DaemonStats
from broker.state import Services

log = logging.getLogger(__name__)

RECLAIM_KINDS = ("reclaimed", "preempted")
MOVE_KINDS = ("fallback",)
BOOT_FAILURE_KINDS = ("boot_failed",)


class BrokerCollector(Collector):
    def __init__(self, svc: Services, stats: DaemonStats) -> None:
        self.svc = svc
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        yield from self._daemon()
        try:
            with self.svc.sessions() as s:
                families = list(self._store(s))
        except Exception as exc:  # a scrape must answer; say what failed
            log.warning("metrics: reading the database failed: %s", exc)
            up = GaugeMetricFamily("gbroker_database_up", "1 when the last scrape could read the database")
            up.add_metric([], 0)
            yield up
            return
        up = GaugeMetricFamily("gbroker_database_up", "1 when the last scrape could read the database")
        up.add_metric([], 1)
        yield up
        yield from families

    # -- what the daemon knows ------------------------------------------------
    def _daemon(self) -> Iterator[Metric]:
        ticks = self.stats.snapshot()
        dur = SummaryMetricFamily("gbroker_tick_duration_seconds", "Time the ticks took", labels=["tick"])
        last = GaugeMetricFamily("gbroker_tick_last_duration_seconds", "Time the last run of each tick took",
                                 labels=["tick"])
        age = GaugeMetricFamily("gbroker_tick_age_seconds", "Seconds since each tick last finished",
                                labels=["tick"])
        errors = CounterMetricFamily("gbroker_tick_errors_total", "Tick runs that raised", labels=["tick"])
        for name, st in sorted(ticks.items()):
            dur.add_metric([name], count_value=st.runs, sum_value=st.seconds_total)
            last.add_metric([name], st.last_seconds)
            errors.add_metric([name], st.errors)
            a = self.stats.tick_age(name)
            if a is not None:
                age.add_metric([name], a)
        yield from (dur, last, age, errors)
        calls = CounterMetricFamily("gbroker_slurm_calls_total", "Calls to the Slurm backend", labels=["call"])
        errs = CounterMetricFamily("gbroker_slurm_call_errors_total", "Slurm backend calls that failed",
                                   labels=["call", "error"])
        with self.stats.lock:
            for call, n in sorted(self.stats.slurm_calls.items()):
                calls.add_metric([call], n)
            for (call, kind), n in sorted(self.stats.slurm_errors.items()):
                errs.add_metric([call, kind], n)
        refused = CounterMetricFamily(
            "gbroker_ops_connections_refused_total",
            "Connections the metrics/dashboard listener answered 503 at once: per_peer (one user's share "
            "of its slots taken), full (every shared slot taken)", labels=["why"])
        with self.stats.lock:
            for why in ("per_peer", "full"):
                refused.add_metric([why], self.stats.connections_refused.get(why, 0))
        yield from (calls, errs, refused)
        reach = GaugeMetricFamily("gbroker_slurm_up", "1 when the Slurm controller answered the last tick")
        reach.add_metric([], 1 if self.svc.slurm_down_since is None else 0)
        held = GaugeMetricFamily("gbroker_lease_held", "1 when this daemon holds the single-writer lease")
        lease_age = self.stats.lease_age()
        held.add_metric([], 1 if lease_age is not None and lease_age <= self.svc.settings.lease_ttl_seconds else 0)
        start = GaugeMetricFamily("gbroker_start_time_seconds", "When this daemon started (Unix time)")
        start.add_metric([], self.stats.started_wall)
        yield from (reach, held, start)

    # -- what the store holds ----------------------------------------------------
    def _store(self, s: Session) -> Iterator[Metric]:
        settings = self.svc.settings
        catalog = settings.catalog()

        def pool(partition: str | None) -> str:
            if not partition:
                return ""
            p = catalog.by_partition(partition)
            return p.name if p is not None else partition

        jobs = GaugeMetricFamily("gbroker_jobs", "Jobs by state, pool and group", labels=["state", "pool", "group"])
        counts: dict[tuple[str, str, str], int] = {}
        for state, partition, group, n in s.execute(
            select(Job.state, Job.partition, Job.group_name, func.count()).group_by(
                Job.state, Job.partition, Job.group_name)
        ):
            k = (state.value, pool(partition), group)
            counts[k] = counts.get(k, 0) + n
        for k, n in sorted(counts.items()):
            jobs.add_metric(list(k), n)
        yield jobs

        yield self._event_counter(s, "gbroker_reclaims_total", "Spot reclaims and preemptions of jobs' runs",
                                  RECLAIM_KINDS)
        yield self._event_counter(s, "gbroker_boot_failures_total", "Runs whose node never came up (not "
                                  "reclaims; nothing lost or charged)", BOOT_FAILURE_KINDS)
        yield self._event_counter(s, "gbroker_moves_total", "Jobs moved by gbroker (to on-demand for a deadline, "
                                  "onto capacity already paid for, or from on-demand back to spot)", MOVE_KINDS)

        lost = CounterMetricFamily("gbroker_lost_gpu_seconds_total",
                                   "GPU time charged as lost (work since the last checkpoint when a run was "
                                   "reclaimed); / 3600 for GPU-hours", labels=["pool", "group"])
        for part, account, gpu_s in s.execute(
            select(Charge.partition, Charge.account, func.sum(Charge.seconds * Charge.gpus))
            .where(Charge.tag == "lost").group_by(Charge.partition, Charge.account)
        ):
            lost.add_metric([pool(part), self._group(s, account)], int(gpu_s or 0))
        yield lost

        idle = CounterMetricFamily("gbroker_node_idle_seconds_total", "Seconds powered-up nodes sat idle",
                                   labels=["pool"])
        busy = CounterMetricFamily("gbroker_node_busy_seconds_total", "Seconds powered-up nodes ran jobs",
                                   labels=["pool"])
        for part, idle_s, busy_s in s.execute(
            select(NodeSession.partition, func.sum(NodeSession.idle_s), func.sum(NodeSession.busy_s))
            .group_by(NodeSession.partition)
        ):
            idle.add_metric([pool(part)], int(idle_s or 0))
            busy.add_metric([pool(part)], int(busy_s or 0))
        yield idle
        yield busy

        yield from self._money(s)

        out = GaugeMetricFamily("gbroker_outbox_messages", "Notifications in the outbox by state", labels=["state"])
        for ostate, n in s.execute(select(OutboxMessage.status, func.count()).group_by(OutboxMessage.status)):
            out.add_metric([ostate], n)
        yield out

        info = GaugeMetricFamily("gbroker_lease_holder_info", "The daemon holding the lease now (from the database)",
                                 labels=["holder"])
        now = self.svc.clock.now()
        for lease in s.execute(select(Lease)).scalars():
            if lease.expires_at > now:
                info.add_metric([lease.holder], 1)
        yield info

    def _group(self, s: Session, account: str) -> str:
        g = budgets.group_of_account(s, account)
        return g.name if g is not None else account

    def _event_counter(self, s: Session, name: str, doc: str, kinds: tuple[str, ...]) -> Metric:
        fam = CounterMetricFamily(name, doc, labels=["group"])
        for group, n in s.execute(
            select(Job.group_name, func.count()).select_from(Event).join(Job, Job.id == Event.job_id)
            .where(Event.kind.in_(kinds)).group_by(Job.group_name)
        ):
            fam.add_metric([group], n)
        return fam

    def _money(self, s: Session) -> Iterator[Metric]:
        settings = self.svc.settings
        cur = settings.currency
        labels = ["group", "semester", "currency"]
        spent = GaugeMetricFamily("gbroker_spend_micros", "Money charged per group and semester, in micro-units",
                                  labels=labels)
        amount = GaugeMetricFamily("gbroker_budget_micros", "The group's budget for the semester, in micro-units",
                                   labels=labels)
        left = GaugeMetricFamily("gbroker_budget_left_micros",
                                 "Budget minus spend minus what running and queued jobs hold, in micro-units",
                                 labels=labels)
        now = self.svc.clock.now()
        book: Any = None
        groups = list(s.execute(select(LabGroup).order_by(LabGroup.name)).scalars())
        for sem in s.execute(select(Semester).order_by(Semester.starts_at)).scalars():
            for g in groups:
                budget = s.execute(select(Budget).where(Budget.group_id == g.id, Budget.semester_id == sem.id)
                                   ).scalar_one_or_none()
                if budget is None:
                    spent.add_metric([g.name, sem.name, cur], budgets.spent_micros(s, g.slurm_account, sem))
                    continue
                if book is None:
                    book = pricebook.load(s, settings)
                st = budgets.budget_status(s, g, sem, budget, book, settings, now)
                spent.add_metric([g.name, sem.name, cur], st.spent_micros)
                amount.add_metric([g.name, sem.name, cur], st.amount_micros)
                left.add_metric([g.name, sem.name, cur], st.left_micros)
        yield from (spent, amount, left)


def registry(svc: Services, stats: DaemonStats) -> CollectorRegistry:
    """A registry of its own (no process-wide default), holding the broker's collector."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(BrokerCollector(svc, stats))
    return reg
