"""The dev cluster behaves like the cloud-backed Slurm gbroker is built for.

Each test runs against the real cluster: real slurmctld, slurmdbd, MariaDB and
slurmd processes woken by the local cloud agent. Jobs are pinned (-w) to a
node chosen at run time so other users of the shared cluster do not make the
proofs ambiguous.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.slurm.hostlist import compress, slurm_sorted
from tests.integration.conftest import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.contract]
"""`contract`: runs on every Slurm release the dev cluster offers (contrib/dev/test -m contract --slurm 24.11)."""

WAKE_TIMEOUT = 120  # boot + up to one 30 s controller cycle, with slack for a busy machine


OWNED_NODES = ("own1", "own2")
SPOTB_NODES = ("spotb1", "spotb2")
PARTITION_NODES = {"owned": OWNED_NODES, "spot": ("spot1", "spot2", "spot3", "spot4"),
                   "spotb": SPOTB_NODES, "ondemand": ("od1", "od2")}
GPU_TYPE = {"owned": "l4", "spot": "l4", "spotb": "a100", "ondemand": "a100"}
"""The lab's pools as contrib/slurm/devcluster builds them (contrib/slurm/lab.toml)."""
OUT_OF_SERVICE = {"CLOUD", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "POWER_DOWN",
                  "NOT_RESPONDING", "DOWN", "DRAIN"}


