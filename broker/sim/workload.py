"""Workload mode: many jobs sharing a cluster whose spot capacity follows a trace.

The trace's count is the number of spot nodes the cluster can have in each
step. Jobs on spot hold their nodes; when the count drops below what is held,
spot gangs drawn at random (seeded: the same seed, the same run) are
reclaimed, whole, until the rest fits. Spot is handed out in order of arrival; on-demand is always there.
Each job then follows the single-job model of ``broker.sim.engine``
(changeover on every new start, progress lost without checkpoints). As in
the daemon, policies see the reclaim rate observed on the cluster so far
(reclaims per hour held on spot, over all jobs) once there is enough of it,
or the trace's own rate if that is higher.

Job file: JSON (a list, or {"jobs": [...]}) or CSV with a header. Fields:
kind, nodes, gpus_per_node (1), arrival_hours, work_hours, deadline_hours
(from arrival; empty or absent = none), interruptible (true),
checkpointable (true), changeover_hours (the command's --changeover-hours).
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from broker.errors import SpecError
from broker.amount import MICROS_PER_UNIT
from broker.sim.feed import SpotFeed
from broker.sim.trace import Trace
from policies import from_name
from policies.base import Action, AttemptView, Capacity, JobView, Policy

OBSERVED_MIN_S = 6 * 3600
"""Spot hours held before the observed reclaim rate is trusted over the trace's."""

TRUE = {"1", "true", "yes", "y", "t"}
FALSE = {"0", "false", "no", "n", "f"}


@dataclass(frozen=True)
class WorkloadJob:
    name: str
    kind: str
    nodes: int
    gpus_per_node: int
    arrival_s: int
    work_s: int
    deadline_s: int | None
    interruptible: bool = True
    checkpointable: bool = True
    changeover_s: int | None = None


def _hours(v: Any, what: str, where: str, optional: bool = False) -> int | None:
    if v is None or (isinstance(v, str) and not v.strip()):
        if optional:
            return None
        raise SpecError(f"{where}: {what} is missing")
    try:
        d = Decimal(str(v).strip())
    except InvalidOperation:
        raise SpecError(f"{where}: {what} must be a number of hours, got {v!r}") from None
    if not d.is_finite() or d < 0:
        raise SpecError(f"{where}: {what} must be a number of hours >= 0, got {v!r}")
    return int(round(d * 3600))


def _bool(v: Any, default: bool, what: str, where: str) -> bool:
    if v is None or (isinstance(v, str) and not v.strip()):
        return default
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in TRUE:
        return True
    if s in FALSE:
        return False
    raise SpecError(f"{where}: {what} must be true or false, got {v!r}")


def _int(v: Any, default: int, what: str, where: str) -> int:
    if v is None or (isinstance(v, str) and not v.strip()):
        return default
    try:
        n = int(str(v).strip())
    except ValueError:
        raise SpecError(f"{where}: {what} must be a whole number, got {v!r}") from None
    if n < 1:
        raise SpecError(f"{where}: {what} must be at least 1, got {n}")
    return n


def parse_jobs(rows: Sequence[dict[str, Any]], source: str) -> list[WorkloadJob]:
    jobs = []
    for i, row in enumerate(rows, 1):
        where = f"{source}: job {i}"
        if not isinstance(row, dict):
            raise SpecError(f"{where}: each job is an object with fields like work_hours")
        work = _hours(row.get("work_hours"), "work_hours", where)
        assert work is not None
        if work <= 0:
            raise SpecError(f"{where}: work_hours must be > 0")
        jobs.append(
            WorkloadJob(
                name=str(row.get("name") or f"job{i}"),
                kind=str(row.get("kind") or "other"),
                nodes=_int(row.get("nodes"), 1, "nodes", where),
                gpus_per_node=_int(row.get("gpus_per_node"), 1, "gpus_per_node", where),
                arrival_s=_hours(row.get("arrival_hours", 0), "arrival_hours", where) or 0,
                work_s=work,
                deadline_s=_hours(row.get("deadline_hours"), "deadline_hours", where, optional=True),
                interruptible=_bool(row.get("interruptible"), True, "interruptible", where),
                checkpointable=_bool(row.get("checkpointable"), True, "checkpointable", where),
                changeover_s=_hours(row.get("changeover_hours"), "changeover_hours", where, optional=True),
            )
        )
    if not jobs:
        raise SpecError(f"{source}: no jobs")
    return jobs


def load_workload(path: str | Path) -> list[WorkloadJob]:
    p = Path(path)
    text = p.read_text()
    if p.suffix.lower() == ".csv":
        return parse_jobs(list(csv.DictReader(text.splitlines())), p.name)
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{p.name}: not JSON ({exc.msg} at line {exc.lineno}); use .csv for CSV") from exc
    if isinstance(raw, dict):
        raw = raw.get("jobs")
    if not isinstance(raw, list):
        raise SpecError(f'{p.name}: expected a list of jobs or {{"jobs": [...]}}')
    return parse_jobs(raw, p.name)


