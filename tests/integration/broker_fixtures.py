"""A real gbroker daemon against the real dev cluster, and a CLI run as a real user.

The daemon runs as root (as in production), so jobs run as their submitters;
the CLI is run as the Unix user alice/bob/carol, so the daemon learns who they
are from the kernel, exactly as in production.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from broker.db.migrate import upgrade_to_head

REPO = Path(__file__).resolve().parents[2]


def _world_readable(path: Path) -> bool:
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & 0o001:
            return False
    return bool(path.stat().st_mode & 0o004)


def public_dir(prefix: str) -> Path:
    """A fresh directory other users can reach (pytest's tmp dirs are private to root)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(path, 0o755)
    return path


def _readable_source() -> Path:
    """The source tree as the job users can read it: the checkout, or a copy when it is private."""
    if _world_readable(REPO / "broker"):
        return REPO
    copy = public_dir("gbroker-src-")
    for part in ("broker", "policies", "examples"):
        shutil.copytree(REPO / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(copy):
        for name in dirs + files:
            os.chmod(os.path.join(root, name), 0o755 if name in dirs else 0o644)
    return copy


SRC = _readable_source()
"""Where processes run as alice/bob/carol (the CLI, the example jobs) find gbroker's code."""


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class BrokerDaemon:
    workdir: Path
    socket: str
    db_url: str
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)

    def start(self, **extra_env: str) -> None:
        assert self.proc is None or self.proc.poll() is not None, "daemon already running"
        env = dict(self.env, **extra_env)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "--socket", self.socket, "daemon", "--log-level", "DEBUG"],
            env=env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if extra_env.get("GBROKER_CRASH_AT"):
                    return
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log_tail()}")
            if os.path.exists(self.socket) and self.cli("status", user="root").code == 0:
                return
            time.sleep(0.2)
        raise AssertionError(f"daemon did not come up:\n{self.log_tail()}")

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        code = self.proc.returncode
        self.proc = None
        return code

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def cli(self, *args: str, user: str = "alice", cwd: str | Path | None = None, timeout: float = 60) -> CliResult:
        """Run `gbroker ARGS` as a real Unix user."""
        kwargs: dict[str, Any] = {}
        env = dict(self.env)
        if user != "root":
            pw = pwd.getpwnam(user)
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            env["HOME"] = pw.pw_dir
            env["USER"] = env["LOGNAME"] = user
        p = subprocess.run(
            [sys.executable, "-m", "broker", "--socket", self.socket, *args],
            cwd=str(cwd or self.workdir),
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            **kwargs,
        )
        return CliResult(p.returncode, p.stdout, p.stderr)

    def cli_background(self, *args: str, user: str = "alice", cwd: str | Path | None = None) -> subprocess.Popen[str]:
        """Start `gbroker ARGS` as a real Unix user without waiting for it."""
        pw = pwd.getpwnam(user)
        env = dict(self.env, HOME=pw.pw_dir, USER=user, LOGNAME=user)
        return subprocess.Popen(
            [sys.executable, "-m", "broker", "--socket", self.socket, *args], cwd=str(cwd or self.workdir),
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
        )

    def show(self, job_id: int, user: str = "alice") -> dict[str, Any]:
        r = self.cli("show", str(job_id), "--json", user=user)
        assert r.code == 0, r.err
        return r.json()

    def wait_job(
        self, job_id: int, pred: Callable[[dict[str, Any]], bool], timeout: float = 180, user: str = "alice",
        interval: float = 1.0,
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:
            job = self.show(job_id, user=user)
            if pred(job):
                return job
            time.sleep(interval)
        raise AssertionError(f"job {job_id} did not reach the wanted state in {timeout}s: {job}\n{self.log_tail()}")


def user_dir(base: Path, user: str) -> Path:
    """A directory the job's user can write (jobs run as that user)."""
    pw = pwd.getpwnam(user)
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o755)
    os.chown(base, pw.pw_uid, pw.pw_gid)
    return base


_MIGRATED: list[Path] = []