def pick_node(cluster: SlurmCluster, prefer_awake: bool = False,
              nodes: tuple[str, ...] | None = None) -> str:
    """A node nobody is using (spot by default): awake-and-idle if asked and available, else powered down."""
    states = {n: cluster.node_state(n) for n in (nodes or cluster.spot_nodes)}
    awake = [n for n, s in states.items() if s.split("+")[0] == "IDLE"
             and not {"POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "DRAIN"} & set(s.split("+"))]
    asleep = [n for n, s in states.items() if s.split("+")[0] == "IDLE" and "POWERED_DOWN" in s]
    choice = (awake or asleep) if prefer_awake else (asleep or awake)
    assert choice, f"no free node: {states}"
    return choice[0]


def sbatch(cluster: SlurmCluster, *args: str) -> str:
    out = cluster.run(["sbatch", "--parsable", *args]).stdout.strip()
    return out.split(";")[0]


def job_state(cluster: SlurmCluster, job_id: str) -> str:
    """The job's state, releasing it when it waits only for the ~2 min requeue delay.

    Other users of the shared cluster may reclaim a node under our job; the job is then
    requeued (correctly) and would sit out BeginTime, which would only slow the test.
    """
    state = cluster.job_field(job_id, "JobState")
    if state == "PENDING" and cluster.job_field(job_id, "Reason") == "BeginTime":
        cluster.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now"], check=False)
    return state


def wait_running(cluster: SlurmCluster, job_id: str, timeout: float = WAKE_TIMEOUT) -> str:
    """Wait until the job runs; returns its node."""
    cluster.wait_for(lambda: job_state(cluster, job_id) == "RUNNING", timeout,
                     what=f"job {job_id} to run")
    return cluster.job_field(job_id, "NodeList")


def cancel(cluster: SlurmCluster, *job_ids: str) -> None:
    cluster.run(["scancel", *job_ids], check=False)


def node_processes(cluster: SlurmCluster, node: str) -> bool:
    """True when the local cloud still has a slurmd for this node."""
    return (cluster.state_dir / "cloud" / "nodes" / f"{node}.json").exists()


def test_gpu_job_wakes_node_and_is_accounted(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    node = pick_node(slurm_cluster)
    assert "POWERED_DOWN" in slurm_cluster.node_state(node)
    out = tmp_path / "gpu.out"
    job = sbatch(slurm_cluster, "-p", "spot", "-w", node, "--gres=gpu:2", "-J", "dc-gpu",
                 "--comment=dc-gpu-test", "-o", str(out),
                 "--wrap", "echo CVD=$CUDA_VISIBLE_DEVICES; echo HOST=$SLURMD_NODENAME")
    slurm_cluster.wait_for(lambda: job_state(slurm_cluster, job) in ("", "COMPLETED"),
                           WAKE_TIMEOUT, what=f"job {job} to complete")
    text = slurm_cluster.wait_for(lambda: out.exists() and out.read_text(), 10,
                                  what="job output")
    assert re.search(r"^CVD=\d,\d$", text, re.MULTILINE), text
    assert f"HOST={node}" in text
    rows = slurm_cluster.wait_for(
        lambda: [r for r in slurm_cluster.sacct_attempts(job, "JobID,State,NodeList,AllocTRES,"
                                                         "Comment") if r["State"] == "COMPLETED"],
        30, what="sacct to record the job")
    assert rows[0]["NodeList"] == node
    assert "gres/gpu=2" in rows[0]["AllocTRES"]
    assert rows[0]["Comment"] == "dc-gpu-test"


def test_reclaim_requeues_and_second_attempt_runs(slurm_cluster: SlurmCluster,
                                                   tmp_path: Path) -> None:
    node = pick_node(slurm_cluster, prefer_awake=True)
    job = sbatch(slurm_cluster, "-p", "spot", "-w", node, "--gres=gpu:1", "-J", "dc-reclaim",
                 "-o", str(tmp_path / "%j-%s.out"), "--wrap", "sleep 600")
    try:
        assert wait_running(slurm_cluster, job) == node
        slurm_cluster.reclaim(node)
        # Requeued at once, not after SlurmdTimeout.
        slurm_cluster.wait_for(lambda: slurm_cluster.job_field(job, "JobState") == "PENDING", 15,
                               what="requeue after reclaim")
        assert slurm_cluster.job_field(job, "Restarts") == "1"
        assert not node_processes(slurm_cluster, node)
        # Skip the ~2 minute requeue delay (BeginTime).
        slurm_cluster.run(["scontrol", "update", f"jobid={job}", "StartTime=now"])
        # Pinned with -w, so the second attempt also proves the reclaimed node is usable again.
        assert wait_running(slurm_cluster, job, timeout=WAKE_TIMEOUT + 30) == node
        rows = slurm_cluster.wait_for(
            lambda: (r := slurm_cluster.sacct_attempts(job)) and len(r) >= 2 and r,
            30, what="sacct to show both attempts")
        assert [r["State"] for r in rows] == ["NODE_FAIL", "RUNNING"], rows
        assert all("gres/gpu=1" in r["AllocTRES"] for r in rows), rows
    finally:
        cancel(slurm_cluster, job)


def test_urgent_job_preempts_spot_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    node = pick_node(slurm_cluster, prefer_awake=True)
    victim = sbatch(slurm_cluster, "-p", "spot", "-w", node, "--gres=gpu:4", "-J", "dc-victim",
                    "-o", str(tmp_path / "victim.out"), "--wrap", "sleep 600")
    urgent = ""
    try:
        wait_running(slurm_cluster, victim)
        urgent = sbatch(slurm_cluster, "-p", "urgent", "-w", node, "--gres=gpu:4",
                        "-J", "dc-urgent", "-o", str(tmp_path / "urgent.out"),
                        "--wrap", "sleep 600")
        assert wait_running(slurm_cluster, urgent, timeout=60) == node
        assert slurm_cluster.job_field(victim, "JobState") == "PENDING"
        assert slurm_cluster.job_field(victim, "Restarts") == "1"
        rows = slurm_cluster.wait_for(
            lambda: [r for r in slurm_cluster.sacct_attempts(victim) if r["State"] == "PREEMPTED"],
            30, what="sacct to record the preemption")
        assert rows[0]["NodeList"] == node
    finally:
        cancel(slurm_cluster, victim, *([urgent] if urgent else []))


def test_job_runs_as_unix_user_in_its_account(slurm_cluster: SlurmCluster) -> None:
    # The submitter must own the output directory, and alice must be able to reach it
    # (pytest's tmp_path sits under a 0700 directory, so use a directory of our own).
    base = Path(tempfile.mkdtemp(prefix="gbroker-devcluster-test-"))
    base.chmod(0o755)
    outdir = base / "alice"
    outdir.mkdir()
    shutil.chown(outdir, "alice", "alice")
    node = pick_node(slurm_cluster, prefer_awake=True)
    out = outdir / "whoami.out"
    job = slurm_cluster.as_user("alice", [
        "sbatch", "--parsable", "-A", "vision", "-p", "spot", "-w", node, "-J", "dc-alice",
        f"--chdir={outdir}", "-o", str(out), "--wrap", "id -un"]).stdout.strip()
    try:
        rows = slurm_cluster.wait_for(
            lambda: [r for r in slurm_cluster.sacct_attempts(job, "JobID,State,User,Account")
                     if r["State"] in ("COMPLETED", "FAILED")], WAKE_TIMEOUT,
            what="alice's job to finish")
        assert (rows[0]["State"], rows[0]["User"], rows[0]["Account"]) == (
            "COMPLETED", "alice", "vision")
        assert out.read_text().strip() == "alice"
        assert out.stat().st_uid == pwd.getpwnam("alice").pw_uid
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_idle_node_is_powered_down(slurm_cluster: SlurmCluster) -> None:
    node = pick_node(slurm_cluster, prefer_awake=True)
    if "POWERED_DOWN" in slurm_cluster.node_state(node):
        job = sbatch(slurm_cluster, "-p", "spot", "-w", node, "-J", "dc-idle", "-o", "/dev/null",
                     "--wrap", "true")
        slurm_cluster.wait_for(lambda: job_state(slurm_cluster, job) in ("", "COMPLETED"),
                               WAKE_TIMEOUT, what=f"job {job} to finish")
    assert node_processes(slurm_cluster, node)
    assert "POWERED_DOWN" not in slurm_cluster.node_state(node)
    # A resume for a node that is already up must not boot a second slurmd.
    record = slurm_cluster.state_dir / "cloud" / "nodes" / f"{node}.json"
    before = record.read_text()
    agent_log = slurm_cluster.state_dir / "log" / "agent.out"
    said = f"resume {node}: already running"
    seen = agent_log.read_text().count(said)
    subprocess.run([str(slurm_cluster.devcluster), "cloud", "resume", node], check=True,
                   env=slurm_cluster.env, timeout=30)
    slurm_cluster.wait_for(lambda: agent_log.read_text().count(said) > seen,
                           10, interval=0.2, what="the agent to handle the resume")
    assert record.read_text() == before
    # SuspendTime (default 20 s) + SuspendTimeout, with slack.
    slurm_cluster.wait_for(lambda: "POWERED_DOWN" in slurm_cluster.node_state(node), 90,
                           what=f"{node} to be powered down when idle")
    assert not node_processes(slurm_cluster, node)


def test_missing_partition_is_refused(slurm_cluster: SlurmCluster) -> None:
    proc = slurm_cluster.run(["sbatch", "-p", "nosuchpartition", "--wrap", "true"], check=False)
    assert proc.returncode != 0
    assert "invalid partition" in proc.stderr.lower(), proc.stderr


# -- the lab: owned nodes, two spot zones, typed GPUs ---------------------------------

def owned_record(cluster: SlurmCluster, node: str) -> dict[str, Any]:
    """What `up` recorded of an owned node's slurmd (outside the cloud's records)."""
    return json.loads((cluster.state_dir / "owned" / f"{node}.json").read_text())


def slurm_config(cluster: SlurmCluster, key: str) -> str:
    out = cluster.run(["scontrol", "show", "config"]).stdout
    m = re.search(rf"^{key}\s*=\s*(.*)$", out, re.MULTILINE)
    return m.group(1).strip() if m else ""


def node_field(cluster: SlurmCluster, node: str, name: str) -> str:
    out = cluster.run(["scontrol", "-o", "show", "node", node]).stdout
    m = re.search(rf"\b{name}=(\S*)", out)
    return m.group(1) if m else ""


def test_owned_nodes_are_up_and_idle_without_a_job(slurm_cluster: SlurmCluster) -> None:
    """Owned nodes serve at once after `up` and Slurm's power saving never touches them."""
    pids = {}
    for node in OWNED_NODES:
        state = slurm_cluster.node_state(node)
        assert state == "IDLE", f"{node}: {state}"
        rec = owned_record(slurm_cluster, node)
        pids[node] = rec["pid"]
        assert Path(f"/proc/{rec['pid']}/cmdline").read_bytes().split(b"\0")[:4] == [
            b"/usr/sbin/slurmd", b"-D", b"-N", node.encode()]
        # Not a cloud instance: no provider reading the cloud's records sees it.
        assert not (slurm_cluster.state_dir / "cloud" / "nodes" / f"{node}.json").exists()
    assert slurm_config(slurm_cluster, "SuspendExcNodes") == "own[1-2]"
    # Idle past SuspendTime + SuspendTimeout (at once on a cluster that has been up a
    # while; up to ~35 s right after `up`): still up, the same slurmd, no hook called.
    suspend = int(slurm_config(slurm_cluster, "SuspendTime").split()[0])
    timeout = int(slurm_config(slurm_cluster, "SuspendTimeout").split()[0])

    def idle_long_enough() -> bool:
        busy = max(time.mktime(time.strptime(node_field(slurm_cluster, n, "LastBusyTime"),
                                             "%Y-%m-%dT%H:%M:%S")) for n in OWNED_NODES)
        return time.time() - busy > suspend + timeout + 2

    slurm_cluster.wait_for(idle_long_enough, suspend + timeout + 30, what="the owned nodes to idle")
    for node in OWNED_NODES:
        assert slurm_cluster.node_state(node) == "IDLE"
        assert owned_record(slurm_cluster, node)["pid"] == pids[node]
    agent_log = (slurm_cluster.state_dir / "log" / "agent.out").read_text()
    assert not re.search(r"\b(suspend|resume|booted) own\d", agent_log), agent_log[-2000:]


def test_owned_node_refuses_reclaim_and_cloud_requests(slurm_cluster: SlurmCluster) -> None:
    pid = owned_record(slurm_cluster, "own1")["pid"]
    for args in (["reclaim", "own1"], ["cloud", "suspend", "own1"]):
        proc = subprocess.run([str(slurm_cluster.devcluster), *args], check=False, capture_output=True,
                              text=True, env=slurm_cluster.env, timeout=60)
        assert proc.returncode != 0, proc.stdout
        assert "own1 is an owned node" in proc.stderr, proc.stderr
    assert not list((slurm_cluster.state_dir / "cloud" / "requests").glob("*own1*"))
    assert slurm_cluster.node_state("own1") == "IDLE"
    assert owned_record(slurm_cluster, "own1")["pid"] == pid


def test_typed_gpus_are_visible(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.run(["sinfo", "-h", "-o", "%R %G"]).stdout
    gres = {}
    for line in out.splitlines():
        part, g = line.split()
        gres.setdefault(part, set()).add(re.sub(r"\(S:[^)]*\)$", "", g))  # socket binding, if shown
    for part, gpu in GPU_TYPE.items():
        assert gres[part] == {f"gpu:{gpu}:4"}, out
    assert gres["urgent"] == {"gpu:l4:4", "gpu:a100:4"}  # over both spot zones
    for part, nodes in PARTITION_NODES.items():
        for node in nodes:
            assert re.fullmatch(rf"gpu:{GPU_TYPE[part]}:4(\(S:[^)]*\))?",
                                node_field(slurm_cluster, node, "Gres")), node
            assert f"gres/gpu:{GPU_TYPE[part]}=4" in node_field(slurm_cluster, node, "CfgTRES")
    tres = slurm_config(slurm_cluster, "AccountingStorageTRES").split(",")
    assert {"gres/gpu", "gres/gpu:a100", "gres/gpu:l4"} <= set(tres)


def test_status_shows_the_pools(slurm_cluster: SlurmCluster) -> None:
    proc = subprocess.run([str(slurm_cluster.devcluster), "status"], check=False, capture_output=True,
                          text=True, env=slurm_cluster.env, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    for part, nodes in PARTITION_NODES.items():
        head = next(i for i, line in enumerate(lines) if line.startswith(f"  {part} "))
        assert f"gpu:{GPU_TYPE[part]}:4" in lines[head], lines[head]
        for i, node in enumerate(nodes, start=head + 1):
            # Slurm's state word (cloud nodes may change it meanwhile: checked for form only).
            name, state = lines[i].split()[:2]
            assert name == node and re.fullmatch(r"[A-Z_]+(\+[A-Z_]+)*", state), lines[i]
            if part == "owned":
                assert state == "IDLE" and "slurmd pid" in lines[i], lines[i]
    assert re.search(r"^  owned\s+owned, always on", proc.stdout, re.MULTILINE)
    assert re.search(r"^  spotb\s+spot, zone b", proc.stdout, re.MULTILINE)


def test_untyped_gpus_run_everywhere_and_a100_only_where_it_is(slurm_cluster: SlurmCluster,
                                                              tmp_path: Path) -> None:
    refused = slurm_cluster.run(["sbatch", "-p", "spot", "--gres=gpu:a100:1", "--wrap", "true"],
                                check=False)
    assert refused.returncode != 0
    assert "requested node configuration is not available" in refused.stderr.lower(), refused.stderr
    jobs = {}
    for part, nodes in PARTITION_NODES.items():
        node = pick_node(slurm_cluster, prefer_awake=True, nodes=nodes)
        jobs[part] = sbatch(slurm_cluster, "-p", part, "-w", node, "--gres=gpu:2", "-J", f"dc-{part}",
                            "-o", str(tmp_path / f"{part}.out"), "--wrap", "echo CVD=$CUDA_VISIBLE_DEVICES")
    # Not pinned: Slurm picks a node with a100s among both partitions.
    a100 = sbatch(slurm_cluster, "-p", "spotb,ondemand", "--gres=gpu:a100:1", "-J", "dc-a100",
                  "-o", str(tmp_path / "a100.out"), "--wrap", "echo CVD=$CUDA_VISIBLE_DEVICES")
    def ended(job: str) -> list[dict[str, str]]:
        job_state(slurm_cluster, job)  # releases a requeued attempt's BeginTime wait
        return [r for r in slurm_cluster.sacct_attempts(job, "JobID,State,NodeList,AllocTRES,Partition")
                if r["State"] in ("COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY")]

    try:
        for part, job in [*jobs.items(), ("a100", a100)]:
            rows = slurm_cluster.wait_for(lambda job=job: ended(job), WAKE_TIMEOUT,
                                          what=f"the {part} job {job} to end")
            assert rows[0]["State"] == "COMPLETED", rows
            if part == "a100":
                assert rows[0]["Partition"] in ("spotb", "ondemand"), rows
                assert re.fullmatch(r"spotb\d|od\d", rows[0]["NodeList"]), rows
                assert "gres/gpu:a100=1" in rows[0]["AllocTRES"].split(","), rows
                assert "gres/gpu:l4" not in rows[0]["AllocTRES"], rows
            else:
                assert rows[0]["NodeList"] in PARTITION_NODES[part], rows
                assert {"gres/gpu=2", f"gres/gpu:{GPU_TYPE[part]}=2"} <= set(rows[0]["AllocTRES"].split(",")), rows
            text = (tmp_path / f"{part}.out").read_text()
            assert re.search(r"^CVD=\d(,\d)?$", text, re.MULTILINE), text
    finally:
        cancel(slurm_cluster, *jobs.values(), a100)


def test_reclaim_in_zone_b_leaves_zone_a_alone(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    node_a = pick_node(slurm_cluster, prefer_awake=True)
    node_b = pick_node(slurm_cluster, prefer_awake=True, nodes=SPOTB_NODES)
    job_a = sbatch(slurm_cluster, "-p", "spot", "-w", node_a, "--gres=gpu:1", "-J", "dc-zone-a",
                   "-o", "/dev/null", "--wrap", "sleep 600")
    job_b = sbatch(slurm_cluster, "-p", "spotb", "-w", node_b, "--gres=gpu:1", "-J", "dc-zone-b",
                   "-o", "/dev/null", "--wrap", "sleep 600")
    try:
        assert wait_running(slurm_cluster, job_a) == node_a
        assert wait_running(slurm_cluster, job_b) == node_b
        record_a = (slurm_cluster.state_dir / "cloud" / "nodes" / f"{node_a}.json").read_text()
        state_a = slurm_cluster.node_state(node_a)
        # What an earlier test left on zone a (a reason outlives a reclaim's power-down) stays as it was.
        reasons_a = {node: node_field(slurm_cluster, node, "Reason") for node in PARTITION_NODES["spot"]}
        slurm_cluster.reclaim(node_b)
        slurm_cluster.wait_for(lambda: slurm_cluster.job_field(job_b, "JobState") == "PENDING", 15,
                               what="the zone b job's requeue")
        assert slurm_cluster.job_field(job_b, "Restarts") == "1"
        assert not node_processes(slurm_cluster, node_b)
        # Zone a: its job runs on, never restarted; its node is the same slurmd, in the same state.
        assert slurm_cluster.job_field(job_a, "JobState") == "RUNNING"
        assert slurm_cluster.job_field(job_a, "Restarts") == "0"
        assert (slurm_cluster.state_dir / "cloud" / "nodes" / f"{node_a}.json").read_text() == record_a
        assert slurm_cluster.node_state(node_a) == state_a
        for node in PARTITION_NODES["spot"]:
            assert not {"DOWN", "DRAIN"} & set(slurm_cluster.node_state(node).split("+")), node
            assert node_field(slurm_cluster, node, "Reason") == reasons_a[node], node
        # One attempt in accounting, still running (sacct catches up with the start first).
        rows = slurm_cluster.wait_for(lambda: (r := slurm_cluster.sacct_attempts(job_a))
                                      and r[-1]["State"] != "PENDING" and r, 30,
                                      what="sacct to record the zone a job's start")
        assert [r["State"] for r in rows] == ["RUNNING"], rows
    finally:
        cancel(slurm_cluster, job_a, job_b)


_HOSTNAMES = st.lists(
    st.builds(lambda prefix, number, pad: prefix + str(number).zfill(pad),
              st.sampled_from(["spot", "od", "gpu-a", "r1n", "r10n", "a", "a0", ""]),
              st.integers(0, 1200), st.sampled_from([0, 0, 0, 2, 3]))
    | st.sampled_from(["spot", "login"])
    | st.from_regex(r"[a-z][a-z0-9_.-]{0,6}[0-9]{0,3}", fullmatch=True),
    min_size=1, max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(names=_HOSTNAMES)
def test_compressed_hostlists_read_back_through_scontrol(slurm_cluster: SlurmCluster, names: list[str]) -> None:
    """broker.slurm.hostlist.compress writes what Slurm reads back to the same names, in Slurm's order,
    and what Slurm itself would write: `scontrol show hostlistsorted` leaves it as it is."""
    text = compress(names)
    assert slurm_cluster.run(["scontrol", "show", "hostnames", text]).stdout.split() == slurm_sorted(names)
    assert slurm_cluster.run(["scontrol", "show", "hostlistsorted", text]).stdout.strip() == text


def test_compressed_hostlists_name_the_cluster_nodes(slurm_cluster: SlurmCluster) -> None:
    text = compress(list(slurm_cluster.nodes))
    assert text == "od[1-2],spot[1-4]"
    listed = slurm_cluster.run(["sinfo", "-h", "-N", "-n", text, "-o", "%N"]).stdout.split()
    assert set(listed) == set(slurm_cluster.nodes)
    spot199 = compress([f"spot{i}" for i in range(1, 200)])
    assert spot199 == "spot[1-199]"
    assert slurm_cluster.run(["scontrol", "show", "hostnames", spot199]).stdout.split() == [
        f"spot{i}" for i in range(1, 200)]


SLURM_DAEMONS = {"slurmctld", "slurmdbd", "slurmd", "slurmstepd", "slurmscriptd"}


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _our_processes(state_dir: Path) -> list[int]:
    """Live daemons and node/job processes that belong to this state dir.

    Daemons name the state dir on their command line (slurmdbd only in its
    SLURM_CONF); node processes (slurmd, slurmstepd, jobs) share the time
    namespace of their node's slurmd.
    """
    conf = f"SLURM_CONF={state_dir}/slurm.conf".encode()
    named = re.compile(re.escape(str(state_dir)).encode() + rb"(?=[/\0]|$)")  # never another cluster's dir-N
    me = os.readlink("/proc/self/ns/time")
    found, node_ns = set(), set()
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid == os.getpid() or _proc_state(pid) in ("Z", "gone"):
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            ns = os.readlink(f"/proc/{pid}/ns/time")
        except OSError:
            continue
        if named.search(cmd) or (conf in env and comm in SLURM_DAEMONS):
            found.add(pid)
            if ns != me:
                node_ns.add(ns)
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.readlink(f"/proc/{pid}/ns/time") in node_ns and _proc_state(pid) != "Z":
                found.add(pid)
        except OSError:
            continue
    return sorted(found)


def test_up_restarts_an_agent_started_from_another_checkout(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """The agent boots the nodes; one left running from another (maybe deleted) checkout is replaced."""
    run = slurm_cluster.state_dir / "run"
    old_pid = int((run / "agent.pid").read_text())
    other = tmp_path / "other-checkout" / "devcluster"
    other.parent.mkdir()
    shutil.copy2(slurm_cluster.devcluster, other)
    os.kill(old_pid, 15)
    slurm_cluster.wait_for(lambda: not Path(f"/proc/{old_pid}").exists()
                           or Path(f"/proc/{old_pid}/stat").read_text().split(")")[1].split()[0] == "Z",
                           15, what="the agent to stop")
    env = dict(slurm_cluster.env, GBROKER_DEVCLUSTER_DIR=str(slurm_cluster.state_dir))
    with open(os.devnull, "wb") as null:
        stray = subprocess.Popen(["/usr/bin/python3", str(other), "agent", "--state", str(slurm_cluster.state_dir)],
                                 stdout=null, stderr=null, start_new_session=True, env=env)
    (run / "agent.pid").write_text(f"{stray.pid}\n")
    try:
        up = subprocess.run([str(slurm_cluster.devcluster), "up"], check=False, capture_output=True, text=True,
                            env=slurm_cluster.env, timeout=600)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "another checkout" in up.stdout + up.stderr
        stray.wait(timeout=30)
        new_pid = int((run / "agent.pid").read_text())
        cmd = Path(f"/proc/{new_pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert f"{slurm_cluster.devcluster} agent" in cmd, cmd
        # The replaced agent boots nodes: a job on a powered-down node runs.
        node = pick_node(slurm_cluster)
        job = sbatch(slurm_cluster, "-p", "spot", "-w", node, "-J", "dc-agent", "-o", "/dev/null", "--wrap", "true")
        slurm_cluster.wait_for(lambda: job_state(slurm_cluster, job) == "COMPLETED", WAKE_TIMEOUT,
                               what=f"job {job} to complete")
    finally:
        if stray.poll() is None:
            stray.kill()


def test_down_leaves_nothing_running(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    node = pick_node(slurm_cluster, prefer_awake=True)
    # --no-requeue: the next `up` ends this job (NODE_FAIL) instead of running it again.
    job = sbatch(slurm_cluster, "-p", "spot", "-w", node, "-J", "dc-down", "-o", "/dev/null",
                 "--no-requeue", "--wrap", "sleep 600")
    wait_running(slurm_cluster, job)
    # RUNNING is the controller's word; slurmstepd forks the script a moment later.
    want = {"munged", "slurmctld", "slurmdbd", "slurmd", "slurmstepd", "sleep"}

    def names_now() -> set[str]:
        return {_comm(p) for p in _our_processes(slurm_cluster.state_dir)} - {""}

    try:
        slurm_cluster.wait_for(lambda: want <= names_now(), 30, what="the job's sleep to start")
    except BaseException:
        # Leave no job on the node for the tests after this one (they power nodes down).
        slurm_cluster.run(["scancel", job], check=False)
        raise
    before = _our_processes(slurm_cluster.state_dir)
    names = {_comm(p) for p in before}
    assert want <= names, names
    assert names & {"mariadbd", "mysqld"}, names
    proc = subprocess.run([str(slurm_cluster.devcluster), "down"], check=False,
                          capture_output=True, text=True, env=slurm_cluster.env, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    left = [p for p in before if _proc_state(p) not in ("Z", "gone")]
    assert left == [], left
    assert _our_processes(slurm_cluster.state_dir) == []
    status = subprocess.run([str(slurm_cluster.devcluster), "status"], check=False,
                            capture_output=True, text=True, env=slurm_cluster.env, timeout=60)
    assert status.returncode != 0
    # And up again, from the state it left: the tests after this one use the same cluster.
    up = subprocess.run([str(slurm_cluster.devcluster), "up"], check=False,
                        capture_output=True, text=True, env=slurm_cluster.env, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    # The owned nodes are back by themselves, serving before any job asks for them.
    for node in OWNED_NODES:
        assert slurm_cluster.node_state(node) == "IDLE", node
        assert _proc_state(int(owned_record(slurm_cluster, node)["pid"])) not in ("Z", "gone")
