"""Fine-tuning as researchers run it, under gbroker, on the real dev cluster with the real frameworks.

Five jobs at once, each a real framework in /opt/gbroker/venv-ml (tiny models,
CPU, steps paced at 0.25 s): Lightning left to gbroker's callback, Lightning
with its own Slurm auto-requeue, the Hugging Face Trainer, plain DDP under
torchrun, and a bash job script around torchrun. Each is reclaimed once on
spot (its node vanishes) and runs into its 3-minute time limit, whose warning
is asked for a minute before (Slurm checks time limits every 30 s and may send
it up to a minute earlier still: never before the frameworks are up, here, on
a busy machine); each must go on from its checkpoints to the end:

* every job completes, its own result file showing each attempt resumed from
  a checkpoint, none starting over;
* the reclaim is the only reclaim counted; a continuation (a self-requeue, or
  exit 75 after saving) is an attempt of its own, neither a reclaim nor a
  failure; no attempt lasts 0 seconds or ends before it starts;
* for Lightning and the HF Trainer, the work billed as lost to the reclaim
  is within one checkpoint interval of the steps the framework really redid.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from broker_fixtures import SRC, BrokerDaemon, broker_daemon, public_dir, user_dir  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm

PY = "/opt/gbroker/venv-ml/bin/python"
STEP_S = 0.25
EVERY = 20
"""Steps between checkpoints: 5 s of work."""
STEPS = 560
"""140 s of training: more than a run after the reclaim can do before its warning (at most 120 s in)."""


def job_file(work: Path, name: str, command: list[str], gpus: int = 1) -> Path:
    text = "\n".join([
        f'name = "{name}"', 'kind = "finetune"', 'group = "vision"', f"gpus_per_node = {gpus}",
        'time_limit = "3m"', "signal_lead_s = 60", 'partition = "spot"',
        "command = [" + ", ".join(f'"{c}"' for c in command) + "]",
        'env = { FINETUNE_STEP_SECONDS = "0.25", OMP_NUM_THREADS = "1", PYTHONWARNINGS = "ignore" }',
        "[checkpoint]", 'style = "signal"', f'dir = "{work / name}-ck"', "",
    ])
    path = work / f"{name}.toml"
    path.write_text(text)
    return path


def jobs_to_run(work: Path) -> dict[str, Path]:
    ex = work / "examples"
    common = ["--steps", str(STEPS), "--every", str(EVERY)]
    torchrun = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    return {
        "lightning": job_file(work, "lightning", [PY, str(ex / "lightning_finetune.py"), *common,
                                                  "--no-auto-requeue", "--out", str(work / "lightning.json")]),
        "lightning-requeue": job_file(work, "lightning-requeue", [PY, str(ex / "lightning_finetune.py"), *common,
                                                                  "--auto-requeue",
                                                                  "--out", str(work / "lightning-requeue.json")]),
        "hf": job_file(work, "hf", [PY, str(ex / "hf_finetune.py"), *common, "--out", str(work / "hf.json")]),
        "torchrun": job_file(work, "torchrun", [*torchrun, str(ex / "torchrun_finetune.py"), *common,
                                                "--out", str(work / "torchrun.json")], gpus=2),
        "bash": job_file(work, "bash", ["/bin/bash", str(ex / "finetune_job.sh"), *common,
                                        "--out", str(work / "bash.json")], gpus=2),
    }


def steps_in(log: str) -> list[int]:
    return [int(m) for m in re.findall(r"^step (\d+)$", log, re.M)]


def seconds(a: dict[str, Any]) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(a["ended_at"]) - datetime.fromisoformat(a["started_at"])).total_seconds()


def test_lightning_hf_torchrun_and_a_job_script_survive_a_reclaim_and_their_time_limit(broker_daemon, slurm_cluster):
    d = broker_daemon
    work = user_dir(public_dir("gbroker-ft-"), "alice")
    # Jobs run in alice's directory (SLURM_SUBMIT_DIR), where the job script finds examples/.
    (work / "examples").symlink_to(SRC / "examples")
    ids = {}
    for name, path in jobs_to_run(work).items():
        r = d.cli("submit", "--json", str(path), cwd=work)
        assert r.code == 0, r.err
        ids[name] = r.json()["id"]

    def log_of(job: dict[str, Any]) -> str:
        return Path(job["log"]).read_text(errors="replace") if job.get("log") else ""

    # Reclaim every node that runs a first attempt once each job has saved twice there.
    def first_attempts_saved() -> dict[str, dict[str, Any]] | None:
        shown = {n: d.show(i) for n, i in ids.items()}
        for job in shown.values():
            a = job["attempts"][0]
            if a["state"] != "running" or max(steps_in(log_of(job)), default=0) < 2 * EVERY + 2:
                return None
        return shown

    try:
        shown = slurm_cluster.wait_for(first_attempts_saved, timeout=420, interval=2,
                                       what="every job past two saves")
    except AssertionError:
        for name, job_id in ids.items():
            job = d.show(job_id)
            print(f"--- {name}: {job['state']} ({job['reason']}) attempts "
                  f"{[(a['state'], a['nodes']) for a in job['attempts']]}\n{log_of(job)[-3000:]}")
        raise
    nodes = sorted({job["attempts"][0]["nodes"] for job in shown.values()})
    reclaimed_at = {}
    for node in nodes:
        slurm_cluster.reclaim(node)
        reclaimed_at[node] = time.time()

    done = {}
    for name, job_id in ids.items():
        done[name] = d.wait_job(job_id, lambda j: j["state"] in ("completed", "failed", "cancelled", "timeout"),
                                timeout=600)
    problems = []
    for name, job in done.items():
        states = [a["state"] for a in job["attempts"]]
        events = "\n".join(f"  {e['at']} {e['kind']}: {e['message']}" for e in job["events"])
        if job["state"] != "completed":
            problems.append(f"{name}: {job['state']} ({job['reason']}), attempts {states}\n{events}\n"
                            f"  the job's log, its end:\n{log_of(job)[-4000:]}")
            continue
        if job["reclaims"] != 1 or job["failures"] != 0 or "reclaimed" not in states or "continued" not in states:
            sids = sorted({str(a["slurm_job_id"]) for a in job["attempts"]})
            rows = [slurm_cluster.sacct_attempts(sid, "JobID,State,Start,End,ExitCode,Reason") for sid in sids]
            problems.append(f"{name}: reclaims {job['reclaims']}, failures {job['failures']}, attempts {states}\n"
                            f"{events}\n  sacct: {rows}\n  the job's log, its end:\n{log_of(job)[-4000:]}")
        for a in job["attempts"]:
            if not a["started_at"] or not a["ended_at"] or seconds(a) <= 0:
                problems.append(f"{name}: attempt {a['number']} ({a['state']}) from {a['started_at']} to "
                                f"{a['ended_at']}\n{events}")
    assert not problems, "\n".join(problems)

    for name in done:
        result = json.loads((work / f"{name}.json").read_text())
        assert result["finished"] and result["final_step"] == STEPS, (name, result)
        later = result["attempts"][1:]
        assert later and all(a["resumed_from_step"] > 0 for a in later), (name, result)

    # Lost work billed for the reclaim = what the framework really redid, within one checkpoint interval.
    for name in ("lightning", "lightning-requeue", "hf"):
        job = done[name]
        log = log_of(job)
        runs = re.split(r"^=== gbroker: job \S+ attempt \d+ starts.*$", log, flags=re.M)[1:]
        reached = max(steps_in(runs[0]))                      # the last step attempt 1 finished
        resumed = int(re.search(r"starting at step (\d+)", runs[1]).group(1))  # type: ignore[union-attr]
        redone_s = (reached - resumed) * STEP_S
        lost_s = job["attempts"][0]["lost_s"]
        assert abs(lost_s - redone_s) <= EVERY * STEP_S + 1, (
            f"{name}: billed {lost_s}s lost, the framework redid {redone_s:.1f}s "
            f"(steps {resumed}..{reached})"
        )
