"""Capacity pools on the real dev cluster lab (contrib/slurm/lab.toml): owned nodes first, GPU types
by memory, spot in two zones, on-demand last; refusals with each pool's reason; a config from before
pools runs unchanged."""

from __future__ import annotations

import inspect
import json
import re
import time
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any

import pytest

from broker.config import MIGRATE_HINT
from broker.jobs.placement import job_view
from broker.market import ReclaimHistory
from broker_fixtures import REPO, SRC, BrokerDaemon, daemon_with_config, public_dir, user_dir
from policies.base import DEFAULT_CHECKPOINT_INTERVAL_S

LAB = REPO / "contrib" / "slurm" / "lab.toml"
SEMESTER = "lab-term"


def lab_config() -> str:
    # The lab's catalog as it ships, minus the provider (the dev cluster's power hooks boot the
    # nodes themselves in these tests).
    return re.sub(r"(?m)^node_provider = .*$", "", LAB.read_text())


@pytest.fixture
def lab(slurm_cluster: Any):
    with daemon_with_config(slurm_cluster, lab_config(), GBROKER_NODE_TICK_SECONDS="2") as d:
        yield d
    leave_lab_as_found(slurm_cluster)


def leave_lab_as_found(slurm_cluster: Any) -> None:
    # Leave the lab as found: both spot zones back in service, nothing of ours queued. A node
    # kept down after its reclaim, or drained for an outage, is handed back to the cloud pool
    # (POWER_DOWN_FORCE: a drained powered-down node that is only resumed stays NOT_RESPONDING,
    # which the dev cluster's status counts as unhealthy for the tests after this one).
    states = slurm_cluster.run(["sinfo", "-h", "-N", "-p", "spot,spotb", "-o", "%N %T"], check=False).stdout
    for line in states.splitlines():
        name, _, state = line.partition(" ")
        if "down" in state.lower() or "drain" in state.lower():
            slurm_cluster.run(["scontrol", "update", f"nodename={name}", "state=power_down_force"], check=False)
    names = slurm_cluster.run(["squeue", "-h", "-o", "%i %j"], check=False).stdout.split("\n")
    ids = [n.split()[0] for n in names if n.strip() and n.split()[1].startswith("gb-")]
    if ids:
        slurm_cluster.run(["scancel", *ids], check=False)


def ok(r: Any) -> Any:
    assert r.code == 0, f"exit {r.code}\n{r.out}\n{r.err}"
    return r


def submit(d: BrokerDaemon, *args: str, user: str = "alice") -> dict[str, Any]:
    group = "climate" if user == "carol" else "vision"
    return ok(d.cli("submit", "--json", "--group", group, *args, user=user)).json()


def sacct_tres(cluster: Any, slurm_id: int) -> str:
    out = cluster.run(["sacct", "-n", "-P", "-X", "-j", str(slurm_id), "-o", "ReqTRES,AllocTRES"]).stdout
    return out.strip().splitlines()[-1] if out.strip() else ""


def slurm_id_of(d: BrokerDaemon, job_id: int) -> int:
    job = d.wait_job(job_id, lambda j: j["attempts"][-1].get("slurm_job_id") is not None, timeout=60)
    return int(job["attempts"][-1]["slurm_job_id"])


def in_queue(cluster: Any, slurm_id: int) -> tuple[str, str]:
    """(partition, state) of a Slurm job in the queue."""
    out = cluster.run(["squeue", "-h", "-j", str(slurm_id), "-o", "%P %T"], check=False).stdout.split()
    return (out[0], out[1]) if len(out) == 2 else ("", "")


def pool_row(d: BrokerDaemon, name: str) -> dict[str, Any]:
    return next(p for p in ok(d.cli("pools", "--json")).json()["pools"] if p["name"] == name)


def wait_owned_full(d: BrokerDaemon, cluster: Any, jobs: list[dict[str, Any]]) -> None:
    """The jobs run on owned nodes, and the node tick's census has seen it."""
    for j in jobs:
        d.wait_job(j["id"], lambda x: x["state"] == "running", timeout=60)
    cluster.wait_for(lambda: pool_row(d, "owned")["free_gpus"] == 0, 30, what="the owned pool to show no free GPUs")


def semester_and_group(d: BrokerDaemon) -> None:
    """A semester around today (for the report by pool) and alice in group vision."""
    admin = lambda *a: ok(d.cli(*a, user="root"))  # noqa: E731
    today = datetime.now(UTC).date()
    admin("semester", "add", SEMESTER, "--start", str(today - timedelta(days=1)),
          "--end", str(today + timedelta(days=30)))
    admin("group", "add", "vision", "--member", "alice")


