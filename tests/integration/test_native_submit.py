"""Submission through libslurm equals submission through sbatch, on the dev cluster.

The daemon queues jobs with one libslurm call (broker/slurm/native.py) instead of
an sbatch process per job. These tests send the same requests both ways, as
alice, and compare what Slurm stored (``scontrol show job``) and the environment
the job's script saw. They run on the host's Slurm, where ``contrib/dev/setup``
builds the module; another release's cluster submits with sbatch (the module is
refused there, which the last test checks). Beyond these, every daemon of the
integration tests queues its jobs this way (``slurm_submit = "auto"``), and the
backend contract tests keep proving sbatch, which other releases use.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.errors import ConfigError, SlurmError
from broker.slurm import native
from broker.slurm.backend import SubmitRequest
from broker.slurm.cli_backend import CliBackend
from broker.slurm.runner import Runner

pytestmark = [pytest.mark.slurm]

VOLATILE = {"JobId", "JobName", "ArrayJobId", "SubmitTime", "EligibleTime", "AccrueTime", "StartTime", "EndTime",
            "LastSchedEval", "AllocNode:Sid", "StdOut", "StdErr", "StdIn", "Reason", "Priority", "JobState",
            "RunTime", "Deadline", "PreemptEligibleTime", "PreemptTime", "SuspendTime", "SecsPreSuspend",
            "NodeList", "BatchHost", "Restarts", "ExitCode"}
"""Fields that differ between any two jobs (ids, times, names), not by how they were sent.
A held job has no allocation yet, so NodeList says nothing either way."""


@pytest.fixture
def out_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gbroker-native-"))
    alice = pwd.getpwnam("alice")
    os.chown(path, alice.pw_uid, alice.pw_gid)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def backends(slurm_cluster: Any) -> tuple[CliBackend, CliBackend]:
    runner = Runner(bin_dir=os.environ.get("GBROKER_SLURM_BIN_DIR") or "/usr/bin")
    via_sbatch = CliBackend(runner, submit_with="sbatch")
    try:
        via_lib = CliBackend(runner, submit_with="libslurm")
    except ConfigError as exc:
        raise AssertionError(f"the libslurm module is not built for this Slurm: {exc} "
                             "(contrib/dev/setup builds it: python -m broker.slurm.native_build)") from None
    return via_sbatch, via_lib


def _request(out: Path, **kw: Any) -> SubmitRequest:
    base = SubmitRequest(
        script="#!/bin/bash\nenv | sort > \"$GB_OUT/env-$SLURM_JOB_ID\"\n".replace("$GB_OUT", str(out)),
        partition="owned", job_name=f"nat-{uuid.uuid4().hex[:6]}", comment="gbroker test", account="vision",
        user="alice", workdir=str(out), nodes=1, gpus_per_node=0, time_limit_s=300,
        output=str(out / "slurm-%j.out"),
    )
    return replace(base, **kw)


def _show(cluster: Any, job_id: int) -> dict[str, str]:
    text = cluster.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout
    return dict(re.findall(r"(\S+?)=(\S*)", text))


def _stored(cluster: Any, job_id: int) -> dict[str, str]:
    return {k: v for k, v in _show(cluster, job_id).items() if k not in VOLATILE}


REQUESTS = {
    "plain": {},
    "gpus of a type, cpus and memory per gpu": dict(gpus_per_node=2, gres_type="l4", cpus_per_gpu=1,
                                                    mem_per_gpu_mb=500),
    "memory per node, cpus per task, tasks, constraint": dict(mem_mb=1000, cpus_per_task=2, ntasks_per_node=2,
                                                             constraint="owned", gpus_per_node=1),
    "two nodes, no requeue, a warning signal": dict(nodes=2, requeue=False, signal="B:USR1@90"),
    "cpus per task on two nodes": dict(nodes=2, cpus_per_task=3),
    "an array": dict(array="1-5%2"),
}


@pytest.mark.parametrize("name", list(REQUESTS))
def test_a_held_job_is_stored_the_same_either_way(slurm_cluster: Any, backends: Any, out_dir: Path,
                                                  name: str) -> None:
    via_sbatch, via_lib = backends
    req = _request(out_dir, hold=True, **REQUESTS[name])
    a = via_sbatch.submit(req)
    b = via_lib.submit(req)
    try:
        assert b != a
        stored_a, stored_b = _stored(slurm_cluster, a), _stored(slurm_cluster, b)
        assert stored_a["UserId"].startswith("alice(")
        assert stored_b == stored_a
        # The comparison is not vacuous: the request's own fields are there.
        assert stored_b["Partition"] == "owned" and stored_b["Account"] == "vision"
        assert _show(slurm_cluster, b)["JobState"] == "PENDING" and _show(slurm_cluster, b)["Priority"] == "0"
    finally:
        slurm_cluster.run(["scancel", str(a), str(b)], check=False)


def _env(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    return dict(ln.split("=", 1) for ln in lines if "=" in ln)


def test_a_job_sees_the_same_environment_either_way(slurm_cluster: Any, backends: Any, out_dir: Path) -> None:
    via_sbatch, via_lib = backends
    req = _request(out_dir)
    ids = via_sbatch.submit(req), via_lib.submit(req)
    files = [out_dir / f"env-{i}" for i in ids]
    deadline = time.monotonic() + 60
    while not all(f.exists() and f.stat().st_size for f in files):
        assert time.monotonic() < deadline, f"the jobs did not run: {slurm_cluster.sinfo()}"
        time.sleep(0.5)
    time.sleep(0.3)  # the env listing is one write; let it finish
    env_a, env_b = (_env(f) for f in files)
    differ = {"SLURM_JOBID", "SLURM_JOB_ID", "SLURM_TASK_PID", "SLURM_JOB_NAME", "SLURMD_NODENAME",
              "HOSTNAME", "SLURM_NODELIST", "SLURM_JOB_NODELIST", "SLURM_TOPOLOGY_ADDR", "_"}
    assert {k: v for k, v in env_b.items() if k not in differ} == {k: v for k, v in env_a.items() if k not in differ}
    assert env_b["SLURM_JOB_NAME"] == req.job_name and env_b["USER"] == "alice"
    assert env_b["SLURM_SUBMIT_DIR"] == str(out_dir)
    owner = {f.stat().st_uid for f in files}
    assert owner == {pwd.getpwnam("alice").pw_uid}  # the job ran as alice, not as the daemon


def test_a_refusal_is_slurms_message_and_creates_no_job(slurm_cluster: Any, backends: Any, out_dir: Path) -> None:
    _, via_lib = backends
    before = slurm_cluster.run(["squeue", "-h", "-u", "alice", "-o", "%i"]).stdout.split()
    with pytest.raises(SlurmError) as info:
        via_lib.submit(_request(out_dir, partition="no-such-partition", hold=True))
    assert "Invalid partition name specified" in str(info.value)
    assert "Batch job submission failed" in info.value.stderr
    with pytest.raises(SlurmError) as info:
        via_lib.submit(_request(out_dir, account="climate", hold=True))  # alice is not in climate
    assert "account" in str(info.value).lower()
    assert slurm_cluster.run(["squeue", "-h", "-u", "alice", "-o", "%i"]).stdout.split() == before


CHILD = """
import sys
from broker.errors import SlurmUnavailable
from broker.slurm.backend import SubmitRequest
from broker.slurm.cli_backend import CliBackend
backend = CliBackend(submit_with="libslurm")
req = SubmitRequest(script="#!/bin/bash\\ntrue\\n", partition="owned", job_name="gb-dead", comment="", account=None,
                    user="alice", workdir="/tmp", nodes=1, gpus_per_node=0, time_limit_s=60)
