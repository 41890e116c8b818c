"""Integration fixtures: the real dev Slurm cluster (contrib/slurm/devcluster).

The `slurm_cluster` fixture brings the cluster up once per session when
`devcluster status` says it is not healthy, and fails loudly (with the
devcluster log tail) when it cannot: integration tests never skip.
Every test that uses the fixture is marked `slurm`.

Lanes: `contrib/dev/test` runs the suite in parallel test processes
(pytest-xdist), and each process has a dev cluster of its own, so the tests
of one lane never see another lane's jobs, nodes, hooks or controller
restarts. Worker ``gwN`` uses lane N: the state directory
``$GBROKER_DEVCLUSTER_DIR-N`` with every port moved up by 100 x N (lane 0,
and a run without xdist, use the default cluster).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parents[2]
DEVCLUSTER = REPO / "contrib" / "slurm" / "devcluster"
DEFAULT_STATE_DIR = Path("/tmp/gbroker-devcluster")
LANE_PORT_STEP = 100
"""Ports of lane N's cluster are the default ones plus N times this."""

T = TypeVar("T")


def _lane() -> int:
    """This test process's lane: xdist worker gwN is lane N; a run without xdist is lane 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def _use_lane_cluster(lane: int) -> None:
    """Point this process (and every command it starts) at its lane's own dev cluster.

    Once per process tree: this module is imported again under another name by a test
    that imports it (tests.integration.conftest), and children inherit the environment.
    """
    if lane == 0 or os.environ.get("GBROKER_TEST_LANE") == str(lane):
        return
    base = os.environ.get("GBROKER_DEVCLUSTER_DIR", str(DEFAULT_STATE_DIR)).rstrip("/")
    offset = int(os.environ.get("GBROKER_DEVCLUSTER_PORT_OFFSET", "0") or 0)
    os.environ["GBROKER_DEVCLUSTER_DIR"] = f"{base}-{lane}"
    os.environ["GBROKER_DEVCLUSTER_PORT_OFFSET"] = str(offset + LANE_PORT_STEP * lane)
    os.environ["GBROKER_TEST_LANE"] = str(lane)


SLURM_VERSION_ENV = "GBROKER_SLURM_VERSION"
VERSION_PORT_OFFSETS = {"24.11": 1000, "26.05": 1300}
"""Another Slurm release's clusters (`contrib/dev/test --slurm 24.11`): their own state
directories and ports, clear of the default clusters (and of each other's lanes)."""


def _use_version_cluster() -> None:
    """GBROKER_SLURM_VERSION=24.11: this run's clusters run that release (devcluster --slurm).

    Once per process tree, before the lanes: a state directory of the version's own
    unless GBROKER_DEVCLUSTER_DIR names one. devcluster reads the same variable.
    """
    version = os.environ.get(SLURM_VERSION_ENV, "").strip()
    if not version or os.environ.get("GBROKER_DEVCLUSTER_DIR"):
        return
    if version not in VERSION_PORT_OFFSETS:
        raise pytest.UsageError(f"{SLURM_VERSION_ENV}={version}: the dev cluster runs Slurm "
                                f"{', '.join(VERSION_PORT_OFFSETS)} (or unset: the host's own)")
    os.environ["GBROKER_DEVCLUSTER_DIR"] = f"{DEFAULT_STATE_DIR}-slurm{version}"
    os.environ["GBROKER_DEVCLUSTER_PORT_OFFSET"] = str(VERSION_PORT_OFFSETS[version])


_use_version_cluster()
_use_lane_cluster(_lane())


def use_release_commands(state_dir: Path) -> None:
    """Another release's cluster: its Slurm commands (`<state dir>/bin`, written by `devcluster
    up --slurm`) come first on PATH for the tests and are gbroker's slurm_bin_dir."""
    bin_dir = state_dir / "bin"
    if not (state_dir / "slurm-version").exists() or not (bin_dir / "sbatch").exists():
        return
    path = os.environ.get("PATH", "")
    if not path.startswith(f"{bin_dir}:"):
        os.environ["PATH"] = f"{bin_dir}:{path}"
    os.environ["GBROKER_SLURM_BIN_DIR"] = str(bin_dir)


def _state_dir() -> Path:
    return Path(os.environ.get("GBROKER_DEVCLUSTER_DIR", str(DEFAULT_STATE_DIR))).resolve()


def _log_tail(state_dir: Path, lines: int = 40) -> str:
    parts = []
    for name in ("devcluster.log", "slurmctld.log", "slurmdbd.log", "mariadb.log", "agent.out"):
        path = state_dir / "log" / name
        try:
            text = path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            text = ["(missing)"]
        parts.append(f"--- {path}\n" + "\n".join(text))
    return "\n".join(parts)


@dataclass
class SlurmCluster:
    """Handle on the running dev cluster, with the few helpers tests keep needing."""

    state_dir: Path
    slurm_conf: Path
    env: dict[str, str]
    devcluster: Path = DEVCLUSTER
    nodes: tuple[str, ...] = ("spot1", "spot2", "spot3", "spot4", "od1", "od2")
    spot_nodes: tuple[str, ...] = ("spot1", "spot2", "spot3", "spot4")
    ondemand_nodes: tuple[str, ...] = ("od1", "od2")
    partitions: tuple[str, ...] = ("spot", "ondemand", "urgent")
    accounts: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {"vision": ("root", "alice", "bob"), "climate": ("carol",)})

    def run(self, argv: list[str], *, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (argv list) against this cluster."""
        proc = subprocess.run(argv, check=False, capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def as_user(self, user: str, argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
        """Run argv as a Unix user (jobs then run as that user; its output dir must be writable)."""
        return self.run(["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.slurm_conf}",
                         *argv], **kw)  # type: ignore[arg-type]

    def sinfo(self) -> str:
        """Partitions with node counts, GPUs and states."""
        return self.run(["sinfo", "-o", "%P %D %G %T %N"]).stdout

    def node_state(self, node: str) -> str:
        """Slurm's full state word for a node, e.g. IDLE+CLOUD+POWERED_DOWN."""
        out = self.run(["scontrol", "-o", "show", "node", node]).stdout
        m = re.search(r"\bState=(\S+)", out)
        return m.group(1) if m else ""

    def job_field(self, job_id: str, name: str) -> str:
        """One field of `scontrol show job` (JobState, NodeList, Restarts, ...), '' if gone."""
        proc = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        m = re.search(rf"\b{name}=(\S*)", proc.stdout)
        return m.group(1) if m else ""

    def sacct_attempts(self, job_id: str, fields: str = "JobID,State,NodeList,AllocTRES") -> list[
            dict[str, str]]:
        """Every attempt of a job (requeues included), one dict per row, oldest first."""
        out = self.run(["sacct", "-n", "-P", "-X", "--duplicates", "-j", job_id,
                        f"--format={fields}"]).stdout
        names = fields.split(",")
        return [dict(zip(names, line.split("|"), strict=False)) for line in out.splitlines() if line.strip()]

    def reclaim(self, node: str) -> None:
        """Cloud-style spot reclaim: the node vanishes, its jobs are requeued (NODE_FAIL)."""
        proc = subprocess.run([str(self.devcluster), "reclaim", node], check=False,
                              capture_output=True, text=True, env=self.env, timeout=120)
        if proc.returncode != 0:
            raise AssertionError(f"devcluster reclaim {node} failed: {proc.stdout}{proc.stderr}")

    def slow_boot(self, node: str, seconds: int) -> None:
        """The cloud takes ``seconds`` longer to boot ``node`` next time (0: as usual): its job waits CONFIGURING."""
        proc = subprocess.run([str(self.devcluster), "slow-boot", node, str(seconds)], check=False,
                              capture_output=True, text=True, env=self.env, timeout=30)
        if proc.returncode != 0:
            raise AssertionError(f"devcluster slow-boot {node} failed: {proc.stdout}{proc.stderr}")

    def wait_for(self, predicate: Callable[[], T], timeout: float, interval: float = 1.0,
                 what: str = "condition") -> T:
        """Poll until predicate() is truthy; return its value or fail with what we waited for."""
        deadline = time.monotonic() + timeout
        last: T = predicate()
        while not last:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n"
                                     f"{self.sinfo()}")
            time.sleep(interval)
            last = predicate()
        return last


def _devcluster(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(DEVCLUSTER), *args], check=False, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The real dev cluster, brought up if needed. Never skips: fails with the log tail."""
    state_dir = _state_dir()
    if _devcluster("status", timeout=60).returncode != 0:
        up = _devcluster("up")
        if up.returncode != 0:
            pytest.fail(f"contrib/slurm/devcluster up failed ({up.returncode}):\n{up.stdout}\n"
                        f"{up.stderr}\n{_log_tail(state_dir)}", pytrace=False)
        status = _devcluster("status", timeout=60)
        if status.returncode != 0:
            pytest.fail(f"dev cluster not healthy after up:\n{status.stdout}\n"
                        f"{_log_tail(state_dir)}", pytrace=False)
    slurm_conf = state_dir / "slurm.conf"
    os.environ["SLURM_CONF"] = str(slurm_conf)
    use_release_commands(state_dir)
    env = dict(os.environ, SLURM_CONF=str(slurm_conf), GBROKER_DEVCLUSTER_DIR=str(state_dir))
    yield SlurmCluster(state_dir=state_dir, slurm_conf=slurm_conf, env=env)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark cluster users `slurm`."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slurm)