def migrated_db(dest: Path) -> None:
    """Put a database already at the schema's head at ``dest`` (mode 600, as the daemon makes it).

    Migrating a new file costs each daemon start a second or two; the tests
    that are about a new database (``@pytest.mark.fresh_db``) let the daemon
    make its own, and tests/unit/test_migrations.py runs every migration.
    """
    if not _MIGRATED:
        template = Path(public_dir("gbroker-schema-")) / "head.db"
        os.close(os.open(template, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        upgrade_to_head(f"sqlite:///{template}")
        _MIGRATED.append(template)
    os.close(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    shutil.copyfile(_MIGRATED[0], dest)


@contextlib.contextmanager
def daemon_with_config(slurm_cluster: Any, config: str, fresh_db: bool = False,
                       **env_extra: str) -> Iterator[BrokerDaemon]:
    """A daemon on the dev cluster with ``config`` as its settings file, stopped and removed after.

    Its database starts at the schema's head (``migrated_db``) unless ``fresh_db``
    or the environment names another."""
    work = public_dir("gbroker-test-")
    env = dict(os.environ)
    env.update(slurm_cluster.env)
    env.update(
        {
            "GBROKER_DB_URL": f"sqlite:///{work}/gbroker.db",
            "GBROKER_TICK_SECONDS": "1",
            "GBROKER_CONFIG": str(work / "gbroker.toml"),
            "PYTHONPATH": str(SRC),
        }
    )
    env.update(env_extra)
    if not fresh_db and env["GBROKER_DB_URL"] == f"sqlite:///{work}/gbroker.db":
        migrated_db(work / "gbroker.db")
    (work / "gbroker.toml").write_text(config)
    d = BrokerDaemon(
        workdir=user_dir(work / "jobs", "alice"),
        socket=str(work / "gbroker.sock"),
        db_url=env["GBROKER_DB_URL"],
        env=env,
        log_path=work / "daemon.log",
    )
    d.start()
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def broker_daemon(request: pytest.FixtureRequest, slurm_cluster: Any):
    fresh = request.node.get_closest_marker("fresh_db") is not None
    with daemon_with_config(slurm_cluster, "# defaults; the environment sets the rest\n", fresh_db=fresh) as d:
        yield d


# -- cluster actions the broker tests need ---------------------------------------
DEVCLUSTER = REPO / "contrib" / "slurm" / "devcluster"


def nodes_up(cluster: Any, partition: str) -> list[str]:
    """Nodes of `partition` that are powered up (booted or booting)."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-p", partition, "-o", "%N %T"],
        env=cluster.env, capture_output=True, text=True, check=True,
    ).stdout
    up = []
    for line in out.splitlines():
        name, state = line.split()
        if "POWERED_DOWN" in state.upper() or state.endswith("~") or "powered" in state.lower():
            continue
        up.append(name)
    return sorted(set(up))


def fail_launch(cluster: Any, node: str) -> None:
    """The next job start on `node` fails (`devcluster fail-launch`)."""
    p = subprocess.run([str(DEVCLUSTER), "fail-launch", node], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def clear_launch_failures(cluster: Any) -> None:
    """Forget unused launch failures and return nodes a failed launch drained to service."""
    shutil.rmtree(cluster.state_dir / "launch-fail", ignore_errors=True)
    subprocess.run(["scontrol", "update", f"NodeName={','.join(cluster.nodes)}", "State=RESUME"],
                   env=cluster.env, capture_output=True, text=True, check=False)


def power_down_idle(cluster: Any, partition: str, timeout: float = 120) -> None:
    """Power down the partition's nodes once idle and wait until they are (so the next job boots one)."""
    deadline = time.monotonic() + timeout
    asked = 0.0
    while up := nodes_up(cluster, partition):
        assert time.monotonic() < deadline, f"{partition} nodes still up: {up}\n{cluster.sinfo()}"
        if time.monotonic() - asked > 5:  # a node still finishing a job refuses; ask again
            subprocess.run(["scontrol", "update", f"NodeName={','.join(up)}", "State=POWER_DOWN"],
                           env=cluster.env, capture_output=True, text=True, check=False)
            asked = time.monotonic()
        time.sleep(1)


def stop_controller(cluster: Any, kill: bool = False) -> None:
    """Stop slurmctld (slurmd and the jobs keep running, as when a controller host dies).

    ``kill``: SIGKILL at once, so it saves no state on the way down (a crash).
    """
    pid = int((cluster.state_dir / "run" / "slurmctld.pid").read_text())
    os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)


def start_controller(cluster: Any) -> None:
    """Bring the cluster back to health (`devcluster up` is idempotent: it starts what is missing)."""
    p = subprocess.run([str(DEVCLUSTER), "up"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
