"""Arrays, chains and logs on the real dev cluster: a render spread over the spot nodes with a
reclaim, a sweep with failing points, a chain simulate -> render, `gbroker logs -f` across a reclaim."""

from __future__ import annotations

import re
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from broker_fixtures import SRC, BrokerDaemon, broker_daemon, public_dir, user_dir  # noqa: F401  (fixture)

SEMESTER = "arrays-term"
PRICE = {"spot": 3_600_000, "ondemand": 7_200_000}
"""Per GPU-hour, micro-units (so a GPU-second is 1,000 and 2,000)."""


def ok(r: Any) -> Any:
    assert r.code == 0, f"exit {r.code}\nstdout: {r.out}\nstderr: {r.err}"
    return r


def submit(d: BrokerDaemon, *args: str, user: str = "alice", cwd: Any = None) -> dict[str, Any]:
    return ok(d.cli("submit", "--json", "--group", "vision", *args, user=user, cwd=cwd)).json()


def setup_money(d: BrokerDaemon) -> None:
    today = datetime.now(UTC).date()
    admin = lambda *a: ok(d.cli(*a, user="root"))  # noqa: E731
    admin("semester", "add", SEMESTER, "--start", str(today - timedelta(days=1)),
          "--end", str(today + timedelta(days=30)))
    admin("group", "add", "vision", "--member", "alice")
    csv_file = public_dir("gbroker-prices-") / "prices.csv"
    csv_file.write_text("partition,capacity,price_per_gpu_hour,effective_from\n"
                        f"spot,spot,3.60,{today - timedelta(days=1)}\n"
                        f"ondemand,ondemand,7.20,{today - timedelta(days=1)}\n")
    admin("price", "import", str(csv_file))


def task_runs(cluster: Any, array_ids: list[int]) -> list[dict[str, str]]:
    """Every run of every task of these arrays, straight from sacct (not through gbroker)."""
    names = ["JobID", "JobIDRaw", "State", "Partition", "ElapsedRaw", "AllocTRES", "End"]
    out = cluster.run(["sacct", "-X", "--duplicates", "-n", "-P", "-a", "-j", ",".join(map(str, array_ids)),
                       f"--format={','.join(names)}"]).stdout
    rows = [dict(zip(names, ln.split("|"), strict=True)) for ln in out.splitlines() if ln.strip()]
    return [r for r in rows if "_" in r["JobID"] and "[" not in r["JobID"]]


def cost(rows: list[dict[str, str]]) -> int:
    total = 0
    for r in rows:
        m = re.search(r"gres/gpu=(\d+)", r["AllocTRES"])
        total += (int(m.group(1)) if m else 0) * int(r["ElapsedRaw"] or 0) * PRICE[r["Partition"]] // 3600
    return total