try:
    backend.submit(req)
except SlurmUnavailable as exc:
    print("unavailable:", exc.stderr.strip())
    sys.exit(0)
sys.exit(1)
"""


def test_a_dead_controller_is_unavailable_not_a_refusal(slurm_cluster: Any, tmp_path: Path) -> None:
    """The daemon keeps the job and retries; a SlurmError would record it failed."""
    lines = []
    for line in Path(slurm_cluster.slurm_conf).read_text().splitlines():
        if line.startswith("SlurmctldPort="):
            line = "SlurmctldPort=16995"
        lines.append(line)
    (tmp_path / "slurm.conf").write_text("\n".join(lines) + "\n")
    shutil.copy(Path(slurm_cluster.slurm_conf).with_name("gres.conf"), tmp_path / "gres.conf")
    # sinfo --version answers without a controller, so the module is loaded; the RPC then fails.
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, SLURM_CONF=str(tmp_path / "slurm.conf")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Unable to contact slurm controller" in proc.stdout


def test_the_module_is_refused_for_another_release(slurm_cluster: Any) -> None:
    built = native.built_for()
    assert built is not None
    assert native.load(os.environ["SLURM_CONF"], f"slurm {built[0]}.{built[1]:02d}.3") is not None
    assert native.load(os.environ["SLURM_CONF"], "slurm 24.11.5") is None
    assert native.load(os.environ["SLURM_CONF"], "") is None
    assert native.load("/elsewhere/slurm.conf", f"slurm {built[0]}.{built[1]:02d}.3") is None  # one cluster a process