@dataclass
class _Run:
    job: WorkloadJob
    d: int
    done: int = 0
    safe: int = 0
    cur: Capacity = Capacity.NONE
    overhead: int = 0
    after_reclaim: bool = False
    started_step: int = -1
    reclaims: int = 0
    history: list[AttemptView] = field(default_factory=list)
    finished_s: int | None = None
    cost_us: int = 0
    spot_s: int = 0
    od_s: int = 0
    lost_s: int = 0
    gave_up: bool = False
    owned: bool = False
    """Runs on one of the cluster's own nodes (never reclaimed, no marginal cost)."""
    owned_s: int = 0


def run_workload(
    trace: Trace,
    jobs: Sequence[WorkloadJob],
    names: Sequence[str],
    spot_micros: int,
    ondemand_micros: int,
    changeover_s: int,
    seed: int = 0,
    owned_nodes: int = 0,
    owned_micros: int = 0,
    owned_hours: float | None = None,
) -> dict[str, Any]:
    """Run the workload under each policy (the optimum is single-job only and is skipped).

    ``owned_nodes``: the cluster's own nodes. A job that is not running takes
    free owned nodes first (in order of arrival) and keeps them to the end;
    only the others are placed by the policy (spot, on-demand or wait). Owned
    nodes cost ``owned_micros`` per node-hour whether busy or not, over
    ``owned_hours`` (default: until the last job ends); the summary's
    ``cost_usd`` includes that fixed cost."""
    g = trace.gap_s
    last = max(j.arrival_s + (j.deadline_s or 0) + 3 * j.work_s for j in jobs)
    steps = -(-last // g) + 1
    feeds = {n: SpotFeed(trace, n, steps + 1) for n in sorted({j.nodes for j in jobs})}
    summary = []
    for name in names:
        if name == "omniscient":
            continue
        summary.append(
            _one_policy(from_name(name), trace, jobs, feeds, steps, spot_micros, ondemand_micros, changeover_s, seed,
                        owned_nodes, owned_micros, owned_hours)
        )
    return {"trace": trace.name, "jobs": len(jobs), "summary": summary}


def _one_policy(
    policy: Policy,
    trace: Trace,
    jobs: Sequence[WorkloadJob],
    feeds: dict[int, SpotFeed],
    steps: int,
    sp: int,
    od: int,
    changeover_s: int,
    seed: int,
    owned_nodes: int = 0,
    owned_micros: int = 0,
    owned_hours: float | None = None,
) -> dict[str, Any]:
    g = trace.gap_s
    last_end = 0
    rng = random.Random(seed)
    runs = [_Run(j, j.changeover_s if j.changeover_s is not None else changeover_s) for j in jobs]
    order = sorted(range(len(runs)), key=lambda k: (runs[k].job.arrival_s, k))
    # What the daemon observes: reclaims per hour held on spot, over every job so far.
    held_s = 0
    seen_reclaims = 0
    # A trace shorter than the workload is replayed: history never reaches
    # back to a step that comes back later (see SpotFeed).
    floor = max(0, steps - trace.steps)
    for i in range(steps):
        t = i * g
        capacity = feeds[1].counts[i] if 1 in feeds else next(iter(feeds.values())).counts[i]
        active = [runs[k] for k in order if runs[k].job.arrival_s <= t and runs[k].finished_s is None and not runs[k].gave_up]
        if not active and all(r.finished_s is not None or r.gave_up for r in runs):
            break
        # Owned nodes first: an idle job takes free owned nodes and keeps them.
        owned_free = owned_nodes - sum(r.job.nodes for r in active if r.owned)
        for r in active:
            if not r.owned and r.cur is Capacity.NONE and r.job.nodes <= owned_free:
                r.owned, r.cur, r.overhead, r.started_step = True, Capacity.ONDEMAND, r.d, i
                owned_free -= r.job.nodes
        owned_runs = [r for r in active if r.owned]
        for r in owned_runs:
            _advance(r, t - r.job.arrival_s, g, 0, 0)
            if r.finished_s is not None:
                last_end = max(last_end, r.job.arrival_s + r.finished_s)
        active = [r for r in active if not r.owned]
        # Reclaim gangs, in a seeded random order, until the rest fits.
        on_spot = [r for r in active if r.cur is Capacity.SPOT]
        rng.shuffle(on_spot)
        used = sum(r.job.nodes for r in on_spot)
        reclaimed = set()
        for r in on_spot:
            if used <= capacity:
                break
            used -= r.job.nodes
            reclaimed.add(id(r))
        seen_reclaims += len(reclaimed)
        observed = seen_reclaims / (held_s / 3600) if held_s >= OBSERVED_MIN_S else None
        for r in active:
            rel = t - r.job.arrival_s
            feed = feeds[r.job.nodes]
            others = used - (r.job.nodes if r.cur is Capacity.SPOT and id(r) not in reclaimed else 0)
            free = max(0, capacity - others)
            market = feed.market(i, sp, od, floor)
            rate = market.spot_reclaim_rate_per_hour if observed is None else max(observed, market.spot_reclaim_rate_per_hour)
            market = replace(market, spot_available=free, spot_reclaim_rate_per_hour=rate)
            if id(r) in reclaimed:
                r.history.append(AttemptView(Capacity.SPOT, t - r.started_step * g, "reclaimed"))
                if not r.job.checkpointable:
                    r.lost_s += r.done - r.safe
                    r.done = r.safe
                r.cur = Capacity.NONE
                r.reclaims += 1
                r.after_reclaim = True
                dec = policy.on_preempt(_view(r, rel), tuple(r.history), market)
                if dec.action is Action.GIVE_UP:
                    r.gave_up = True
                    continue
                want = {Action.MOVE_ONDEMAND: Capacity.ONDEMAND, Action.RESUME_SPOT: Capacity.SPOT}.get(
                    dec.action, Capacity.NONE
                )
            else:
                want = policy.place(_view(r, rel), market).capacity
            if want is Capacity.SPOT and (not r.job.interruptible):
                raise RuntimeError(f"{policy.name} placed non-interruptible {r.job.name} on spot")
            if want is Capacity.SPOT and r.cur is not Capacity.SPOT and free < r.job.nodes:
                want = Capacity.NONE
            if want is not r.cur:
                if r.cur is not Capacity.NONE:
                    if r.cur is Capacity.SPOT:
                        used -= r.job.nodes
                    if not r.job.checkpointable:
                        r.lost_s += r.done - r.safe
                        r.done = r.safe
                    r.after_reclaim = False
                if want is not Capacity.NONE:
                    r.overhead = r.d
                    r.started_step = i
                    if want is Capacity.SPOT:
                        used += r.job.nodes
                r.cur = want
            if r.cur is Capacity.SPOT:
                held_s += g
            _advance(r, rel, g, sp, od)
            if r.finished_s is not None:
                last_end = max(last_end, r.job.arrival_s + r.finished_s)
    total = sum(r.cost_us for r in runs)
    baseline = 0
    for r in runs:
        if r.finished_s is None:
            extra = r.job.work_s - r.done + r.d
            r.cost_us += od * r.job.nodes * r.job.gpus_per_node * extra
            r.od_s += extra
        baseline += od * r.job.nodes * r.job.gpus_per_node * (r.job.work_s + r.d)
    hours = owned_hours if owned_hours is not None else last_end / 3600
    owned_fixed = int(owned_nodes * owned_micros * hours * 3600)
    total = sum(r.cost_us for r in runs) + owned_fixed
    with_deadline = [r for r in runs if r.job.deadline_s is not None]
    met = [r for r in with_deadline if r.finished_s is not None and r.finished_s <= r.job.deadline_s]  # type: ignore[operator]
    gpus = lambda r: r.job.nodes * r.job.gpus_per_node  # noqa: E731
    return {
        "policy": policy.name,
        "cost_usd": total / 3600 / MICROS_PER_UNIT,
        "cost_ratio": total / baseline if baseline else 0.0,
        "deadlines": len(with_deadline),
        "deadlines_met": len(met),
        "unfinished": sum(r.finished_s is None for r in runs),
        "gpu_hours_lost_to_reclaims": sum(r.lost_s * gpus(r) for r in runs) / 3600,
        "spot_gpu_hours": sum(r.spot_s * gpus(r) for r in runs) / 3600,
        "ondemand_gpu_hours": sum(r.od_s * gpus(r) for r in runs if not r.owned) / 3600,
        "owned_gpu_hours": sum(r.od_s * gpus(r) for r in runs if r.owned) / 3600,
        "owned_fixed_usd": owned_fixed / 3600 / MICROS_PER_UNIT,
        "reclaims": sum(r.reclaims for r in runs),
    }


def _view(r: _Run, rel: int) -> JobView:
    j = r.job
    return JobView(
        kind=j.kind,
        nodes=j.nodes,
        gpus_per_node=j.gpus_per_node,
        interruptible=j.interruptible,
        checkpointable=j.checkpointable,
        work_s=j.work_s,
        done_s=r.done,
        elapsed_s=rel,
        deadline_s=j.deadline_s,
        changeover_s=r.d,
        current=r.cur,
        reclaims=r.reclaims,
        safe_done_s=None if j.checkpointable else r.safe,
    )


def _advance(r: _Run, rel: int, g: int, sp: int, od: int) -> None:
    if r.cur is Capacity.NONE:
        return
    rate = (sp if r.cur is Capacity.SPOT else od) * r.job.nodes * r.job.gpus_per_node
    need = r.job.work_s - r.done
    productive = g - r.overhead
    if productive >= need:
        used = r.overhead + need
        if r.after_reclaim:
            r.lost_s += r.overhead
        r.cost_us += rate * used
        if r.cur is Capacity.SPOT:
            r.spot_s += used
        else:
            r.od_s += used
        r.done = r.job.work_s
        r.finished_s = rel + used
        r.cur = Capacity.NONE
        return
    consumed = min(g, r.overhead)
    if r.after_reclaim:
        r.lost_s += consumed
        if consumed == r.overhead:
            r.after_reclaim = False
    r.done += max(0, productive)
    r.overhead -= consumed
    r.cost_us += rate * g
    if r.cur is Capacity.SPOT:
        r.spot_s += g
    else:
        r.od_s += g