def wait(what: str, pred: Any, timeout: float, d: BrokerDaemon, interval: float = 1.0,
         cluster: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            nodes = "" if cluster is None else f"{cluster.sinfo()}\n{cluster.run(['squeue', '-a']).stdout}\n"
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{nodes}{d.log_tail(60)}")
        time.sleep(interval)


def ran_for(cluster: Any, node: str, seconds: int) -> bool:
    """Every task Slurm runs on ``node`` has run ``seconds`` or more (and there is one)."""
    out = cluster.run(["squeue", "-h", "-w", node, "-t", "R", "-o", "%M"]).stdout.split()

    def secs(m: str) -> int:
        days, _, clock = m.rpartition("-")
        parts = [int(x) for x in clock.split(":")]
        return (int(days) * 86400 if days else 0) + sum(v * 60**i for i, v in enumerate(reversed(parts)))

    return bool(out) and all(secs(m) >= seconds for m in out)


def tasks_on(cluster: Any, node: str) -> set[int]:
    """The array task indices Slurm has on ``node`` now."""
    out = cluster.run(["squeue", "-h", "-w", node, "-o", "%K"]).stdout.split()
    return {int(k) for k in out if k.isdigit()}


def arrays_of(job: dict[str, Any]) -> list[int]:
    return [b["slurm_array_id"] for b in job["array"]["batches"] if b["slurm_array_id"]]


# -- 1. a render as an array: spread over the spot nodes, one reclaimed, every frame once -------
def test_a_render_array_spreads_over_the_spot_nodes_and_a_reclaim_reruns_only_its_frames(broker_daemon, slurm_cluster):
    d = broker_daemon
    setup_money(d)
    base = user_dir(public_dir("gbroker-render-"), "alice")
    frames = base / "frames"
    job = submit(d, str(SRC / "examples" / "render.toml"), "--checkpoint-dir", str(frames), "--",
                 "python3", str(SRC / "examples" / "render.py"), "--seconds-per-frame", "4", cwd=base)
    assert job["pieces"]["total"] == 40 and job["partition"] == "spot", job

    seen: set[str] = set()

    def spread() -> dict[str, Any] | None:
        j = d.show(job["id"])
        running = [p for p in j["array"]["pieces"] if p["state"] == "running"]
        seen.update(p["nodes"] for p in running)
        # A node that boots late may start its frames after another's first ones ended.
        return j if len(seen) == 4 and running else None

    # Two GPUs a frame, four per node: eight frames at once, spread over all four spot nodes.
    j = wait("frames running on each of the four spot nodes", spread, 240, d, cluster=slurm_cluster)
    running = [p for p in j["array"]["pieces"] if p["state"] == "running"]
    node = running[0]["nodes"]
    on_node = {p["piece"] for p in running if p["nodes"] == node}
    assert 1 <= len(on_node) <= 2, running
    # Reclaim once the node's frames have really run for a while (Slurm shows a task whose node
    # still boots as configuring, and a run reclaimed within its first second has lost nothing).
    wait("the node's frames running for 2 s", lambda: ran_for(slurm_cluster, node, 2), 60, d)
    on_node |= tasks_on(slurm_cluster, node)  # a frame may have ended and the next begun meanwhile
    slurm_cluster.reclaim(node)
    done = d.wait_job(job["id"], lambda x: x["state"] in ("completed", "failed"), timeout=420, interval=2)
    assert done["state"] == "completed", done["reason"]
    assert done["pieces"]["line"] == "40/40 done", done["pieces"]
    # Every frame on disk, each written exactly once (the renderer notes every write).
    assert sorted(p.name for p in frames.glob("frame-*.png")) == [f"frame-{i:05d}.png" for i in range(1, 41)]
    writes = Counter(int(line.split()[0]) for line in (frames / "renders.log").read_text().splitlines())
    assert writes == Counter(range(1, 41)), writes
    # The reclaimed frames ran twice; their first runs are attempts that lost their time.
    reclaimed = [a for a in done["attempts"] if a["state"] == "reclaimed"]
    assert reclaimed and all(a["lost_s"] > 0 for a in reclaimed), done["attempts"]
    again = {p["piece"] for p in done["array"]["pieces"] if p["reclaims"]}
    assert again and again <= on_node, (again, on_node)
    assert len(done["attempts"]) == 40 + len(reclaimed)
    # The ledger: every run of every task charged from sacct, lost ones tagged lost; totals add up.
    rows = task_runs(slurm_cluster, arrays_of(done))
    raw = {int(r["JobIDRaw"]) for r in rows}

    def charged() -> list[dict[str, Any]] | None:
        lines = [c for c in ok(d.cli("budget", "ledger", "--format", "json", user="root")).json()
                 if c["slurm_job_id"] in raw]
        runs = {(c["slurm_job_id"], c["run_index"]) for c in lines}
        return lines if len(runs) == sum(1 for r in rows if int(r["ElapsedRaw"] or 0) > 0) else None

    lines = wait("every run of every task charged", charged, 120, d)
    assert sum(c["amount_micros"] for c in lines) == cost(rows) > 0
    node_fail = {int(r["JobIDRaw"]) for r in rows if r["State"] == "NODE_FAIL"}
    lost = {c["slurm_job_id"] for c in lines if c["tag"] == "lost"}
    assert node_fail and lost == node_fail, (lost, node_fail)
    assert sum(c["amount_micros"] for c in lines if c["tag"] == "lost") > 0


# -- 2. a sweep with two failing points -----------------------------------------------------------
def test_a_sweep_with_two_failing_points_ends_with_18_done_and_2_failed(broker_daemon, slurm_cluster):
    d = broker_daemon
    base = user_dir(public_dir("gbroker-sweep-"), "alice")
    points = base / "points.txt"
    lines = [f"--steps 20 --pause 0.01 --every 1 --out {base}/point-{i}.json" for i in range(1, 21)]
    lines[6] = "--steps not-a-number"  # point 7: argparse exits 2
    lines[13] = "--cells oops"  # point 14
    points.write_text("# one point per line\n" + "\n".join(lines) + "\n")
    points.chmod(0o644)
    job = submit(d, "--kind", "simulation", "--gpus", "1", "--time", "5m", "--max-retries", "1", "--name", "sweep",
                 "--sweep", str(points), "--", "python3", str(SRC / "examples" / "simulation.py"), cwd=base)
    assert job["pieces"]["total"] == 20, job
    done = d.wait_job(job["id"], lambda x: x["state"] in ("completed", "failed"), timeout=300, interval=2)
    assert done["state"] == "failed", done
    assert done["pieces"]["line"] == "18/20 done, 2 failed", done["pieces"]
    assert done["array"]["by_state"] == {"done": "1-6,8-13,15-20", "failed": "7,14"}, done["array"]["by_state"]
    assert "failed pieces: 7,14" in done["reason"]
    failed = {p["piece"]: p for p in done["array"]["pieces"] if p["state"] == "failed"}
    assert all(p["failures"] == 2 and p["exit_code"] == 2 for p in failed.values()), failed
    # Retried once, in batches of their own (one, or one each when the two ended in different
    # ticks): two failed runs each, the others ran once.
    assert [b["pieces"] for b in done["array"]["batches"]] in (["1-20", "7,14"], ["1-20", "7", "14"],
                                                               ["1-20", "14", "7"])
    assert sum(1 for a in done["attempts"] if a["state"] == "failed") == 4
    assert sorted(int(p.stem.split("-")[1]) for p in base.glob("point-*.json")) == [
        i for i in range(1, 21) if i not in (7, 14)]
    shown = ok(d.cli("show", str(job["id"]))).out
    assert "18/20 done, 2 failed" in shown and "failed     7,14" in shown, shown
    assert "piece 7 failed: failed 2 times, last exit 2" in shown, shown


# -- 3. a chain: simulate -> render -----------------------------------------------------------------
def test_a_chain_starts_after_its_job_completed_and_is_cancelled_with_it(broker_daemon, slurm_cluster):
    d = broker_daemon
    base = user_dir(public_dir("gbroker-chain-"), "alice")
    sim = submit(d, "--time", "5m", "--name", "simulate", "--", "sleep", "6", cwd=base)
    render = submit(d, "--time", "5m", "--name", "render", "--after", str(sim["id"]), "--",
                    "sleep", "1", cwd=base)
    assert render["slurm_job_id"] is None and "waiting for job" in render["note"], render
    running = d.wait_job(sim["id"], lambda j: j["state"] == "running", timeout=180)
    held = d.show(render["id"])
    assert held["state"] == "pending" and held["attempts"][0]["slurm_job_id"] is None, held
    assert held["reason"] == f"waiting for job {sim['id']} to complete"
    sim_done = d.wait_job(sim["id"], lambda j: j["state"] == "completed", timeout=120)
    rendered = d.wait_job(render["id"], lambda j: j["state"] == "completed", timeout=180)
    started = rendered["attempts"][0]["started_at"]
    assert started >= sim_done["attempts"][-1]["ended_at"] and running, (rendered, sim_done)
    # Cancel the first link: the next is cancelled with that reason, and never reaches Slurm.
    sim2 = submit(d, "--time", "5m", "--name", "simulate2", "--", "sleep", "300", cwd=base)
    render2 = submit(d, "--time", "5m", "--name", "render2", "--after", str(sim2["id"]), "--", "true", cwd=base)
    ok(d.cli("cancel", str(sim2["id"])))
    gone = d.wait_job(render2["id"], lambda j: j["state"] == "cancelled", timeout=60)
    assert f"job {sim2['id']} it waits for ended cancelled" in gone["reason"], gone
    assert all(a["slurm_job_id"] is None for a in gone["attempts"]), gone


# -- 4. logs -f follows a job through a reclaim into its next attempt -----------------------------------
def test_logs_follow_goes_on_through_a_reclaim_into_the_next_attempt(broker_daemon, slurm_cluster):
    d = broker_daemon
    base = user_dir(public_dir("gbroker-logs-"), "alice")
    script = ("import os, time\n"
              "a = os.environ['GBROKER_ATTEMPT']\n"
              "for i in range(int(os.environ.get('TICKS', '8'))):\n"
              "    print(f'attempt {a} tick {i}', flush=True); time.sleep(1)\n")
    prog = base / "ticker.py"
    prog.write_text(script)
    prog.chmod(0o644)
    job = submit(d, "--time", "5m", "--name", "ticker", "--checkpoint-style", "pieces", "--", "python3", str(prog),
                 cwd=base)
    follower = d.cli_background("logs", str(job["id"]), "-f", "--interval", "0.5")
    try:
        running = d.wait_job(job["id"], lambda j: j["state"] == "running", timeout=180)
        time.sleep(3)
        slurm_cluster.reclaim(running["attempts"][-1]["nodes"])
        d.wait_job(job["id"], lambda j: j["state"] == "completed", timeout=240)
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert "attempt 1 tick 0" in out and "attempt 2 tick 7" in out, out
    assert re.search(r"=== gbroker: job \d+ attempt 2 starts", out), out
    # --attempt picks one attempt's lines out of the log.
    second = ok(d.cli("logs", str(job["id"]), "--attempt", "2")).out
    assert "attempt 2 tick 0" in second and "attempt 1 tick" not in second, second