def charged_in(d: BrokerDaemon, cluster: Any, *pools: str) -> None:
    """The semester's report by pool shows GPU time charged in each of ``pools`` (waits for the ledger)."""
    def rows() -> dict[str, Any] | None:
        rep = ok(d.cli("report", "--semester", SEMESTER, "--by", "pool", "--json", user="root")).json()
        found = {r["key"]: r for r in rep["rows"]}
        return found if set(pools) <= set(found) else None

    found = cluster.wait_for(rows, 60, what=f"charges in {', '.join(pools)}")
    assert all(found[p]["gpu_seconds"] > 0 for p in pools), found


def test_a_job_no_pool_can_hold_is_refused_with_each_pools_reason_and_nothing_is_stored(lab):
    r = lab.cli("submit", "--group", "vision", "--gpu-mem-gb", "100", "--time", "10m", "--", "true")
    assert r.code != 0
    assert "no pool can hold this job" in r.err
    for pool, why in (("owned", "24 GB per GPU"), ("spot-a", "24 GB per GPU"), ("spot-b", "80 GB per GPU"),
                      ("ondemand", "80 GB per GPU")):
        assert f"{pool}: {why}, the job needs 100 GB" in r.err, r.err
    r = lab.cli("submit", "--group", "vision", "--gpu", "h100", "--time", "10m", "--", "true")
    assert r.code != 0 and "owned: has l4, the job asks for h100" in r.err and "spot-b: has a100" in r.err, r.err
    r = lab.cli("submit", "--group", "vision", "--gpus", "8", "--time", "10m", "--", "true")
    # The largest node any pool has (4 GPUs), not the configured ceiling of 8.
    assert r.code != 0 and "at most 4 (the largest node has that many GPUs), got 8" in r.err, r.err
    for listing in ("status", "history"):
        assert ok(lab.cli(listing, "--json")).json() == [], listing


def test_owned_first_then_spot_memory_picks_the_type_and_strict_jobs_wait_or_go_ondemand(lab, slurm_cluster):
    d = lab
    pools = {p["name"]: p for p in ok(d.cli("pools", "--json")).json()["pools"]}
    assert set(pools) == {"owned", "spot-a", "spot-b", "ondemand"}
    assert pools["owned"]["capacity"] == "owned" and pools["spot-b"]["gpu_type"] == "a100"
    # Owned nodes (own1-2, 4 L4 each) fill first.
    a = submit(d, "--gpus", "4", "--time", "20m", "--", "sleep", "600")
    # Any of two types: the pool the policy ranks first (owned L4s, already paid for).
    b = submit(d, "--gpus", "4", "--gpu", "l4,a100", "--time", "20m", "--", "sleep", "600")
    assert (a["partition"], a["capacity"]) == ("owned", "owned"), a
    assert (b["partition"], b["capacity"]) == ("owned", "owned"), b
    wait_owned_full(d, slurm_cluster, [a, b])
    # Owned full: an interruptible job takes spot (zone a, the cheapest per unit of work).
    c = submit(d, "--gpus", "1", "--time", "20m", "--", "sleep", "600")
    assert (c["partition"], c["capacity"]) == ("spot", "spot"), c
    # 40 GB per GPU: only the A100 pools hold it; spot-b is the cheaper of them. Never an L4.
    m = submit(d, "--gpus", "1", "--gpu-mem-gb", "40", "--time", "20m", "--", "sleep", "600")
    assert (m["partition"], m["capacity"]) == ("spotb", "spot"), m
    d.wait_job(m["id"], lambda x: x["state"] == "running", timeout=120)
    tres = sacct_tres(slurm_cluster, slurm_id_of(d, m["id"]))
    assert "gres/gpu:a100=1" in tres and "l4" not in tres, tres
    # Not interruptible, no deadline: waits for owned capacity (pending in the owned queue).
    w = submit(d, "--gpus", "4", "--no-interruptible", "--time", "10m", "--", "sleep", "5")
    assert (w["partition"], w["state"]) == ("owned", "pending"), w
    # Not interruptible, a deadline that cannot wait: L4 or A100, and owned is full: the A100 on-demand pool.
    deadline = (datetime.now(UTC) + timedelta(minutes=11)).isoformat(timespec="seconds")
    u = submit(d, "--gpus", "1", "--gpu", "l4,a100", "--no-interruptible", "--time", "10m",
               "--deadline", deadline, "--", "sleep", "5")
    assert (u["partition"], u["capacity"]) == ("ondemand", "ondemand"), u
    u_done = d.wait_job(u["id"], lambda x: x["state"] == "completed", timeout=180)
    assert u_done["attempts"][0]["nodes"].startswith("od")
    assert "gres/gpu:a100=1" in sacct_tres(slurm_cluster, slurm_id_of(d, u["id"]))
    # The waiting job starts on owned capacity as soon as it frees up.
    assert d.show(w["id"])["state"] == "pending"
    ok(d.cli("cancel", str(a["id"])))
    done = d.wait_job(w["id"], lambda x: x["state"] == "completed", timeout=120)
    assert done["attempts"][0]["nodes"].startswith("own") and len(done["attempts"]) == 1, done
    for j in (b, c, m):
        ok(d.cli("cancel", str(j["id"])))


