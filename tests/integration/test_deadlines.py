"""Deadlines on the real dev cluster: the policy's safety net moves a job to on-demand in time.

Both tests run the `greedy` policy (spot whenever it is there), so every move
is the shared safety net's, not a cost judgement.
"""

from __future__ import annotations

import time

import pytest

from broker_fixtures import broker_daemon  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm


def _running_on(job: dict) -> str:
    return job["attempts"][-1]["nodes"]


def test_deadline_job_waiting_for_spot_falls_back_to_ondemand(broker_daemon, slurm_cluster):
    """Spot is full; a deadline job waits there until the policy's safety net moves it to on-demand."""
    d = broker_daemon
    d.stop()
    d.start(GBROKER_POLICY="greedy")  # spot whenever it is there; the safety net decides the move
    fillers = []
    try:
        for _ in slurm_cluster.spot_nodes:
            out = slurm_cluster.run(["sbatch", "--parsable", "-p", "spot", "-A", "vision", "--gres=gpu:4",
                                     "-t", "10", "-o", "/dev/null", "--wrap", "sleep 400"]).stdout
            fillers.append(out.strip().split(";")[0])
        slurm_cluster.wait_for(
            lambda: all(slurm_cluster.job_field(j, "JobState") == "RUNNING" for j in fillers), 180,
            what="spot filled by four 4-GPU jobs",
        )
        # Work 3 min, 100 s of slack: it waits on spot until the slack is about the changeover.
        deadline = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(time.time() + 280))
        r = d.cli("submit", "--json", "--group", "vision", "--time", "3m", "--deadline", deadline,
                  "--name", "due-soon", "--", "sleep", "5")
        assert r.code == 0, r.err
        job_id = r.json()["id"]
        assert r.json()["capacity"] == "spot"
        job = d.wait_job(job_id, lambda j: j["capacity"] == "ondemand", timeout=150)
        assert job["state"] in ("pending", "running"), job
        assert any(e["kind"] == "fallback" for e in job["events"]), job["events"]
        job = d.wait_job(job_id, lambda j: j["state"] == "completed", timeout=200)
        assert [a["partition"] for a in job["attempts"]] == ["ondemand"]
        assert _running_on(job).startswith("od")
        ended = job["attempts"][-1]["ended_at"]
        assert ended <= deadline.replace("+00:00", "Z"), (ended, deadline)
    finally:
        if fillers:
            slurm_cluster.run(["scancel", *fillers], check=False)


def test_deadline_job_running_on_spot_is_moved_to_ondemand_before_a_reclaim_could_cost_the_deadline(
        broker_daemon, slurm_cluster):
    """The policy is asked at every tick while the job runs (as in the simulator), not only after a reclaim.

    Work 2 min, deadline in 3.75 min, changeover 1 min: once less than 3 min are
    left (after about 45 s), a reclaim would leave too little time for
    a rerun on on-demand, so gbroker requeues the job there while it still
    fits. No reclaim happens. (The program itself ends at once on on-demand:
    what is tested is the move, not a rerun's length.)
    """
    d = broker_daemon
    d.stop()
    d.start(GBROKER_POLICY="greedy")
    work_s = 120
    deadline_ts = time.time() + 225
    deadline = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(deadline_ts))
    r = d.cli("submit", "--json", "--group", "vision", "--time", "2m", "--deadline", deadline,
              "--name", "due-later", "--", "bash", "-c",  # no checkpoints: ignores the warning
              "trap '' USR1; if [ \"$SLURM_JOB_PARTITION\" = ondemand ]; then sleep 2; else sleep 100; fi")
    assert r.code == 0, r.err
    job_id = r.json()["id"]
    assert r.json()["capacity"] == "spot"
    d.wait_job(job_id, lambda j: j["state"] == "running", timeout=140)
    job = d.wait_job(job_id, lambda j: j["capacity"] == "ondemand", timeout=200)
    first = job["attempts"][0]
    assert first["capacity"] == "spot" and first["started_at"] and first["nodes"].startswith("spot"), job
    assert any(e["kind"] == "fallback" and "running on spot; requeued to ondemand" in e["message"]
               for e in job["events"]), job["events"]
    job = d.wait_job(job_id, lambda j: j["state"] == "completed", timeout=400)
    assert [(a["capacity"], a["state"]) for a in job["attempts"]] == [("spot", "moved"), ("ondemand", "completed")]
    assert job["reclaims"] == 0
    assert _running_on(job).startswith("od")
    # Moved while the whole job still fitted on on-demand before the deadline.
    moved = job["attempts"][0]["ended_at"]
    moved_ts = time.mktime(time.strptime(moved.replace("Z", "").split(".")[0], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    assert deadline_ts - moved_ts >= work_s, (moved, deadline)
    # Slurm saw one job: a requeued run on spot, then the run on on-demand.
    sid = str(job["attempts"][0]["slurm_job_id"])
    assert job["attempts"][1]["slurm_job_id"] == job["attempts"][0]["slurm_job_id"]
    runs = slurm_cluster.run(["sacct", "-X", "-n", "-P", "--duplicates", "-j", sid, "-o", "State,Partition"]).stdout
    assert [line.split("|") for line in runs.split()] == [["REQUEUED", "spot"], ["COMPLETED", "ondemand"]], runs
