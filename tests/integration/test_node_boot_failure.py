"""Boot failures and runs Slurm is ending, on the real dev cluster with a real daemon.

A cloud node that never boots (its slurmd port already taken, so slurmd cannot start) is failed by
Slurm after ResumeTimeout (90 s here): NODE_FAIL, the job requeued, the node "ResumeTimeout reached".
gbroker records a boot failure (not a reclaim, no lost work, nothing charged) and keeps the job off
that node after two. A run whose node stops answering after Slurm signalled it stays COMPLETING in
Slurm; gbroker's status, show and dashboard say completing and name the silent node.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from broker_fixtures import BrokerDaemon, daemon_with_config, power_down_idle, public_dir, user_dir
from test_dashboard import free_port, http, ok, sign_in, token

pytestmark = pytest.mark.slurm

SEMESTER = "boot-term"
SPOT_PORT = 17001
"""spot1's slurmd port before the cluster's offset (docs/DEVCLUSTER.md)."""


@pytest.fixture(scope="module")
def lab(slurm_cluster: Any) -> Iterator[tuple[BrokerDaemon, int]]:
    """A daemon with prices and budgets (so that runs are charged) and the ops listener (dashboard, metrics)."""
    port = free_port()
    with daemon_with_config(slurm_cluster, f'[metrics]\nlisten = "127.0.0.1:{port}"\n') as d:
        today = datetime.now(UTC).date()
        for args in (("semester", "add", SEMESTER, "--start", str(today - timedelta(days=20)),
                      "--end", str(today + timedelta(days=60))),
                     ("group", "add", "vision", "--member", "alice", "--member", "bob"),
                     ("group", "add", "climate", "--member", "carol"),
                     ("price", "set", "spot", "--capacity", "spot", "--price", "1.80",
                      "--from", str(today - timedelta(days=20))),
                     ("price", "set", "ondemand", "--capacity", "ondemand", "--price", "3.60",
                      "--from", str(today - timedelta(days=20))),
                     ("budget", "set", "vision", "--semester", SEMESTER, "--amount", "1000"),
                     ("budget", "set", "climate", "--semester", SEMESTER, "--amount", "1000")):
            ok(d.cli(*args, user="root"))
        yield d, port


def _node_pids(cluster: Any, node: str) -> list[int]:
    """Every process of a cloud node: those in its slurmd's time namespace (docs/DEVCLUSTER.md)."""
    record = json.loads((cluster.state_dir / "cloud" / "nodes" / f"{node}.json").read_text())
    ns = os.readlink(f"/proc/{record['pid']}/ns/time")
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "ns" / "time") == ns:
                    pids.append(int(entry.name))
            except OSError:
                continue  # gone meanwhile
    return pids


def _scontrol_job(cluster: Any, slurm_id: int) -> str:
    return cluster.run(["scontrol", "show", "job", str(slurm_id)], check=False).stdout


def test_a_run_whose_node_stops_answering_as_slurm_ends_it_reads_completing_everywhere(lab, slurm_cluster):
    d, port = lab
    base = user_dir(public_dir("gbroker-cg-"), "carol")
    job = ok(d.cli("submit", "--json", "--group", "climate", "--gpus", "4", "--no-interruptible", "--time", "10m",
                   "--name", "cg-od", "--", "sleep", "600", user="carol", cwd=base)).json()
    assert job["capacity"] == "ondemand"
    running = d.wait_job(job["id"], lambda j: j["state"] == "running", user="carol", timeout=180)
    node, slurm_id = running["attempts"][-1]["nodes"], running["slurm_job_id"]
    assert node.startswith("od")
    frozen = _node_pids(slurm_cluster, node)
    assert frozen, f"no processes of {node}"
    try:
        for pid in frozen:  # the node stops answering: slurmd, slurmstepd and the job
            os.kill(pid, signal.SIGSTOP)
        slurm_cluster.run(["scancel", str(slurm_id)])  # Slurm signals it; nobody on the node answers
        seen = d.wait_job(job["id"], lambda j: j["state"] == "completing" and "not responding" in j["reason"],
                          user="carol", timeout=120)
        assert slurm_cluster.run(["squeue", "-h", "-j", str(slurm_id), "-o", "%T"]).stdout.strip() == "COMPLETING"
        assert seen["reason"].startswith(f"completing on {node}: Slurm is ending it and waits for {node}, "
                                         "not responding")
        assert [a["state"] for a in seen["attempts"]] == ["completing"]
        status = ok(d.cli("status", user="carol", cwd=base)).out
        line = next(ln for ln in status.splitlines() if "cg-od" in ln)
        assert "completing" in line and " running " not in f" {line} ", status
        shown = ok(d.cli("show", str(job["id"]), user="carol", cwd=base)).out
        state = next(ln for ln in shown.splitlines() if ln.strip().startswith("state "))
        assert "completing" in state and "not responding" in state and "running" not in state, shown
        row = next(ln for ln in shown.splitlines() if ln.startswith("1 ") and node in ln)
        assert " completing " in row and " running " not in row, shown
        cookie = sign_in(port, token(d, "carol")["token"])
        code, _, page = http(port, f"/jobs/{job['id']}", cookie)
        assert code == 200 and ">completing<" in page and "not responding" in page, page[-2000:]
        code, _, page = http(port, "/jobs", cookie)
        assert code == 200 and ">completing<" in page
    finally:
        slurm_cluster.reclaim(node)  # the node goes away for good: Slurm ends the run, the node returns
    ended = d.wait_job(job["id"], lambda j: j["state"] not in ("completing", "running"), user="carol", timeout=120)
    assert ended["state"] == "cancelled", ended


