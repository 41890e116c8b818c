"""The simulator: exact optimum, the engine's jumps, deadlines, the command."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.cli.simulate import simulate as simulate_cmd
from broker.errors import SpecError
from broker.sim.engine import Prices, SimJob, run_job
from broker.sim.feed import SpotFeed
from broker.sim.optimum import solve
from broker.sim.single import Setting, never_beaten, simulate, summarize
from broker.sim.trace import Trace, load_traces, parse_trace
from policies import from_name

from tests.sim.brute import brute_optimum

REAL = Path(__file__).resolve().parents[3] / "shared/traces/spot/availability/1-node/aws-10-26-2022/us-west-2a_v100_1.json"
ONLINE = ["ondemand", "greedy", "uniform-progress", "gepa", "gbroker", "simple"]


def random_case(seed: int) -> tuple[list[bool], int, int, int, int, int, int]:
    rng = random.Random(seed)
    g = rng.choice([10, 20, 30])
    p = rng.choice([0.1, 0.3, 0.5])
    v = rng.randint(0, 1)
    data = []
    for _ in range(40):
        if rng.random() < p:
            v = 1 - v
        data.append(bool(v))
    W = rng.randint(3, 20) * 10 + rng.randint(0, 9)
    D = min(40 * g, W + rng.randint(0, 25) * 10 + rng.randint(0, 9))
    d = rng.choice([0, 5, 7, 10, 15, 25, 40])
    sp, od = rng.choice([(3, 10), (1, 10), (9, 10), (10, 10)])
    return data, g, W, D, d, sp, od


@pytest.mark.parametrize("seed", range(120))
def test_optimum_equals_exhaustive_search(seed: int) -> None:
    data, g, W, D, d, sp, od = random_case(seed)
    best = brute_optimum(data, g, W, D, d, sp, od)
    got = solve(data, g, W, D, d, sp, od)
    if best is None:
        assert not got.feasible
    else:
        assert got.feasible and got.cost_us == best


def synthetic_trace(seed: int, steps: int = 400, gap: int = 60, nodes: int = 1) -> Trace:
    rng = random.Random(seed)
    counts, v = [], nodes
    for _ in range(steps):
        if rng.random() < 0.08:
            v = rng.randint(0, nodes)
        counts.append(v)
    return Trace(f"synthetic-{seed}", gap, tuple(counts))


@pytest.mark.parametrize("seed", range(12))
def test_optimum_replays_exactly_and_is_never_beaten(seed: int) -> None:
    rng = random.Random(seed)
    nodes = rng.choice([1, 1, 3])
    tr = synthetic_trace(seed, nodes=nodes)
    W = rng.randint(60, 120) * 60
    D = int(W / rng.choice([0.6, 0.8, 0.9]))
    d = rng.choice([0, 90, 180, 300])
    job = SimJob(W, D, d, nodes=nodes)
    feed = SpotFeed(tr, nodes, 800)
    prices = Prices(918_000, 3_060_000)
    horizon = -(-(D + W + 2 * d) // tr.gap_s)
    for off in (0, 37, 150):
        opt = solve(feed.avail[off:], tr.gap_s, W, D, d, 918_000 * nodes, 3_060_000 * nodes)
        replay = run_job(from_name("omniscient", plan=opt.plan), job, feed, off, prices, horizon)
        assert replay.cost_us == opt.cost_us and replay.deadline_met
        for name in ONLINE:
            out = run_job(from_name(name), job, feed, off, prices, horizon)
            if out.deadline_met:
                assert out.cost_us >= opt.cost_us, name
            assert out.deadline_met, name


@pytest.mark.parametrize("name", ["greedy", "uniform-progress", "gepa", "gbroker", "omniscient"])
def test_jumping_ahead_gives_the_same_result_as_asking_every_step(name: str) -> None:
    for seed in range(6):
        tr = synthetic_trace(100 + seed)
        W, D, d = 3 * 3600, 4 * 3600, 180 * (seed % 3)
        job = SimJob(W, D, d, checkpointable=seed != 5)
        feed = SpotFeed(tr, 1, 800)
        horizon = -(-(D + W + 2 * d) // tr.gap_s)
        prices = Prices(918_000, 3_060_000)
        pol = from_name(name) if name != "omniscient" else from_name(
            name, plan=solve(feed.avail, tr.gap_s, W, D, d, 918_000, 3_060_000).plan
        )
        a = run_job(pol, job, feed, 0, prices, horizon, use_hints=True)
        b = run_job(pol, job, feed, 0, prices, horizon, use_hints=False)
        assert (a.cost_us, a.finished_s, a.spot_s, a.ondemand_s, a.reclaims) == (
            b.cost_us, b.finished_s, b.spot_s, b.ondemand_s, b.reclaims
        )
        assert a.calls <= b.calls


def test_greedy_without_safety_net_can_miss_and_others_do_not() -> None:
    # spot for a while, then gone for good: waiting for it misses the deadline
    tr = Trace("cliff", 600, tuple([1] * 10 + [0] * 200))
    job = SimJob(10 * 3600, 12 * 3600, 720)
    feed = SpotFeed(tr, 1, 400)
    horizon = 135
    prices = Prices(918_000, 3_060_000)
    assert not run_job(from_name("greedy-no-safety-net"), job, feed, 0, prices, horizon).deadline_met
    for name in ("greedy", "uniform-progress", "gbroker", "ondemand", "simple"):
        assert run_job(from_name(name), job, feed, 0, prices, horizon).deadline_met, name


def test_non_checkpointable_loses_work_on_reclaim() -> None:
    tr = Trace("blip", 600, tuple([1] * 3 + [0] + [1] * 100))
    feed = SpotFeed(tr, 1, 200)
    job = SimJob(2 * 3600, None, 0, checkpointable=False)
    out = run_job(from_name("greedy"), job, feed, 0, Prices(1, 3), 100)
    assert out.reclaims == 1 and out.lost_s == 1800 and out.finished_s == 4 * 600 + 2 * 3600


def test_single_mode_on_a_real_trace_is_reproducible_and_ordered() -> None:
    traces = load_traces([REAL])
    W = 48 * 3600
    s = Setting(W, int(W / 0.8), 720, 918_000, 3_060_000)
    names = ["ondemand", "greedy", "uniform-progress", "gbroker", "omniscient"]
    a = simulate(traces, names, s, starts=8, seed=3)
    b = simulate(traces, names, s, starts=8, seed=3)
    assert [x.results for x in a] == [x.results for x in b]
    assert never_beaten(a) == []
    rows = {r["policy"]: r for r in summarize(a, names)}
    assert all(rows[n]["deadline_met"] == 1.0 for n in names)
    assert rows["ondemand"]["cost_ratio_mean"] == pytest.approx(1.0)
    assert rows["omniscient"]["gap_to_optimal_mean"] == 0.0
    assert rows["greedy"]["ondemand_hours_mean"] >= rows["omniscient"]["ondemand_hours_mean"]


def test_trace_validation_says_what_is_wrong() -> None:
    with pytest.raises(SpecError, match="gap_seconds"):
        parse_trace({"data": [1]}, "x.json")
    with pytest.raises(SpecError, match=r"data\[1\]"):
        parse_trace({"metadata": {"gap_seconds": 60}, "data": [1, -2]}, "x.json")
    with pytest.raises(SpecError, match="prices"):
        parse_trace({"metadata": {"gap_seconds": 60}, "data": [1, 0], "prices": [1]}, "x.json")
    t = parse_trace({"metadata": {"gap_seconds": 60.0}, "data": [0, 1, 3], "prices": [0.5, 0.6, 0.7]}, "x.json")
    assert t.gap_s == 60 and t.capacity == 3


def write_trace(path: Path, counts: list[int], gap: int = 300) -> None:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": counts}))


def test_command_json_summary(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    rng = random.Random(1)
    for k in range(2):
        write_trace(folder / f"t{k}.json", [rng.choice([0, 2, 4, 4, 4]) for _ in range(600)])
    args = ["--trace", str(folder), "--policy", "greedy,uniform-progress,gbroker,omniscient",
            "--work-hours", "6", "--deadline-hours", "8", "--changeover-hours", "0.1",
            "--spot-price", "0.918", "--ondemand-price", "3.06", "--nodes", "4", "--starts", "5",
            "--seed", "2", "--json"]
    res = CliRunner().invoke(simulate_cmd, args)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["samples"] == 10
    rows = {r["policy"]: r for r in out["summary"]}
    for key in ("cost_ratio_mean", "gap_to_optimal_mean", "deadline_met", "spot_hours_mean", "ondemand_hours_mean"):
        assert key in rows["gbroker"]
    assert rows["omniscient"]["gap_to_optimal_mean"] == 0.0
    assert all(r["gap_to_optimal_mean"] >= 0 for r in rows.values())
    res2 = CliRunner().invoke(simulate_cmd, args)
    assert json.loads(res2.output)["summary"] == out["summary"]
    # a gang larger than any trace offers
    bad = CliRunner().invoke(simulate_cmd, args[:-1] + ["--nodes", "9"])
    assert bad.exit_code != 0 and "instances" in bad.output


def test_command_errors_are_clear(tmp_path: Path) -> None:
    res = CliRunner().invoke(simulate_cmd, ["--trace", str(tmp_path / "missing.json"), "--deadline-hours", "2"])
    assert res.exit_code != 0 and "not found" in res.output
    write_trace(tmp_path / "t.json", [1] * 50)
    res = CliRunner().invoke(simulate_cmd, ["--trace", str(tmp_path / "t.json"), "--policy", "bogus", "--deadline-hours", "2"])
    assert res.exit_code != 0 and "gbroker" in res.output


def test_workload_mode(tmp_path: Path) -> None:
    write_trace(tmp_path / "cap.json", [random.Random(i).choice([0, 4, 8, 8]) for i in range(400)], gap=600)
    jobs = [
        {"kind": "render", "nodes": 1, "arrival_hours": 0, "work_hours": 3, "deadline_hours": 5},
        {"kind": "fine-tune", "nodes": 4, "arrival_hours": 1, "work_hours": 6, "deadline_hours": 9, "checkpointable": False},
        {"kind": "simulation", "nodes": 2, "arrival_hours": 2, "work_hours": 4, "deadline_hours": ""},
        {"kind": "render", "nodes": 1, "arrival_hours": 2, "work_hours": 2, "deadline_hours": 3, "interruptible": False},
    ]
    (tmp_path / "jobs.json").write_text(json.dumps({"jobs": jobs}))
    res = CliRunner().invoke(simulate_cmd, ["--trace", str(tmp_path / "cap.json"), "--workload", str(tmp_path / "jobs.json"),
                                            "--policy", "ondemand,greedy,uniform-progress,gbroker", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    rows = {r["policy"]: r for r in out["summary"]}
    assert rows["ondemand"]["cost_ratio"] == pytest.approx(1.0)
    for name in ("greedy", "uniform-progress", "gbroker"):
        assert rows[name]["deadlines_met"] == rows[name]["deadlines"] == 3
        assert rows[name]["unfinished"] == 0
    assert rows["ondemand"]["gpu_hours_lost_to_reclaims"] == 0
    (tmp_path / "bad.csv").write_text("kind,work_hours\nrender,abc\n")
    bad = CliRunner().invoke(simulate_cmd, ["--trace", str(tmp_path / "cap.json"), "--workload", str(tmp_path / "bad.csv")])
    assert bad.exit_code != 0 and "work_hours" in bad.output
    # Options the workload mode does not use are refused, not ignored.
    ignored = CliRunner().invoke(simulate_cmd, ["--trace", str(tmp_path / "cap.json"), "--workload",
                                                str(tmp_path / "jobs.json"), "--nodes", "4", "--deadline-hours", "9"])
    assert ignored.exit_code == 2 and "--deadline-hours, --nodes: not used with --workload" in ignored.output, \
        ignored.output


def test_feed_reports_only_completed_past_runs() -> None:
    # up 3, down 2, up 4, down 1, up ...: at step 10 the completed runs inside
    # the look-back are the ones that ended by then, never the current one.
    data = [1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1]
    tr = Trace("t", 60, tuple(data))
    feed = SpotFeed(tr, 1, len(data))
    m = feed.market(12, 1, 2)
    # The first run (cut by the start of the trace) is not a whole window.
    assert m.spot_windows_s == (4 * 60,)
    assert m.spot_outages_s == (2 * 60, 1 * 60)
    assert m.spot_up_s == 2 * 60 and m.spot_down_s == 0
    # What is seen at step 7 does not depend on anything after it.
    early = feed.market(7, 1, 2)
    assert early.spot_windows_s == () and early.spot_outages_s == (2 * 60,)


def test_gbroker_with_empirical_lengths_jumps_ahead_safely() -> None:
    # Deep into a real trace the look-back holds many windows, so the
    # age-conditioned model is in play; its hints must not skip a change.
    tr = load_traces([REAL])[0]
    d = 720
    pol = from_name("gbroker-markov", empirical=True)
    for offset in (1500, 2100, 2700):
        W, D = 12 * 3600, 16 * 3600
        feed = SpotFeed(tr, 1, offset + 200)
        assert len(feed.market(offset, 1, 2).spot_windows_s) >= 10
        horizon = -(-(D + W + 2 * d) // tr.gap_s)
        prices = Prices(918_000, 3_060_000)
        a = run_job(pol, SimJob(W, D, d), feed, offset, prices, horizon, use_hints=True)
        b = run_job(pol, SimJob(W, D, d), feed, offset, prices, horizon, use_hints=False)
        assert (a.cost_us, a.finished_s, a.reclaims) == (b.cost_us, b.finished_s, b.reclaims)
        assert a.deadline_met


def test_a_replayed_trace_never_shows_a_job_its_own_future() -> None:
    # 100 steps replayed for a 150-step window from step 30: steps 30..99 and
    # 0..79 come back, so at the start nothing may count as history, and
    # later only what will not come back before the deadline (from step 80).
    data = [1, 1, 0, 1, 0] * 20
    tr = Trace("short", 60, tuple(data))
    feed = SpotFeed(tr, 1, 400)
    floor = feed.history_floor(30, 150)
    assert floor == 80
    start = feed.market(30, 1, 2, floor)
    assert start.lookback_s == 0 and start.spot_uptime_fraction is None and start.spot_windows_s == ()
    later = feed.market(120, 1, 2, floor)
    assert 0 < later.lookback_s <= (120 - 80) * 60
    # a window that does not wrap sees its whole past, as before
    assert feed.history_floor(30, 60) == 0 and feed.market(30, 1, 2, 0).lookback_s == 30 * 60
