"""Run the fine-tuning examples with the real frameworks, without Slurm.

The test runner's venv has no torch: every framework run is a subprocess of
the fine-tuning venv (/opt/gbroker/venv-ml, or GBROKER_ML_VENV), made by
contrib/dev/setup-ml. Without it the tests fail and say so; nothing is skipped.

A job's environment is what gbroker's batch script gives it (GBROKER_* and,
where a test says so, SLURM_*); PYTHONPATH points at this checkout so the
code under test is this checkout's whatever the venv was built from.
Signals are real (os.kill / os.killpg), sent when the job's manifest shows
the save a test waits for: no sleeps tuned to the machine's speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
ML_VENV = Path(os.environ.get("GBROKER_ML_VENV", "/opt/gbroker/venv-ml"))
ML_PYTHON = ML_VENV / "bin" / "python"
STEP_SECONDS = "0.25"
TIMEOUT_S = 120.0


@pytest.fixture(scope="session")
def ml_python() -> str:
    """The fine-tuning venv's python, checked once: it must import every framework."""
    if not os.access(ML_PYTHON, os.X_OK):
        pytest.fail(f"{ML_PYTHON} not found: run contrib/dev/setup-ml (as root) to build the fine-tuning venv")
    probe = subprocess.run(
        [str(ML_PYTHON), "-c", "import torch, lightning, transformers, accelerate"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    if probe.returncode != 0:
        pytest.fail(f"{ML_PYTHON} cannot import the frameworks; run contrib/dev/setup-ml (as root):\n{probe.stderr[-2000:]}")
    return str(ML_PYTHON)


def job_env(ckpt_dir: Path, attempt: int, **extra: str) -> dict[str, str]:
    """The environment of one attempt, as gbroker's batch script sets it (no SLURM_* unless given)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GBROKER_", "PET_"))}
    env.update(
        GBROKER_JOB_ID="42",
        GBROKER_ATTEMPT=str(attempt),
        GBROKER_CHECKPOINT_DIR=str(ckpt_dir),
        FINETUNE_STEP_SECONDS=STEP_SECONDS,
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
    )
    if attempt > 1:
        env["GBROKER_RESUME_FROM"] = str(ckpt_dir)
    env.update(extra)
    return env


@dataclass
class Job:
    """One attempt running in its own session (so the whole group can be signalled, as gbroker does)."""

    proc: subprocess.Popen[bytes]
    log: Path
    ckpt_dir: Path
    sent: list[str] = field(default_factory=list)

    def manifest(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.ckpt_dir / "gbroker-checkpoint.json").read_text())
        except (OSError, ValueError):
            return None

    def wait_until(self, what: str, check: Callable[[], bool], timeout: float = TIMEOUT_S) -> None:
        end = time.monotonic() + timeout
        while not check():
            if self.proc.poll() is not None:
                pytest.fail(f"the job ended ({self.proc.returncode}) before {what}:\n{self.output()}")
            if time.monotonic() > end:
                self.kill()
                pytest.fail(f"timed out waiting for {what}:\n{self.output()}")
            time.sleep(0.1)

    def wait_for_save(self, min_step: int, attempt: int) -> dict[str, Any]:
        def saved() -> bool:
            m = self.manifest()
            return bool(m and m.get("attempt") == attempt and int(m.get("step", -1)) >= min_step)

        self.wait_until(f"a save at step >= {min_step} in attempt {attempt}", saved)
        manifest = self.manifest()
        assert manifest is not None
        return manifest

    def wait_for_output(self, text: str) -> None:
        self.wait_until(f"{text!r} in the output", lambda: text in self.output())

    def signal(self, sig: int, *, group: bool = False) -> None:
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)
        self.sent.append(f"{signal.Signals(sig).name} to {'group' if group else 'pid'}")

    def finish(self, timeout: float = TIMEOUT_S) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the job did not end within {timeout} s after {self.sent}:\n{self.output()}")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-6000:]
        except OSError:
            return "(no output)"


@pytest.fixture
def start_job(tmp_path: Path) -> Iterator[Callable[..., Job]]:
    """Start an attempt: argv, the attempt number, extra environment; cwd is the test's directory."""
    jobs: list[Job] = []

    def start(argv: list[str], attempt: int, **extra: str) -> Job:
        log = tmp_path / f"attempt-{attempt}.log"
        env = job_env(tmp_path / "ck", attempt, **extra)
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        job = Job(proc, log, tmp_path / "ck")
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        if job.proc.poll() is None:
            job.kill()


def result(tmp_path: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((tmp_path / name).read_text())
    return data
