"""Single-job mode: one job (W hours of work, deadline D) replayed from many start offsets.

For every trace and start offset the same job is run under each policy and
under the offline optimum; costs are compared with running it all on
on-demand (``cost_ratio``) and with the optimum (``gap_to_optimal``).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from collections.abc import Iterable, Sequence

from broker.amount import MICROS_PER_UNIT
from broker.sim.engine import Outcome, Prices, SimJob, run_job
from broker.sim.feed import SpotFeed
from broker.sim.optimum import solve
from broker.sim.trace import Trace, offsets
from policies import from_name
from policies.base import Policy

OPTIMUM = "omniscient"


@dataclass(frozen=True)
class Setting:
    work_s: int
    deadline_s: int
    changeover_s: int
    spot_micros: int
    """Per instance-hour."""
    ondemand_micros: int
    nodes: int = 1
    oracle_trace_prices: bool = False
    """An oracle, off in every benchmark: hand every policy the mean of the
    trace's own spot prices over the job's future window (the optimum assumes
    one spot price), where the trace has prices."""

    def describe(self) -> dict[str, object]:
        out = asdict(self)
        out["work_hours"] = self.work_s / 3600
        out["deadline_hours"] = self.deadline_s / 3600
        out["changeover_hours"] = self.changeover_s / 3600
        return out


@dataclass(frozen=True)
class PolicyResult:
    cost_us: int
    met: bool
    spot_s: int
    ondemand_s: int
    reclaims: int
    lost_s: int


@dataclass
class Sample:
    trace: str
    offset: int
    feasible: bool
    baseline_us: int
    optimum_us: int
    results: dict[str, PolicyResult] = field(default_factory=dict)


def policy_of(spec: str) -> Policy:
    """A policy by name, or by ``name@key=value;key=value`` with constructor
    arguments (values read as JSON where they parse, else as text): how the
    benchmarks try a variant without registering it."""
    name, _, args = spec.partition("@")
    kwargs: dict[str, object] = {}
    for part in filter(None, args.split(";")):
        key, _, text = part.partition("=")
        try:
            kwargs[key.strip()] = json.loads(text)
        except ValueError:
            kwargs[key.strip()] = text
    return from_name(name, **kwargs)


def _result(o: Outcome) -> PolicyResult:
    return PolicyResult(o.cost_us, o.deadline_met, o.spot_s, o.ondemand_s, o.reclaims, o.lost_s)


def _usd_to_micros(x: Decimal) -> int:
    return int((x * MICROS_PER_UNIT).to_integral_value())


class _Worker:
    """Holds what one process needs: traces, feeds, policy objects."""

    def __init__(self, traces: Sequence[Trace], names: Sequence[str], setting: Setting, starts: int, seed: int):
        self.traces = list(traces)
        self.names = list(names)
        self.s = setting
        self.starts = starts
        self.seed = seed
        self.policies: dict[str, Policy] = {n: policy_of(n) for n in names if n != OPTIMUM}
        self._feeds: dict[int, SpotFeed] = {}
        g_steps = [self.steps(t) for t in self.traces]
        self.horizons = [h for _, h in g_steps]

    def steps(self, tr: Trace) -> tuple[int, int]:
        s = self.s
        need = -(-s.deadline_s // tr.gap_s)
        horizon = -(-(s.deadline_s + s.work_s + 2 * s.changeover_s) // tr.gap_s)
        return need, horizon

    def offsets(self, k: int) -> list[int]:
        tr = self.traces[k]
        need, _ = self.steps(tr)
        return offsets(tr.steps, need, self.starts, random.Random(f"{self.seed}:{tr.name}").randrange(1 << 30))

    def feed(self, k: int) -> SpotFeed:
        f = self._feeds.get(k)
        if f is None:
            tr = self.traces[k]
            _, horizon = self.steps(tr)
            f = SpotFeed(tr, self.s.nodes, max(self.offsets(k)) + horizon + 1)
            self._feeds = {k: f}  # keep one: work arrives trace by trace
        return f

    def run(self, k: int, offset: int) -> Sample:
        s = self.s
        tr = self.traces[k]
        feed = self.feed(k)
        need, horizon = self.steps(tr)
        spot = s.spot_micros
        if s.oracle_trace_prices:
            mean = tr.mean_price_usd(offset, need)
            if mean is not None:
                spot = _usd_to_micros(mean)
        prices = Prices(spot, s.ondemand_micros)
        job = SimJob(s.work_s, s.deadline_s, s.changeover_s, nodes=s.nodes)
        sp_rate = spot * s.nodes
        od_rate = s.ondemand_micros * s.nodes
        opt = solve(feed.avail[offset : offset + need], tr.gap_s, s.work_s, s.deadline_s, s.changeover_s,
                    min(sp_rate, od_rate), od_rate)
        sample = Sample(tr.name, offset, opt.feasible, od_rate * (s.work_s + s.changeover_s), opt.cost_us)
        for name in self.names:
            if name == OPTIMUM:
                pol: Policy = from_name(OPTIMUM, plan=opt.plan)
            else:
                pol = self.policies[name]
            out = run_job(pol, job, feed, offset, prices, horizon)
            sample.results[name] = _result(out)
        replay = sample.results.get(OPTIMUM)
        if replay is not None and opt.feasible and sp_rate <= od_rate and replay.cost_us != opt.cost_us:
            raise AssertionError(
                f"optimum plan replays to a different cost on {tr.name}@{offset}: "
                f"{replay.cost_us} != {opt.cost_us}"
            )
        return sample


_W: _Worker | None = None


def _init(traces: Sequence[Trace], names: Sequence[str], setting: Setting, starts: int, seed: int) -> None:
    global _W
    _W = _Worker(traces, names, setting, starts, seed)


def _run(task: tuple[int, int]) -> Sample:
    assert _W is not None
    return _W.run(*task)


def simulate(
    traces: Sequence[Trace],
    names: Sequence[str],
    setting: Setting,
    starts: int = 100,
    seed: int = 0,
    workers: int = 1,
) -> list[Sample]:
    """Every (trace, start) sample for every policy; the optimum always runs."""
    names = list(dict.fromkeys([*names, OPTIMUM]))
    master = _Worker(traces, names, setting, starts, seed)
    tasks = [(k, off) for k in range(len(traces)) for off in master.offsets(k)]
    if workers <= 1 or len(tasks) < 4:
        return [master.run(k, off) for k, off in tasks]
    ctx = mp.get_context("fork")
    with ctx.Pool(workers, initializer=_init, initargs=(traces, names, setting, starts, seed)) as pool:
        return list(pool.imap(_run, tasks, chunksize=max(1, len(tasks) // (workers * 8))))


def summarize(samples: Iterable[Sample], names: Sequence[str]) -> list[dict[str, object]]:
    """One row per policy: means over samples (the optimum's own row included if asked for)."""
    samples = list(samples)
    rows = []
    for name in names:
        n = len(samples)
        if n == 0:
            continue
        rs = [s.results[name] for s in samples]
        ratio = sum(r.cost_us / s.baseline_us for r, s in zip(rs, samples, strict=True)) / n
        gap = sum(r.cost_us / s.optimum_us - 1 for r, s in zip(rs, samples, strict=True) if s.optimum_us) / n
        gap_max = max((r.cost_us / s.optimum_us - 1 for r, s in zip(rs, samples, strict=True) if s.optimum_us), default=0.0)
        feasible = [r for r, s in zip(rs, samples, strict=True) if s.feasible]
        rows.append(
            {
                "policy": name,
                "cost_ratio_mean": ratio,
                "gap_to_optimal_mean": gap,
                "gap_to_optimal_max": gap_max,
                "deadline_met": sum(r.met for r in rs) / n,
                "feasible_deadline_met": (sum(r.met for r in feasible) / len(feasible)) if feasible else None,
                "spot_hours_mean": sum(r.spot_s for r in rs) / n / 3600,
                "ondemand_hours_mean": sum(r.ondemand_s for r in rs) / n / 3600,
                "cost_usd_mean": sum(r.cost_us for r in rs) / n / 3600 / MICROS_PER_UNIT,
                "reclaims_mean": sum(r.reclaims for r in rs) / n,
                "lost_hours_mean": sum(r.lost_s for r in rs) / n / 3600,
            }
        )
    return rows


def never_beaten(samples: Iterable[Sample]) -> list[str]:
    """Samples where some policy was cheaper than the optimum (must be empty)."""
    bad = []
    for s in samples:
        if not s.feasible:
            continue
        for name, r in s.results.items():
            if r.met and r.cost_us < s.optimum_us:
                bad.append(f"{s.trace}@{s.offset}: {name} {r.cost_us} < optimum {s.optimum_us}")
    return bad
