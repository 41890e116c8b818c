"""Several spot pools: the exact optimum, the engine, the policies' pool choice, the command."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.cli.simulate import simulate as simulate_cmd
from broker.sim.optimum import solve
from broker.sim.pools import BEST_POOL_UP, PoolSetting, optimum_beaten, simulate_pools, summarize_pools
from broker.sim.pools_optimum import solve_pools
from broker.sim.trace import Trace
from policies import Capacity, JobView, MarketView, from_name

from tests.sim.brute import brute_pools


def random_pools(seed: int):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    P = rng.choice([1, 2, 3])
    g = rng.choice([10, 20, 30])
    avails = []
    for _ in range(P):
        v, a = rng.randint(0, 1), []
        flip = rng.choice([0.2, 0.5])
        for _ in range(16):
            if rng.random() < flip:
                v = 1 - v
            a.append(bool(v))
        avails.append(a)
    W = rng.randint(2, 8) * 10 + rng.randint(0, 9)
    D = min(16 * g, W + rng.randint(0, 12) * 10 + rng.randint(0, 9))
    d = rng.choice([0, 5, 10, 15, 25])
    sps = [rng.choice([1, 3, 5, 9, 10]) for _ in range(P)]
    return avails, g, W, D, d, sps, 10


@pytest.mark.parametrize("seed", range(150))
def test_pools_optimum_equals_exhaustive_search(seed: int) -> None:
    avails, g, W, D, d, sps, od = random_pools(seed)
    best = brute_pools(avails, g, W, D, d, sps, od)
    feasible, cost = solve_pools(avails, g, W, D, d, sps, od)
    if best is None:
        assert not feasible
    else:
        assert feasible and cost == best
    if len(avails) == 1:
        one = solve(avails[0], g, W, D, d, sps[0], od)
        assert one.feasible == feasible and (not feasible or one.cost_us == cost)


def pool_trace(seed: int, name: str, steps: int = 500, gap: int = 60) -> Trace:
    rng = random.Random(seed)
    v, counts = 1, []
    for _ in range(steps):
        if rng.random() < 0.06:
            v = 1 - v
        counts.append(v)
    return Trace(name, gap, tuple(counts))


def test_pool_policies_meet_deadlines_and_never_beat_the_optimum() -> None:
    traces = [pool_trace(k, f"p{k}.json") for k in range(3)]
    names = ["ondemand", BEST_POOL_UP, "uniform-progress-rr", "gepa", "gbroker", "omniscient"]
    for ratio, d in ((0.6, 0), (0.8, 180), (0.9, 300)):
        W = 3 * 3600
        s = PoolSetting(W, int(W / ratio), d, (918_000, 700_000, 918_000), 3_060_000)
        samples = simulate_pools(traces, names, s, starts=6, seed=1)
        assert optimum_beaten(samples) == []
        rows = {r["policy"]: r for r in summarize_pools(samples, names, ["p0", "p1", "p2"])}
        for n in names:
            assert rows[n]["deadline_met"] == 1.0, n
            assert rows[n]["gap_to_optimal_mean"] >= 0, n
        assert rows["ondemand"]["cost_ratio_mean"] == pytest.approx(1.0)
        # several pools are worth something: the optimum over all pools beats the best single pool's
        assert rows["omniscient"]["saving_vs_best_pool_up_mean"] > 0


def market(up: bool, rate: float = 0.5, up_s: int = 3600) -> MarketView:
    return MarketView(spot_available=int(up), step_s=60, spot_reclaim_rate_per_hour=rate, spot_uptime_fraction=0.7,
                      lookback_s=7 * 24 * 3600, spot_up_s=up_s if up else 0, spot_down_s=0 if up else 600)


def test_default_pool_choice_keeps_the_pool_and_resumes_elsewhere_after_a_reclaim() -> None:
    job = JobView(work_s=10 * 3600, deadline_s=14 * 3600, changeover_s=360, current=Capacity.SPOT, pool=1)
    for name in ("gepa", "gbroker"):
        p = from_name(name)
        # on spot in pool 1, which is still up: stay there even if another pool looks better
        pl = p.place_pools(job, [market(True, rate=0.1), market(True, rate=2.0)])
        assert (pl.capacity, pl.pool) == (Capacity.SPOT, 1), name
        # pool 1 reclaimed: resume at once in a pool that has spot, not on on-demand
        idle = JobView(work_s=10 * 3600, deadline_s=14 * 3600, changeover_s=360, current=Capacity.NONE, pool=1)
        pl = p.place_pools(idle, [market(False), market(False), market(True, rate=0.3)])
        assert (pl.capacity, pl.pool) == (Capacity.SPOT, 2), name
        # no pool has spot: no pool is named
        pl = p.place_pools(idle, [market(False), market(False)])
        assert pl.pool is None and pl.capacity is not Capacity.SPOT, name


def test_uniform_progress_round_robin_moves_to_the_next_pool_with_spot() -> None:
    p = from_name("uniform-progress-rr")
    idle = JobView(work_s=10 * 3600, deadline_s=20 * 3600, changeover_s=360, pool=1)
    pl = p.place_pools(idle, [market(True), market(False), market(False), market(True)])
    assert (pl.capacity, pl.pool) == (Capacity.SPOT, 3)
    pl = p.place_pools(idle, [market(True), market(False), market(False), market(False)])
    assert (pl.capacity, pl.pool) == (Capacity.SPOT, 0)


def write(path: Path, counts: list[int], gap: int = 300) -> None:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": counts}))


def test_command_pools_json(tmp_path: Path) -> None:
    rng = random.Random(3)
    for k in range(2):
        write(tmp_path / f"z{k}.json", [rng.choice([0, 1, 1]) for _ in range(400 + 50 * k)])
    args = ["--pools", "--trace", str(tmp_path / "z0.json"), "--trace", str(tmp_path / "z1.json"),
            "--policy", "ondemand,uniform-progress,uniform-progress-rr,gepa,gbroker",
            "--work-hours", "6", "--deadline-hours", "8", "--changeover-hours", "0.1",
            "--spot-price", "0.918,0.8", "--starts", "5", "--json"]
    res = CliRunner().invoke(simulate_cmd, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    rows = {r["policy"]: r for r in out["summary"]}
    assert set(rows) == {"ondemand", BEST_POOL_UP, "uniform-progress-rr", "gepa", "gbroker", "omniscient"}
    for r in rows.values():
        for key in ("cost_ratio_mean", "gap_to_optimal_mean", "deadline_met", "spot_hours_by_pool",
                    "ondemand_hours_mean", "saving_vs_best_pool_up_mean"):
            assert key in r
        assert set(r["spot_hours_by_pool"]) == {"z0", "z1"}
    assert out["samples"] == 5 and out["optimum_beaten"] == []
    bad = CliRunner().invoke(simulate_cmd, [a if a != "0.918,0.8" else "1,2,3" for a in args])
    assert bad.exit_code != 0 and "pools" in bad.output


def test_owned_nodes_take_jobs_first_and_cost_a_fixed_price() -> None:
    from broker.sim.trace import Trace
    from broker.sim.workload import WorkloadJob, run_workload

    trace = Trace("t", 300, [0] * 200, None)  # no spot at all
    jobs = [WorkloadJob(f"j{k}", "render", 1, 1, 0, 3600, 4 * 3600) for k in range(3)]
    out = run_workload(trace, jobs, ["ondemand", "gbroker"], 918_000, 3_060_000, 0, owned_nodes=2,
                       owned_micros=1_000_000, owned_hours=10)
    od, gb = out["summary"]
    for row in (od, gb):
        assert row["deadlines_met"] == 3 and row["owned_fixed_usd"] == 20
    # on-demand: two jobs on the owned nodes, the third on on-demand at once
    assert od["owned_gpu_hours"] == 2 and od["ondemand_gpu_hours"] == 1
    assert abs(od["cost_usd"] - (20 + 3.06)) < 1e-6
    # gbroker waits (no spot, slack to spare) and gets an owned node when one frees
    assert gb["owned_gpu_hours"] == 3 and gb["ondemand_gpu_hours"] == 0 and gb["cost_usd"] == 20
