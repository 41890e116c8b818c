"""The dev cluster behaves like the cloud-backed Slurm gbroker is built for.

Each test runs against the real cluster: real slurmctld, slurmdbd, MariaDB and
slurmd processes woken by the local cloud agent. Jobs are pinned (-w) to a
node chosen at run time so other users of the shared cluster do not make the
proofs ambiguous.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.slurm.hostlist import compress, slurm_sorted
from tests.integration.conftest import SlurmCluster

pytestmark = pytest.mark.slurm

WAKE_TIMEOUT = 120  # boot + up to one 30 s controller cycle, with slack for a busy machine


def pick_node(cluster: SlurmCluster, prefer_awake: bool = False) -> str:
    """A spot node nobody is using: awake-and-idle if asked and available, else powered down."""
    states = {n: cluster.node_state(n) for n in cluster.spot_nodes}
    awake = [n for n, s in states.items() if s.split("+")[0] == "IDLE"
             and not {"POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "DRAIN"} & set(s.split("+"))]
    asleep = [n for n, s in states.items() if s.split("+")[0] == "IDLE" and "POWERED_DOWN" in s]
    choice = (awake or asleep) if prefer_awake else (asleep or awake)
    assert choice, f"no free spot node: {states}"
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
    before = _our_processes(slurm_cluster.state_dir)
    names = {Path(f"/proc/{p}/comm").read_text().strip() for p in before}
    assert {"munged", "slurmctld", "slurmdbd", "slurmd", "slurmstepd", "sleep"} <= names, names
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