def test_a_spot_job_reclaimed_in_zone_a_resumes_in_zone_b_and_its_ledger_shows_both(lab, slurm_cluster):
    d = lab
    semester_and_group(d)
    # Owned capacity busy, so the job goes to spot.
    blockers = [submit(d, "--gpus", "4", "--time", "20m", "--", "sleep", "600") for _ in range(2)]
    assert all(b["partition"] == "owned" for b in blockers)
    wait_owned_full(d, slurm_cluster, blockers)
    base = user_dir(public_dir("gbroker-zones-"), "alice")
    ck, out = base / "ck", base / "result.json"
    job = submit(d, "--kind", "finetune", "--gpus", "4", "--time", "30m", "--checkpoint-dir", str(ck),
                 "--checkpoint-style", "signal", "--name", "zones", "--", "python3",
                 str(SRC / "examples" / "finetune.py"), "--steps", "20", "--step-seconds", "1", "--every", "1",
                 "--out", str(out))
    assert (job["partition"], job["capacity"]) == ("spot", "spot"), job
    running = d.wait_job(job["id"], lambda j: j["state"] == "running", timeout=180)
    node = running["attempts"][0]["nodes"]
    assert node.startswith("spot") and not node.startswith("spotb"), node
    # Zone a goes away: the other nodes are drained, then the job's node is reclaimed.
    others = [n for n in ("spot1", "spot2", "spot3", "spot4") if n != node]
    slurm_cluster.run(["scontrol", "update", f"nodename={','.join(others)}", "state=drain", "reason=zone-a-outage"])
    slurm_cluster.wait_for(lambda: pool_row(d, "spot-a")["spot_available"] == 1, 30,
                           what="the census to see zone a drained")
    time.sleep(3)  # some progress to keep
    gone = slurm_cluster.run([str(slurm_cluster.devcluster), "reclaim", node, "--keep-down"], timeout=120)
    assert gone.returncode == 0, gone.stderr
    moved = d.wait_job(job["id"], lambda j: len(j["attempts"]) == 2 and j["state"] == "running", timeout=180)
    assert moved["attempts"][0]["state"] == "reclaimed"
    assert moved["attempts"][1]["partition"] == "spotb" and moved["attempts"][1]["nodes"].startswith("spotb"), moved
    done = d.wait_job(job["id"], lambda j: j["state"] == "completed", timeout=240)
    assert [a["partition"] for a in done["attempts"]] == ["spot", "spotb"]
    result = json.loads(out.read_text())
    assert result["step"] == 20 and result["attempts"][1]["from_step"] > 0, result  # resumed, not restarted
    # The ledger charges each run to its own pool.
    charged_in(d, slurm_cluster, "spot-a", "spot-b")
    for b in blockers:
        ok(d.cli("cancel", str(b["id"])))


