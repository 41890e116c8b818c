"""Lightning 2.6 under gbroker, three attempts of examples/lightning_finetune.py.

1. No Slurm environment: the warning signal (SIGUSR1) would kill a plain
   Lightning run (no handler); with LightningCallback it saves
   ``hpc_ckpt_1.ckpt``, records it (reason "signal") and exits 75.
2. A Slurm environment (SLURM_NTASKS set, job name not bash/interactive), so
   Lightning's SLURMEnvironment and auto_requeue are on: SIGUSR1 makes
   Lightning save an hpc checkpoint and run ``scontrol requeue <job id>`` (a
   stand-in scontrol on PATH records the call), training goes on, and the
   SIGTERM Slurm then sends ends it with a save at the later step (none when
   no step ran since the last save) and exit 75.
3. Runs to the end, resuming from the manifest's checkpoint.

Every save is in the manifest with its step; each attempt resumes at the step
the previous one recorded last.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

from framework_jobs import REPO, result

EXAMPLE = str(REPO / "examples" / "lightning_finetune.py")
STEPS = 30


def _fake_scontrol(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "scontrol"
    script.write_text('#!/bin/sh\necho "$@" >> "$FAKE_SCONTROL_LOG"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return bindir


def test_lightning_saves_on_signals_and_resumes(ml_python, start_job, tmp_path):
    argv = [ml_python, EXAMPLE, "--steps", str(STEPS), "--every", "5"]
    ckpt = tmp_path / "ck"

    # 1: no Slurm; SIGUSR1 after the first periodic save.
    job = start_job(argv, 1)
    first = job.wait_for_save(5, attempt=1)
    assert first["framework"] == "lightning" and first["reason"] == "save"
    assert first["path"].startswith(str(ckpt / "checkpoints")) and os.path.exists(first["path"])
    job.signal(signal.SIGUSR1)
    assert job.finish() == 75, job.output()
    m1 = job.manifest()
    assert m1 is not None and m1["reason"] == "signal" and m1["attempt"] == 1
    assert m1["path"] == str(ckpt / "hpc_ckpt_1.ckpt") and os.path.exists(m1["path"])
    assert m1["step"] >= first["step"] and m1["seq"] > first["seq"] and m1["saved_at"] > first["saved_at"]
    r1 = result(tmp_path, "lightning-result.json")["attempts"][-1]
    assert r1["stopped_by_signal"] and r1["resumed_from_step"] == 0

    # 2: Slurm environment; Lightning's own requeue handler takes SIGUSR1.
    requeues = tmp_path / "scontrol.log"
    slurm = {
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "gbroker-42", "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_NODELIST": "spot1", "SLURM_RESTART_COUNT": "1",
        "FAKE_SCONTROL_LOG": str(requeues),
        "PATH": f"{_fake_scontrol(tmp_path)}:{os.environ['PATH']}",
    }
    job = start_job(argv, 2, **slurm)
    job.wait_for_output("SLURM auto-requeueing enabled")
    resumed = job.wait_for_save(m1["step"] + 5, attempt=2)
    job.signal(signal.SIGUSR1)
    job.wait_until("scontrol requeue", lambda: requeues.exists() and "requeue 4242" in requeues.read_text())
    hpc = job.manifest()
    assert hpc is not None and hpc["path"].endswith("hpc_ckpt_2.ckpt") and hpc["reason"] == "signal"
    later = job.wait_for_save(hpc["step"] + 1, attempt=2)  # training goes on after the requeue, and saves
    job.signal(signal.SIGTERM)  # what Slurm sends when it ends the requeued run
    assert job.finish() == 75, job.output()
    m2 = job.manifest()
    assert m2 is not None and m2["attempt"] == 2 and m2["step"] >= later["step"] > hpc["step"] >= resumed["step"]
    if m2["step"] > later["step"]:  # it trained on after that save: SIGTERM saved once more
        assert m2["reason"] == "signal" and m2["path"].endswith("hpc_ckpt_3.ckpt"), m2
    else:  # SIGTERM came before the next step (a slow machine): that save is the resume point, not saved again
        assert m2["seq"] == later["seq"] and m2["reason"] == "save", m2
    r2 = result(tmp_path, "lightning-result.json")["attempts"][-1]
    assert r2["resumed_from_step"] == m1["step"] and r2["resumed_from"] == m1["path"]

    # 3: to the end.
    job = start_job(argv, 3)
    assert job.finish() == 0, job.output()
    final = result(tmp_path, "lightning-result.json")
    assert [a["attempt"] for a in final["attempts"]] == [1, 2, 3]
    assert final["attempts"][-1]["resumed_from_step"] == m2["step"]
    assert final["finished"] and final["final_step"] == STEPS
    m3 = job.manifest()
    assert m3 is not None and m3["attempt"] == 3 and m3["step"] == STEPS and m3["reason"] == "save"
