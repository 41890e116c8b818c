"""Two dev clusters on one machine never touch each other's nodes or ports.

Both instances have nodes of the same names (od1, ...). The lane's cluster and a
twin in its own state dir (ports 50 up) boot the same node at once, each under a
job; then the twin takes its node down every way it can (reclaim, the agent's
suspend, `down`), also with a record that names the lane's node's time namespace,
which is what the kernel's reuse of a freed namespace's number leaves behind. The
lane's slurmd and job must live through all of it. An offset whose ports meet the
lane's is refused at `up`, naming the lane's cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import SlurmCluster
from tests.integration.test_devcluster import WAKE_TIMEOUT, cancel, job_state, pick_node, sbatch, wait_running

pytestmark = [pytest.mark.slurm]

TWIN_OFFSET = 50
"""The twin's ports sit 50 above the lane's: between two lanes (100 apart), meeting neither."""


def devcluster(cluster: SlurmCluster, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(cluster.devcluster), *args], check=False, capture_output=True, text=True,
                          env=cluster.env, timeout=timeout)


def instance_env(state_dir: Path, offset: int) -> dict[str, str]:
    return dict(os.environ, GBROKER_DEVCLUSTER_DIR=str(state_dir), SLURM_CONF=str(state_dir / "slurm.conf"),
                GBROKER_DEVCLUSTER_PORT_OFFSET=str(offset))


def lane_offset(cluster: SlurmCluster) -> int:
    return int(json.loads((cluster.state_dir / "ports.json").read_text())["offset"])


@pytest.fixture
def twin(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """A second dev cluster beside the lane's, the same lab (same node names), brought down after."""
    state_dir = Path(f"{slurm_cluster.state_dir}-twin")
    cluster = SlurmCluster(state_dir=state_dir, slurm_conf=state_dir / "slurm.conf",
                           env=instance_env(state_dir, lane_offset(slurm_cluster) + TWIN_OFFSET))
    try:
        up = devcluster(cluster, "up")
        assert up.returncode == 0, f"twin up failed:\n{up.stdout}\n{up.stderr}"
        yield cluster
    finally:
        devcluster(cluster, "down", "--purge")


def slurmd_pid(cluster: SlurmCluster, node: str) -> int | None:
    """The node's slurmd as its agent recorded it, if that process is alive and is this cluster's."""
    try:
        pid = int(json.loads((cluster.state_dir / "cloud" / "nodes" / f"{node}.json").read_text())["pid"])
        alive = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        mine = f"\0-f\0{cluster.slurm_conf}\0" in Path(f"/proc/{pid}/cmdline").read_text()
    except (OSError, ValueError, KeyError):
        return None
    return pid if alive and mine else None


def forge_record(cluster: SlurmCluster, node: str, timens_of: int) -> None:
    """The record a node whose slurmd died leaves, once the kernel gives its namespace's number away."""
    path = cluster.state_dir / "cloud" / "nodes" / f"{node}.json"
    path.write_text(json.dumps({"node": node, "pid": 2 ** 22 + 1, "timens": os.readlink(f"/proc/{timens_of}/ns/time"),
                                "booted_at": 0, "config": ""}))


def agent_done(cluster: SlurmCluster) -> bool:
    return not [p for p in (cluster.state_dir / "cloud" / "requests").iterdir() if not p.name.startswith(".")]


def test_two_instances_boot_and_take_down_nodes_of_the_same_name_apart(
        slurm_cluster: SlurmCluster, twin: SlurmCluster) -> None:
    node = pick_node(slurm_cluster, nodes=slurm_cluster.ondemand_nodes)
    jobs = {}
    for cluster in (slurm_cluster, twin):  # both boots at once: each agent boots its own `node`
        jobs[cluster.state_dir] = sbatch(cluster, "-p", "ondemand", "-w", node, "-J", "dc-twin",
                                         "-o", "/dev/null", "--wrap", "sleep 600")
    lane_job, twin_job = jobs[slurm_cluster.state_dir], jobs[twin.state_dir]
    try:
        for cluster in (slurm_cluster, twin):
            assert wait_running(cluster, jobs[cluster.state_dir]) == node
        lane_pid, twin_pid = slurmd_pid(slurm_cluster, node), slurmd_pid(twin, node)
        assert lane_pid and twin_pid and lane_pid != twin_pid
        assert os.readlink(f"/proc/{lane_pid}/ns/time") != os.readlink(f"/proc/{twin_pid}/ns/time")

        # The twin's own actions take its node down and leave the lane's alone.
        assert devcluster(twin, "reclaim", node, "--keep-down").returncode == 0
        assert slurmd_pid(twin, node) is None
        assert slurmd_pid(slurm_cluster, node) == lane_pid

        # A stale record naming the lane node's namespace: suspend, reclaim and down must not follow it.
        forge_record(twin, node, lane_pid)
        assert devcluster(twin, "cloud", "suspend", node).returncode == 0
        twin.wait_for(lambda: agent_done(twin), 30, interval=0.2, what="the twin's agent to take the suspend")
        forge_record(twin, node, lane_pid)
        assert devcluster(twin, "reclaim", node, "--keep-down").returncode == 0
        forge_record(twin, node, lane_pid)
        down = devcluster(twin, "down")
        assert down.returncode == 0, down.stderr
        assert slurmd_pid(slurm_cluster, node) == lane_pid
        assert job_state(slurm_cluster, lane_job) == "RUNNING"
        assert "NOT_RESPONDING" not in slurm_cluster.node_state(node)
    finally:
        cancel(slurm_cluster, lane_job)
        cancel(twin, twin_job)
    slurm_cluster.wait_for(lambda: job_state(slurm_cluster, lane_job) in ("", "CANCELLED"), WAKE_TIMEOUT,
                           what=f"job {lane_job} to end")


@pytest.mark.parametrize("apart", [20, 1])
def test_an_offset_whose_ports_meet_a_running_cluster_is_refused_at_up(
        slurm_cluster: SlurmCluster, apart: int) -> None:
    state_dir = Path(f"{slurm_cluster.state_dir}-clash")
    offset = lane_offset(slurm_cluster) + apart
    try:
        up = subprocess.run([str(slurm_cluster.devcluster), "up"], check=False, capture_output=True, text=True,
                            env=instance_env(state_dir, offset), timeout=120)
        assert up.returncode == 1
        assert f"port offset {offset} meets the dev cluster in {slurm_cluster.state_dir} " in up.stdout + up.stderr
        assert not state_dir.exists()
        registry = Path("/tmp/gbroker-devcluster.registry.json")
        assert str(state_dir) not in (json.loads(registry.read_text()) if registry.exists() else {})
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)
