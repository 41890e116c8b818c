"""torchrun with 2 gloo workers under gbroker: examples/torchrun_finetune.py over three attempts.

1. Through examples/finetune_job.sh (bash, cd to the submit directory, with
   nothing in it for gbroker) inside gbroker's real batch script, SIGUSR1
   sent to the batch shell as Slurm's --signal=B:USR1 does: the batch script
   sends it to the job's process group; bash dies of it, torchrun passes it
   to its workers (PET_SIGNALS_TO_HANDLE, set by the batch script), rank 0
   saves, the workers exit 75, torchrun exits 1; the batch script waits for
   the whole group and, seeing the save's mark for this attempt, ends 75.
2. torchrun alone, SIGTERM to the launcher: it forwards SIGTERM to the
   workers, they save and exit 75, torchrun exits 1; the manifest says
   "signal" for this attempt.
3. To the end, resuming at the step attempt 2 recorded.
"""

from __future__ import annotations

import signal
import subprocess

from broker.slurm.script import render_batch_script
from framework_jobs import REPO, job_env, result

EXAMPLE = str(REPO / "examples" / "torchrun_finetune.py")
JOB_SCRIPT = str(REPO / "examples" / "finetune_job.sh")
STEPS = 30


def test_torchrun_workers_save_on_forwarded_signals_and_resume(ml_python, start_job, tmp_path):
    out = str(tmp_path / "torchrun-result.json")
    args = ["--steps", str(STEPS), "--every", "5", "--out", out]
    torchrun = [ml_python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", EXAMPLE, *args]

    batch = tmp_path / "batch.sh"
    batch.write_text(render_batch_script(job_id="42", attempt=1, checkpoint_dir=str(tmp_path / "ck"),
                                         command=["/bin/bash", JOB_SCRIPT, *args], warning_signal_s=60))
    job = start_job(["/bin/bash", str(batch)], 1, SLURM_SUBMIT_DIR=str(REPO), GBROKER_ML_PYTHON=ml_python)
    job.wait_for_save(5, attempt=1)
    job.signal(signal.SIGUSR1)  # to the batch shell only, as Slurm sends it
    assert job.finish() == 75, job.output()
    assert "SIGUSR1 (time-limit warning) sent to the job" in job.output()
    assert "the program saved and asks to go on in a new run" in job.output()
    m1 = job.manifest()
    assert m1 is not None and m1["reason"] == "signal" and m1["attempt"] == 1 and m1["framework"] == "torch"
    r1 = result(tmp_path, "torchrun-result.json")["attempts"][-1]
    assert r1["stopped_by_signal"] and r1["last_step"] == m1["step"]

    job = start_job(torchrun, 2)
    job.wait_for_save(m1["step"] + 5, attempt=2)
    job.signal(signal.SIGTERM)
    assert job.finish() == 1, job.output()  # torchrun hides the workers' 75
    assert "Sending process" in job.output() and "closing signal SIGTERM" in job.output()
    m2 = job.manifest()
    assert m2 is not None and m2["reason"] == "signal" and m2["attempt"] == 2
    asked = subprocess.run([ml_python, "-m", "broker.checkpoint", "stopped-on-signal"],
                           env=job_env(tmp_path / "ck", 2), check=False)
    assert asked.returncode == 0
    r2 = result(tmp_path, "torchrun-result.json")["attempts"][-1]
    assert r2["resumed_from_step"] == m1["step"] and r2["resumed_from"] == m1["path"]

    job = start_job(torchrun, 3)
    assert job.finish() == 0, job.output()
    final = result(tmp_path, "torchrun-result.json")
    assert [a["attempt"] for a in final["attempts"]] == [1, 2, 3]
    assert final["attempts"][-1]["resumed_from_step"] == m2["step"]
    assert final["finished"] and final["final_step"] == STEPS
    asked = subprocess.run([ml_python, "-m", "broker.checkpoint", "stopped-on-signal"],
                           env=job_env(tmp_path / "ck", 3), check=False)
    assert asked.returncode == 1
