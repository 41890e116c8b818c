"""Several spot pools: one job, time-aligned traces (one per pool), on-demand.

The model of ``broker.sim.engine`` with a choice of pool: at every step the
job is on spot in one pool (if that pool offers the whole gang), on
on-demand, or waiting; every start on a new instance pays the changeover d,
a move between pools included; a job on spot in a pool whose gang is gone
was reclaimed. Each pool has its own spot price.

Policies are asked through ``Policy.place_pools(job, markets)``, one market
view per pool, the way the daemon will ask them with one view per capacity
pool. Compared per sample (trace offset):

- ``ondemand``, ``gepa``, ``gbroker`` and any registered policy, through
  ``place_pools``;
- ``uniform-progress-rr``: Uniform Progress moving round-robin to the next
  pool with spot when its own has none (the ADRS multi-region baseline);
- ``uniform-progress-best-pool``: Uniform Progress on a single pool, the one
  that was cheapest for that very sample (chosen in hindsight: generous);
- ``omniscient``: the exact multi-pool optimum (``pools_optimum``).

Traces of one pool set must share their step; they are cut to the shortest.
"""

from __future__ import annotations

import multiprocessing as mp
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from broker.amount import MICROS_PER_UNIT
from broker.sim.engine import ContractViolation, Prices, SimJob, run_job
from broker.sim.feed import SpotFeed
from broker.sim.pools_optimum import solve_pools
from broker.sim.single import policy_of
from broker.sim.trace import Trace, offsets
from policies.base import Capacity, JobView, Policy

OPTIMUM = "omniscient"
BEST_POOL_UP = "uniform-progress-best-pool"


@dataclass(frozen=True)
class PoolSetting:
    work_s: int
    deadline_s: int
    changeover_s: int
    spot_micros: tuple[int, ...]
    """Per instance-hour, one per pool."""
    ondemand_micros: int
    nodes: int = 1


@dataclass
class PoolOutcome:
    cost_us: int
    met: bool
    spot_s: list[int]
    ondemand_s: int
    moves: int = 0
    """Starts on a new instance (pool moves, spot <-> on-demand, after reclaims)."""
    reclaims: int = 0


@dataclass
class PoolSample:
    offset: int
    feasible: bool
    baseline_us: int
    optimum_us: int
    results: dict[str, PoolOutcome] = field(default_factory=dict)


def align(traces: Sequence[Trace]) -> list[Trace]:
    """The pools' traces cut to a common length (they must share their step)."""
    if len(traces) < 2:
        raise ValueError("several pools need at least two traces")
    gaps = {t.gap_s for t in traces}
    if len(gaps) != 1:
        raise ValueError(f"pool traces must share one step, got {sorted(gaps)} s")
    n = min(t.steps for t in traces)
    return [Trace(t.name, t.gap_s, t.counts[:n], None if t.prices_usd is None else t.prices_usd[:n]) for t in traces]