def test_a_job_sent_to_ondemand_by_an_outage_goes_back_to_spot_when_spot_returns(lab, slurm_cluster):
    """An A100 job (spot-b or on-demand) while zone b is out: with a deadline whose slack is under
    12 % of its work it goes to on-demand. Zone b comes back: at the next ticks the policy's rule
    for a job on on-demand (as the simulator asks it) says leave, and the daemon requeues the job
    onto zone b. The program saves when the requeue signals it and goes on from there; the
    ledger charges each run to its own pool."""
    d = lab
    semester_and_group(d)
    zone_b = "spotb1,spotb2"
    slurm_cluster.run(["scontrol", "update", f"nodename={zone_b}", "state=drain", "reason=outage"])
    slurm_cluster.wait_for(lambda: pool_row(d, "spot-b")["spot_available"] == 0, 30,
                           what="the census to see zone b out")
    base = user_dir(public_dir("gbroker-back-"), "alice")
    ck, out = base / "ck", base / "result.json"
    # Work (the time limit) 60 min, 67 min to the deadline: 6 min of slack past the changeover,
    # under 12 % of the work, and enough for a round trip to spot (2 changeovers of 1 min).
    deadline = (datetime.now(UTC) + timedelta(minutes=67)).isoformat(timespec="seconds")
    job = submit(d, "--kind", "finetune", "--gpus", "4", "--gpu", "a100", "--time", "60m", "--deadline", deadline,
                 "--checkpoint-dir", str(ck), "--checkpoint-style", "signal", "--name", "back", "--",
                 "python3", str(SRC / "examples" / "finetune.py"), "--steps", "90", "--step-seconds", "1",
                 "--every", "30", "--out", str(out))
    assert (job["partition"], job["capacity"]) == ("ondemand", "ondemand"), job
    d.wait_job(job["id"], lambda j: j["state"] == "running", timeout=180)
    time.sleep(5)  # some work on on-demand to keep
    assert len(d.show(job["id"])["attempts"]) == 1  # zone b still out: it stays
    slurm_cluster.run(["scontrol", "update", f"nodename={zone_b}", "state=power_down_force"])  # back in the pool
    moved = d.wait_job(job["id"], lambda j: len(j["attempts"]) == 2, timeout=90)
    assert moved["attempts"][0]["state"] == "moved" and moved["attempts"][1]["partition"] == "spotb", moved
    said = [e["message"] for e in moved["events"] if e["kind"] == "fallback"]
    assert len(said) == 1 and "requeued to spotb back to spot" in said[0] and "spot-b" in said[0], said
    done = d.wait_job(job["id"], lambda j: j["state"] == "completed", timeout=300)
    assert [(a["partition"], a["state"]) for a in done["attempts"]] == [("ondemand", "moved"), ("spotb", "completed")]
    assert done["attempts"][1]["nodes"].startswith("spotb") and done["reclaims"] == 0, done
    assert done["attempts"][1]["ended_at"] <= deadline.replace("+00:00", "Z"), (done, deadline)
    result = json.loads(out.read_text())
    assert result["step"] == 90 and result["attempts"][1]["from_step"] > 0, result  # resumed, not restarted
    charged_in(d, slurm_cluster, "ondemand", "spot-b")


CHEAP_A = "0.024"
"""spot-a's price per GPU-hour in the repeated-reclaim test: cheap enough that one reclaim does
not outweigh it, dear enough that a few quick ones do (spot-b costs 1.10 / speed 3 per unit of work)."""


def _zone_a_rate(attempts: list[dict[str, Any]]) -> float:
    """Zone a's reclaim rate as the daemon counts it: reclaims per hour of spot time there."""
    hours = 0.0
    for a in attempts:
        start, end = datetime.fromisoformat(a["started_at"]), datetime.fromisoformat(a["ended_at"])
        hours += (end - start).total_seconds() / 3600
    return ReclaimHistory({1: (len(attempts), hours)}).rate(1)


