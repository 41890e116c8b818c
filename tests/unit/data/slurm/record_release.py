"""Record a whole set of Slurm outputs from one release's dev cluster, with record.py.

Makes the situations the parsers must read on a running dev cluster of its own
(`contrib/slurm/devcluster up --slurm 24.11`), one after another, and records
squeue/sacct/sinfo in each with record.py into ``<this dir>/<version>/``::

    eval "$(GBROKER_DEVCLUSTER_DIR=/tmp/gbdc-2411 contrib/slurm/devcluster env)"
    PYTHONPATH=. python tests/unit/data/slurm/record_release.py 24.11

The scenarios (each ``<scenario>.<command>.txt`` and ``.argv``):

| scenario    | what is happening                                                        |
|-------------|--------------------------------------------------------------------------|
| configuring | a job on a powered-down cloud node that is booting; a held job; a failed |
|             | job and alice's completed one on an owned node                            |
| requeued    | that job requeued by `scontrol requeue`: PENDING, BeginTime, Restarts=1   |
| preempted   | the job preempted by an `urgent` job on its node (PREEMPTED row)          |
| reclaimed   | the job's node reclaimed (`devcluster reclaim --keep-down`): NODE_FAIL,    |
|             | the node DOWN with reason "reclaimed"                                     |
| drained     | a powered-down node drained by hand, with its reason                      |

Takes 2 to 3 minutes (a cloud node boots twice). Needs root (jobs as alice).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[3]
DEVCLUSTER = REPO / "contrib" / "slurm" / "devcluster"
sys.path.insert(0, str(HERE))

import record  # noqa: E402


def slurm(*argv: str, user: str | None = None, check: bool = True) -> str:
    full = list(argv)
    if user:
        full = ["runuser", "-u", user, "--", *full]
    proc = subprocess.run(full, capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(full)} failed: {proc.stderr.strip()}")
    return proc.stdout


def sbatch(*args: str, user: str | None = None) -> int:
    return int(slurm("sbatch", "--parsable", *args, user=user).strip().split(";")[0])


def job(job_id: int, field: str) -> str:
    out = slurm("scontrol", "-o", "show", "job", str(job_id), check=False)
    for word in out.split():
        if word.startswith(f"{field}="):
            return word.split("=", 1)[1]
    return ""


def sacct_states(job_id: int) -> list[str]:
    out = slurm("sacct", "-n", "-P", "-X", "--duplicates", "-j", str(job_id), "-o", "State")
    return [ln.strip() for ln in out.splitlines() if ln.strip()]


def wait(what: str, pred: Callable[[], bool], timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def main(version: str) -> None:
    out = HERE / version
    shutil.rmtree(out, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="gbrec-", dir="/tmp"))
    os.chmod(work, 0o777)
    log = ["-o", f"{work}/%j.out"]

    def rec(name: str, *what: str) -> None:
        record.main(["--out", str(out), name, *what])
        print(f"recorded {name}", flush=True)

    run = sbatch("-p", "spot", "-w", "spot1", "--gres=gpu:1", "-J", "gbrec-run", "--comment",
                 "gbk:rec1:0", "-t", "5", *log, "--wrap", "sleep 600")
    held = sbatch("--hold", "-p", "owned", "-J", "gbrec-held", "-t", "5", *log, "--wrap", "true")
    failed = sbatch("-p", "owned", "-w", "own1", "-J", "gbrec-fail", "-t", "5", *log, "--wrap", "exit 3")
    mine = sbatch("-p", "owned", "-w", "own2", "-A", "vision", "-J", "gbrec-alice|a b", "-t", "5",
                  "-o", f"{work}/alice-%j.out", "--wrap", "true", user="alice")
    wait("the cloud job to be CONFIGURING", lambda: job(run, "JobState") == "CONFIGURING", 30)
    wait("the owned jobs to end", lambda: sacct_states(failed) == ["FAILED"]
         and sacct_states(mine) == ["COMPLETED"], 60)
    rec("configuring")

    wait("the cloud job to run", lambda: job(run, "JobState") == "RUNNING")
    slurm("scontrol", "requeue", str(run))
    wait("the requeue", lambda: job(run, "JobState") == "PENDING" and job(run, "Restarts") == "1", 60)
    rec("requeued")

    slurm("scontrol", "update", f"jobid={run}", "StartTime=now")
    wait("the requeued job to run again", lambda: job(run, "JobState") == "RUNNING")
    urgent = sbatch("-p", "urgent", "-w", "spot1", "--gres=gpu:4", "-J", "gbrec-urgent", "-t", "5",
                    *log, "--wrap", "sleep 5")
    wait("the preemption", lambda: "PREEMPTED" in sacct_states(run), 60)
    wait("the urgent job to run", lambda: job(urgent, "JobState") in ("RUNNING", "COMPLETED", ""), 60)
    rec("preempted")

    wait("the urgent job to end", lambda: sacct_states(urgent) == ["COMPLETED"], 90)
    wait("the preempted job back in the queue", lambda: job(run, "JobState") == "PENDING", 60)
    slurm("scontrol", "update", f"jobid={run}", "StartTime=now")
    wait("the preempted job to run again", lambda: job(run, "JobState") == "RUNNING")
    subprocess.run([str(DEVCLUSTER), "reclaim", "spot1", "--keep-down"], check=True,
                   capture_output=True, timeout=120)
    wait("the reclaim in sacct", lambda: "NODE_FAIL" in sacct_states(run), 60)
    rec("reclaimed")

    slurm("scancel", str(run), str(held))
    slurm("scontrol", "update", "nodename=spot1", "state=POWER_DOWN_FORCE")
    slurm("scontrol", "update", "nodename=od2", "state=DRAIN", "reason=gbrec maintenance")
    rec("drained", "sinfo")
    slurm("scontrol", "update", "nodename=od2", "state=UNDRAIN")
    shutil.rmtree(work, ignore_errors=True)
    print(f"set {version} in {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: record_release.py VERSION   (e.g. 24.11)")
    main(sys.argv[1])