def _metric(port: int, name: str, group: str) -> float | None:
    text = http(port, "/metrics")[2]
    m = re.search(rf'^{name}\{{group="{group}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def _back_to_pool(cluster: Any, node: str) -> None:
    """The cloud gives the node back (as it did to the node of the report, after each failed boot)."""
    cluster.run(["scontrol", "update", f"nodename={node}", "state=POWER_DOWN_FORCE"], check=False)


def test_a_node_that_never_boots_is_a_boot_failure_and_after_two_the_job_runs_elsewhere(lab, slurm_cluster):
    d, port = lab
    power_down_idle(slurm_cluster, "spot")
    # The other spot nodes are busy, so Slurm can only give the job spot1, as it gave the report's job its node.
    blockers = slurm_cluster.run(["sbatch", "--parsable", "-A", "vision", "-p", "spot", "-N", "3", "-w",
                                  "spot[2-4]", "--exclusive", "-J", "boot-blocker", "-o", "/dev/null",
                                  "--wrap", "sleep 900"]).stdout.strip()
    offset = json.loads((slurm_cluster.state_dir / "ports.json").read_text())["offset"]
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("0.0.0.0", SPOT_PORT + offset))  # spot1's slurmd cannot listen: the node never boots
    taken.listen(8)
    try:
        slurm_cluster.wait_for(lambda: slurm_cluster.job_field(blockers, "JobState") == "RUNNING", timeout=180,
                               what="the blockers running on spot[2-4]")
        job = ok(d.cli("submit", "--json", "--group", "vision", "--gpus", "1", "--time", "10m",
                       "--name", "never-booted", "--", "sleep", "5")).json()
        assert job["capacity"] == "spot"
        first = d.wait_job(job["id"], lambda j: [a["state"] for a in j["attempts"]][:1] == ["boot_failed"],
                           timeout=300)
        assert first["attempts"][0]["nodes"] == "spot1"
        assert "ResumeTimeout reached" in slurm_cluster.run(["sinfo", "-h", "-n", "spot1", "-o", "%E"]).stdout
        slurm_id = first["slurm_job_id"]
        assert "ExcNodeList=(null)" in _scontrol_job(slurm_cluster, slurm_id)  # one failure: no exclusion yet
        _back_to_pool(slurm_cluster, "spot1")
        second = d.wait_job(job["id"], lambda j: [a["state"] for a in j["attempts"]][:2] == ["boot_failed"] * 2,
                            timeout=300)
        assert second["attempts"][1]["nodes"] == "spot1"
        assert "ExcNodeList=spot1" in _scontrol_job(slurm_cluster, slurm_id)
        _back_to_pool(slurm_cluster, "spot1")  # back again, and the job would wake it a third time
        slurm_cluster.run(["scancel", blockers])
        done = d.wait_job(job["id"], lambda j: j["state"] == "completed", timeout=240)
    finally:
        taken.close()
        slurm_cluster.run(["scancel", blockers], check=False)
        _back_to_pool(slurm_cluster, "spot1")
    assert [a["state"] for a in done["attempts"]] == ["boot_failed", "boot_failed", "completed"], done
    assert done["attempts"][2]["nodes"] != "spot1"
    assert done["reclaims"] == 0
    assert [a["lost_s"] for a in done["attempts"][:2]] == [0, 0]
    kinds = [e["kind"] for e in done["events"]]
    assert (kinds.count("boot_failed"), kinds.count("reclaimed"), kinds.count("nodes_excluded")) == (2, 0, 1), kinds
    # The ledger charges nothing for the two waits for a boot (accounting's ~100 s each), only the run.
    charged = d.wait_job(job["id"], lambda j: sum(e["kind"] == "charged" for e in j["events"]) == 3, timeout=120)
    runs = [e["message"] for e in charged["events"] if e["kind"] == "charged"]
    assert all("NODE_FAIL, 0s x 1 GPU" in m for m in runs[:2]), runs
    lines = ok(d.cli("budget", "ledger", "--format", "json", user="root")).json()
    mine = [c for c in lines if c["job_id"] == job["id"]]
    assert mine and {c["run_index"] for c in mine} == {2}, mine
    assert _metric(port, "gbroker_boot_failures_total", "vision") == 2
    assert _metric(port, "gbroker_reclaims_total", "vision") is None