def test_a_zone_reclaimed_again_and_again_loses_the_job_to_the_other_zone_not_to_ondemand(slurm_cluster):
    """Zone a keeps free nodes throughout, but reclaims the job's node each time it runs there.
    After each reclaim the job resumes in the spot pool with the lowest expected cost per unit of
    work (price / speed x (1 + the pool's own reclaim rate x the hours a reclaim costs)): zone a
    while its rate is low, zone b once its reclaims outweigh its lower price. Never on-demand,
    and the work done before each reclaim is kept."""
    config = re.sub(r'(\[pools\.spot-a\][^\[]*?price_per_gpu_hour = )"0\.35"', rf'\g<1>"{CHEAP_A}"', lab_config())
    assert f'price_per_gpu_hour = "{CHEAP_A}"' in config
    # Where the policy's choice turns: spot-a's expected cost reaches spot-b's (no reclaims there).
    changeover_s = inspect.signature(job_view).parameters["changeover_s"].default  # the daemon's
    per_reclaim_h = (changeover_s + DEFAULT_CHECKPOINT_INTERVAL_S / 2) / 3600
    a_cost, b_cost = float(Fraction(CHEAP_A)), float(Fraction("1.10") / 3)
    turn = (b_cost / a_cost - 1) / per_reclaim_h
    assert 100 < turn < 200, turn  # reclaims per hour; the waits below are sized for it
    with daemon_with_config(slurm_cluster, config, GBROKER_NODE_TICK_SECONDS="2") as d:
        try:
            admin = lambda *a: ok(d.cli(*a, user="root"))  # noqa: E731
            admin("group", "add", "vision", "--member", "alice")
            blockers = [submit(d, "--gpus", "4", "--time", "20m", "--", "sleep", "600") for _ in range(2)]
            wait_owned_full(d, slurm_cluster, blockers)
            base = user_dir(public_dir("gbroker-rezone-"), "alice")
            ck, out = base / "ck", base / "result.json"
            job = submit(d, "--kind", "finetune", "--gpus", "4", "--time", "30m", "--checkpoint-dir", str(ck),
                         "--checkpoint-style", "signal", "--name", "rezone", "--", "python3",
                         str(SRC / "examples" / "finetune.py"), "--steps", "60", "--step-seconds", "1",
                         "--every", "1", "--out", str(out))
            assert (job["partition"], job["capacity"]) == ("spot", "spot"), job
            d.wait_job(job["id"], lambda j: j["state"] == "running", timeout=180)
            # A first run long enough that one reclaim keeps zone a's rate under the turn
            # (1 per 40 s = 90 per hour); the runs after it are reclaimed as soon as they start.
            time.sleep(3600 / (turn / 1.5))
            reclaims = 0
            while True:
                running = d.show(job["id"])
                att = running["attempts"][-1]
                assert att["partition"] == "spot" and att["state"] == "running", running
                gone = slurm_cluster.run([str(slurm_cluster.devcluster), "reclaim", att["nodes"]], timeout=120)
                assert gone.returncode == 0, gone.stderr
                reclaims += 1
                after = d.wait_job(job["id"], lambda j, n=reclaims: len(j["attempts"]) == n + 1, timeout=120)
                spent = [a for a in after["attempts"] if a["state"] == "reclaimed"]
                assert len(spent) == reclaims and all(a["partition"] == "spot" for a in spent), after
                rate, went = _zone_a_rate(spent), after["attempts"][-1]["partition"]
                assert went in ("spot", "spotb"), after  # spot somewhere, never on-demand
                if abs(rate / turn - 1) > 0.15:  # clear of the turn, the choice follows the costs
                    assert went == ("spot" if rate < turn else "spotb"), (rate, turn, after)
                if went == "spotb":
                    break
                assert reclaims < 6, f"zone a's rate {rate:.0f}/h after {reclaims} reclaims: {after}"
                d.wait_job(job["id"], lambda j, n=reclaims: len(j["attempts"]) == n + 1
                           and j["attempts"][-1]["state"] == "running", timeout=180)
            assert reclaims >= 2, "one reclaim should not have outweighed zone a's price"
            done = d.wait_job(job["id"], lambda j: j["state"] == "completed", timeout=240)
            assert [a["partition"] for a in done["attempts"]] == ["spot"] * reclaims + ["spotb"], done
            assert done["attempts"][-1]["nodes"].startswith("spotb"), done
            assert not any("ondemand" in (a["partition"] or "") for a in done["attempts"])
            assert any("spot in spot-b" in e["message"] for e in done["events"]), done["events"]
            result = json.loads(out.read_text())
            assert result["step"] == 60 and result["attempts"][-1]["from_step"] > 0, result
            for b in blockers:
                ok(d.cli("cancel", str(b["id"])))
        finally:
            leave_lab_as_found(slurm_cluster)


LEGACY = """\
# A settings file from before pools.
tick_seconds = 1
[partitions]
spot = "spot"
ondemand = "ondemand"

[nodes.spot]
idle_seconds = 120
"""


def test_a_two_partition_config_from_before_pools_runs_unchanged(slurm_cluster):
    with daemon_with_config(slurm_cluster, LEGACY) as d:
        pools = ok(d.cli("pools", "--json")).json()
        assert [(p["name"], p["partition"], p["capacity"]) for p in pools["pools"]] == [
            ("spot", "spot", "spot"), ("ondemand", "ondemand", "ondemand")]
        assert pools["catalog"] is False
        assert "two pools from [partitions]" in ok(d.cli("pools")).out
        spot = submit(d, "--gpus", "1", "--time", "10m", "--", "sleep", "2")
        strict = submit(d, "--gpus", "1", "--no-interruptible", "--time", "10m", "--", "sleep", "2")
        assert (spot["partition"], spot["capacity"]) == ("spot", "spot")
        assert (strict["partition"], strict["capacity"]) == ("ondemand", "ondemand")
        for j in (spot, strict):
            done = d.wait_job(j["id"], lambda x: x["state"] == "completed", timeout=180)
            assert len(done["attempts"]) == 1
        # Untyped GPUs, as before: no gres type in the request.
        req = sacct_tres(slurm_cluster, slurm_id_of(d, spot["id"])).split("|")[0]
        assert "gres/gpu=1" in req and "gres/gpu:" not in req, req
        log = d.log_path.read_text()
        assert log.count(MIGRATE_HINT) == 1, "the way to pools is said once"