def run_pools(
    policy: Policy,
    job: SimJob,
    feeds: Sequence[SpotFeed],
    offset: int,
    spot_micros: Sequence[int],
    ondemand_micros: int,
    horizon_steps: int,
    *,
    use_hints: bool = True,
) -> PoolOutcome:
    """One job under one policy over several pools (see the module docstring)."""
    g = feeds[0].gap_s
    d = job.changeover_s
    W = job.work_s
    P = len(feeds)
    gpus = job.gpus
    sp_rates = [s * gpus for s in spot_micros]
    od_rate = ondemand_micros * gpus
    end_step = offset + horizon_steps
    window = -(-(job.deadline_s or horizon_steps * g) // g)
    floor = feeds[0].history_floor(offset, window)
    counts = [f.counts for f in feeds]
    nxts = [f.next_change for f in feeds]

    done = 0
    cur = Capacity.NONE
    pool: int | None = None
    last_pool: int | None = None
    overhead = 0
    cost = od_s = moves = reclaims = 0
    spot_s = [0] * P
    want_cap, want_pool = Capacity.NONE, None
    next_call = offset
    last = None
    finished: int | None = None

    def view(t: int) -> JobView:
        return JobView(kind=job.kind, nodes=job.nodes, gpus_per_node=job.gpus_per_node,
                       interruptible=job.interruptible, checkpointable=True, work_s=W, done_s=done,
                       elapsed_s=t, deadline_s=job.deadline_s, changeover_s=d, current=cur,
                       reclaims=reclaims, pool=last_pool)

    i = offset
    while i < end_step:
        t = (i - offset) * g
        now = tuple(c[i] for c in counts)
        up = [c >= job.nodes for c in now]
        ask = i >= next_call or now != last
        if cur is Capacity.SPOT and pool is not None and not up[pool]:
            cur, pool = Capacity.NONE, None
            reclaims += 1
            ask = True
        if ask:
            markets = [f.market(i, spot_micros[k], ondemand_micros, floor) for k, f in enumerate(feeds)]
            pl = policy.place_pools(view(t), markets)
            want_cap, want_pool = pl.capacity, pl.pool
            hint = pl.recheck_s
            next_call = i + 1 if not use_hints or hint is None else i + max(1, hint // g)
        last = now
        cap, k = want_cap, want_pool
        if cap is Capacity.SPOT:
            if not job.interruptible:
                raise ContractViolation(f"{policy.name} placed a non-interruptible job on spot")
            if k is None or not 0 <= k < P:
                raise ContractViolation(f"{policy.name} placed a job on spot without a valid pool")
            if not up[k]:
                cap, k = Capacity.NONE, None
        else:
            k = None
        if (cap, k) != (cur, pool):
            if cap is not Capacity.NONE:
                overhead = d
                moves += 1
            cur, pool = cap, k
            if k is not None:
                last_pool = k
            next_call = i + 1
        stop = min(next_call, *(nx[i] for nx in nxts), end_step)
        span = (stop - i) * g
        if cur is not Capacity.NONE:
            need = W - done
            productive = span - overhead
            rate = od_rate if cur is Capacity.ONDEMAND else sp_rates[pool]  # type: ignore[index]
            used = overhead + need if productive >= need else span
            cost += rate * used
            if cur is Capacity.ONDEMAND:
                od_s += used
            else:
                spot_s[pool] += used  # type: ignore[index]
            if productive >= need:
                finished = t + used
                break
            done += max(0, productive)
            overhead -= min(span, overhead)
        i = stop
    if finished is None:
        extra = (W - done) + (overhead if cur is Capacity.ONDEMAND else d)
        cost += od_rate * extra
        od_s += extra
        met = False
    else:
        met = job.deadline_s is None or finished <= job.deadline_s
    return PoolOutcome(cost, met, spot_s, od_s, moves, reclaims)


class PoolWorker:
    """What one process needs for one pool set and setting."""

    def __init__(self, traces: Sequence[Trace], names: Sequence[str], setting: PoolSetting, starts: int, seed: int):
        self.traces = align(traces)
        self.names = list(names)
        self.s = setting
        if len(setting.spot_micros) != len(self.traces):
            raise ValueError("one spot price per pool")
        tr = self.traces[0]
        self.need = -(-setting.deadline_s // tr.gap_s)
        self.horizon = -(-(setting.deadline_s + setting.work_s + 2 * setting.changeover_s) // tr.gap_s)
        self.offsets = offsets(tr.steps, self.need, starts,
                               random.Random(f"{seed}:pools:{'|'.join(t.name for t in self.traces)}").randrange(1 << 30))
        length = max(self.offsets) + self.horizon + 1
        self.feeds = [SpotFeed(t, setting.nodes, length) for t in self.traces]
        self.policies = {n: policy_of(n) for n in names if n not in (OPTIMUM, BEST_POOL_UP)}
        self.up = policy_of("uniform-progress")

    def run(self, offset: int) -> PoolSample:
        s = self.s
        job = SimJob(s.work_s, s.deadline_s, s.changeover_s, nodes=s.nodes)
        n = s.nodes
        feasible, opt = solve_pools([f.avail[offset: offset + self.need] for f in self.feeds], self.traces[0].gap_s,
                                    s.work_s, s.deadline_s, s.changeover_s,
                                    [min(x, s.ondemand_micros) * n for x in s.spot_micros], s.ondemand_micros * n)
        smp = PoolSample(offset, feasible, s.ondemand_micros * n * (s.work_s + s.changeover_s), opt)
        for name in self.names:
            if name == OPTIMUM:
                smp.results[name] = PoolOutcome(opt, feasible, [0] * len(self.feeds), 0)
            elif name == BEST_POOL_UP:
                best: PoolOutcome | None = None
                for k, f in enumerate(self.feeds):
                    o = run_job(self.up, job, f, offset, Prices(s.spot_micros[k], s.ondemand_micros), self.horizon)
                    spot = [0] * len(self.feeds)
                    spot[k] = o.spot_s
                    cand = PoolOutcome(o.cost_us, o.deadline_met, spot, o.ondemand_s, 0, o.reclaims)
                    if best is None or (cand.met, -cand.cost_us) > (best.met, -best.cost_us):
                        best = cand
                assert best is not None
                smp.results[name] = best
            else:
                smp.results[name] = run_pools(self.policies[name], job, self.feeds, offset, s.spot_micros,
                                              s.ondemand_micros, self.horizon)
        return smp


_W: PoolWorker | None = None


def _init(traces: Sequence[Trace], names: Sequence[str], setting: PoolSetting, starts: int, seed: int) -> None:
    global _W
    _W = PoolWorker(traces, names, setting, starts, seed)


def _run(offset: int) -> PoolSample:
    assert _W is not None
    return _W.run(offset)


def simulate_pools(
    traces: Sequence[Trace], names: Sequence[str], setting: PoolSetting,
    starts: int = 100, seed: int = 0, workers: int = 1,
) -> list[PoolSample]:
    names = list(dict.fromkeys([*names, OPTIMUM]))
    w = PoolWorker(traces, names, setting, starts, seed)
    if workers <= 1 or len(w.offsets) < 4:
        return [w.run(o) for o in w.offsets]
    ctx = mp.get_context("fork")
    with ctx.Pool(workers, initializer=_init, initargs=(traces, names, setting, starts, seed)) as pool:
        return list(pool.imap(_run, w.offsets, chunksize=max(1, len(w.offsets) // (workers * 4))))


def summarize_pools(samples: Sequence[PoolSample], names: Sequence[str], pool_names: Sequence[str]) -> list[dict[str, object]]:
    """One row per policy, the single-pool summary's keys plus hours per pool
    and the saving against Uniform Progress on the best pool."""
    rows = []
    n = len(samples)
    if not n:
        return rows
    for name in names:
        rs = [s.results[name] for s in samples]
        ref = [s.results.get(BEST_POOL_UP) for s in samples]
        row: dict[str, object] = {
            "policy": name,
            "cost_ratio_mean": sum(r.cost_us / s.baseline_us for r, s in zip(rs, samples, strict=True)) / n,
            "gap_to_optimal_mean": sum(r.cost_us / s.optimum_us - 1 for r, s in zip(rs, samples, strict=True)
                                       if s.optimum_us) / n,
            "deadline_met": sum(r.met for r in rs) / n,
            "spot_hours_mean": sum(sum(r.spot_s) for r in rs) / n / 3600,
            "ondemand_hours_mean": sum(r.ondemand_s for r in rs) / n / 3600,
            "spot_hours_by_pool": {p: sum(r.spot_s[k] for r in rs) / n / 3600 for k, p in enumerate(pool_names)},
            "cost_usd_mean": sum(r.cost_us for r in rs) / n / 3600 / MICROS_PER_UNIT,
            "changeovers_mean": sum(r.moves for r in rs) / n,
        }
        if all(x is not None for x in ref):
            row["saving_vs_best_pool_up_mean"] = sum(
                1 - r.cost_us / x.cost_us for r, x in zip(rs, ref, strict=True) if x is not None and x.cost_us) / n
        rows.append(row)
    return rows


def optimum_beaten(samples: Sequence[PoolSample]) -> list[str]:
    return [f"@{s.offset}: {name} {r.cost_us} < optimum {s.optimum_us}"
            for s in samples if s.feasible for name, r in s.results.items() if r.met and r.cost_us < s.optimum_us]


def pool_market_names(traces: Sequence[Trace]) -> list[str]:
    return [t.name.rsplit("/", 1)[-1].removesuffix(".json") for t in traces]

