"""The broker core on the real dev cluster: submit, track, reclaim, resume, crash, outage."""

from __future__ import annotations

import json
import sys
import subprocess
import time

import pytest

from broker_fixtures import SRC, broker_daemon, public_dir, start_controller, stop_controller, user_dir  # noqa: F401  (fixture)

pytestmark = pytest.mark.slurm


def _squeue_names(env: dict[str, str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], env=env, capture_output=True, text=True, check=True)
    return out.stdout.split()


def _running_on(job: dict) -> str:
    return job["attempts"][-1]["nodes"]


@pytest.mark.contract  # a core end-to-end proof: runs on every Slurm release
def test_checkpointing_finetune_survives_two_reclaims(broker_daemon, slurm_cluster):
    d = broker_daemon
    base = user_dir(public_dir("gbroker-ft-"), "alice")
    ck, out = base / "ck", base / "result.json"
    r = d.cli(
        "submit", "--json", "--group", "vision", "--kind", "finetune", "--gpus", "1", "--time", "30m",
        "--checkpoint-dir", str(ck), "--checkpoint-style", "signal", "--name", "ft-reclaim",
        "--", "python3", str(SRC / "examples" / "finetune.py"),
        "--steps", "30", "--step-seconds", "1", "--every", "1", "--out", str(out),
    )
    assert r.code == 0, r.err
    job_id = r.json()["id"]
    assert r.json()["capacity"] == "spot"

    def manifest_step() -> int:
        try:
            m = json.loads((ck / "gbroker-checkpoint.json").read_text())
            return json.loads((ck / m["file"]).read_text())["step"]
        except (OSError, ValueError, KeyError):
            return -1

    for n in (1, 2):
        job = d.wait_job(job_id, lambda j, n=n: j["state"] == "running" and len(j["attempts"]) == n, timeout=180)
        node = _running_on(job)
        before = manifest_step()
        deadline = time.monotonic() + 60
        while manifest_step() < before + 4 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert manifest_step() >= before + 4, "the job did not make progress before the reclaim"
        slurm_cluster.reclaim(node)

    job = d.wait_job(job_id, lambda j: j["state"] == "completed", timeout=300)
    outcomes = [a["state"] for a in job["attempts"]]
    assert outcomes == ["reclaimed", "reclaimed", "completed"], job
    assert all(a["capacity"] == "spot" for a in job["attempts"])
    result = json.loads(out.read_text())
    assert result["step"] == 30
    starts = [a["from_step"] for a in result["attempts"]]
    assert [a["attempt"] for a in result["attempts"]] == [1, 2, 3]  # GBROKER_ATTEMPT follows the requeues
    assert len(starts) == 3 and starts[0] == 0
    assert 0 < starts[1] < starts[2] < 30, f"did not resume from checkpoints: {starts}"
    # Lost work is accounted per reclaimed attempt, and small thanks to the 1 s checkpoints.
    assert all(a["lost_s"] is not None and a["lost_s"] <= 10 for a in job["attempts"][:2]), job["attempts"]
    shown = d.cli("show", str(job_id))
    assert shown.code == 0 and shown.out.count("reclaimed") >= 2


def test_non_interruptible_job_runs_on_ondemand_untouched(broker_daemon, slurm_cluster):
    d = broker_daemon
    base = user_dir(public_dir("gbroker-od-"), "carol")
    r = d.cli(
        "submit", "--json", "--group", "climate", "--kind", "simulation", "--gpus", "4",
        "--no-interruptible", "--time", "10m", "--", "sh", "-c", "while [ ! -e go ]; do sleep 0.2; done",
        user="carol", cwd=base,
    )  # runs until the test says go, after the reclaim beside it
    assert r.code == 0, r.err
    od_id = r.json()["id"]
    assert (r.json()["capacity"], r.json()["partition"]) == ("ondemand", "ondemand")
    # A spot job beside it, whose node gets reclaimed while both run.
    r = d.cli("submit", "--json", "--group", "climate", "--time", "10m", "--", "sleep", "300", user="carol", cwd=base)
    assert r.code == 0, r.err
    spot_id = r.json()["id"]
    assert r.json()["capacity"] == "spot"
    od = d.wait_job(od_id, lambda j: j["state"] == "running", user="carol")
    assert _running_on(od).startswith("od")
    spot = d.wait_job(spot_id, lambda j: j["state"] == "running", user="carol")
    slurm_cluster.reclaim(_running_on(spot))
    d.wait_job(spot_id, lambda j: j["reclaims"] == 1, user="carol", timeout=60)
    assert d.show(od_id, user="carol")["state"] == "running", "the on-demand job ended before the reclaim"
    (base / "go").touch()
    od = d.wait_job(od_id, lambda j: j["state"] == "completed", timeout=120, user="carol")
    assert [a["state"] for a in od["attempts"]] == ["completed"]
    assert od["reclaims"] == 0 and od["attempts"][0]["partition"] == "ondemand"
    assert d.cli("cancel", str(spot_id), user="carol", cwd=base).code == 0


def test_cancel_by_name_cancels_those_jobs_in_slurm_and_only_the_callers(broker_daemon, slurm_cluster):
    d = broker_daemon
    bob_dir = user_dir(public_dir("gbroker-bob-"), "bob")
    jobs = {}
    for name, user, cwd in (("sweep-a", "alice", None), ("sweep-b", "alice", None), ("keep", "alice", None),
                            ("sweep-bob", "bob", bob_dir)):
        r = d.cli("submit", "--json", "--group", "vision", "--name", name, "--time", "10m", "--", "sleep", "300",
                  user=user, cwd=cwd)
        assert r.code == 0, r.err
        jobs[name] = r.json()
    r = d.cli("cancel", "--name", "sweep-*")
    assert r.code == 0 and sorted(r.out.splitlines()) == sorted(
        f"Job {jobs[n]['id']}: cancelled" for n in ("sweep-a", "sweep-b")), r
    for name in ("sweep-a", "sweep-b"):
        slurm_id = str(jobs[name]["slurm_job_id"])
        slurm_cluster.wait_for(lambda sid=slurm_id: slurm_cluster.job_field(sid, "JobState") in ("CANCELLED", ""),
                               timeout=30, what=f"Slurm job {slurm_id} cancelled")
    for name, user in (("keep", "alice"), ("sweep-bob", "bob")):
        assert d.show(jobs[name]["id"], user=user)["state"] in ("pending", "running")
        state = slurm_cluster.job_field(str(jobs[name]["slurm_job_id"]), "JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), (name, state)
    r = d.cli("cancel", "--all", user="bob", cwd=bob_dir)
    assert r.code == 0 and r.out.strip() == f"Job {jobs['sweep-bob']['id']}: cancelled", r
    assert ok_json(d.cli("status", "--json"))[0]["name"] == "keep"
    assert d.cli("cancel", "--all").code == 0 and ok_json(d.cli("status", "--json")) == []


@pytest.mark.contract  # a core end-to-end proof: runs on every Slurm release
def test_crash_after_sbatch_adopts_and_never_submits_twice(broker_daemon, slurm_cluster):
    d = broker_daemon
    d.stop()
    d.start(GBROKER_CRASH_AT="after_sbatch")
    # The client's answer is lost with the daemon; it retries with the same key (in the background).
    cli = d.cli_background("submit", "--json", "--group", "vision", "--name", "crashy", "--time", "10m",
                           "--", "sleep", "20")
    assert d.proc is not None
    d.proc.wait(30)
    assert d.proc.returncode == 137, "the daemon should have died mid-submit"
    d.proc = None
    d.start()
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 0, err
    deadline = time.monotonic() + 30
    jobs: list = []
    while time.monotonic() < deadline:
        r = d.cli("history", "--json")
        jobs = [j for j in r.json() if j["name"] == "crashy"]
        if jobs and jobs[0]["slurm_job_id"]:
            break
        time.sleep(1)
    assert len(jobs) == 1 and jobs[0]["slurm_job_id"], jobs
    key = jobs[0]["key"]
    time.sleep(3)  # a few more ticks: adoption must not submit again
    names = [n for n in _squeue_names(slurm_cluster.env) if n.startswith(key)]
    acct = subprocess.run(
        ["sacct", "-a", "-X", "-n", "-P", "-o", "JobID,JobName", "-S", "now-1hours"],
        env=slurm_cluster.env, capture_output=True, text=True, check=True,
    ).stdout
    assert len({line.split("|")[0] for line in acct.splitlines() if key in line} | set()) <= 1
    assert len(names) <= 1
    job = d.show(jobs[0]["id"])
    assert len(job["attempts"]) == 1
    assert any(e["kind"] == "adopted" for e in job["events"]), job["events"]
    d.wait_job(jobs[0]["id"], lambda j: j["state"] == "completed", timeout=120)


def test_slurmctld_down_for_many_ticks_marks_unknown_never_failed(broker_daemon, slurm_cluster):
    # The controller is down for 25 ticks; one job ends while it is down (its end is learned
    # from accounting afterwards), the other outlives the outage.
    d = broker_daemon
    ids = []
    for seconds in ("15", "40"):
        r = d.cli("submit", "--json", "--group", "vision", "--time", "10m", "--", "sleep", seconds)
        assert r.code == 0, r.err
        ids.append(r.json()["id"])
    for job_id in ids:
        d.wait_job(job_id, lambda j: j["state"] == "running")
    stop_controller(slurm_cluster)
    try:
        t_end = time.monotonic() + 25
        seen = set()
        while time.monotonic() < t_end:
            for job_id in ids:
                state = d.show(job_id)["state"]
                seen.add(state)
                assert state not in ("failed", "completed", "cancelled"), state
            time.sleep(2)
        assert "unknown" in seen
        # The CLI still answers, and a submit is stored, not lost.
        r = d.cli("submit", "--json", "--group", "vision", "--time", "5m", "--", "sleep", "5")
        assert r.code == 0, r.err
        assert "unreachable" in r.json().get("note", "")
        ids.append(r.json()["id"])
    finally:
        start_controller(slurm_cluster)
    for job_id in ids:
        d.wait_job(job_id, lambda j: j["state"] == "completed", timeout=240)
    for job_id in ids:
        assert d.show(job_id)["attempts"][-1]["state"] == "completed"


def test_own_failures_stop_after_the_retry_limit_and_say_why(broker_daemon):
    d = broker_daemon
    r = d.cli("submit", "--json", "--group", "vision", "--time", "5m", "--max-retries", "1", "--name", "flaky",
              "--", "sh", "-c", "echo boom >&2; exit 3")
    assert r.code == 0, r.err
    job = d.wait_job(r.json()["id"], lambda j: j["state"] == "failed", timeout=180)
    assert [a["state"] for a in job["attempts"]] == ["failed", "failed"]
    assert "failed 2 times" in job["reason"] and "exit 3" in job["reason"], job["reason"]
    assert job["reclaims"] == 0


def test_users_see_and_cancel_only_their_own_jobs(broker_daemon):
    d = broker_daemon
    r = d.cli("submit", "--json", "--group", "vision", "--time", "5m", "--", "sleep", "300")
    assert r.code == 0, r.err
    job_id = r.json()["id"]
    bob_dir = user_dir(public_dir("gbroker-bob-"), "bob")
    # bob cannot see or cancel alice's job; the daemon refuses (identity from the kernel).
    r = d.cli("show", str(job_id), user="bob", cwd=bob_dir)
    assert r.code != 0 and f"no job {job_id} of yours" in r.err
    r = d.cli("cancel", str(job_id), user="bob", cwd=bob_dir)
    assert r.code != 0
    assert d.cli("status", "--json", user="bob", cwd=bob_dir).json() == []
    r = d.cli("status", "--all", user="bob", cwd=bob_dir)
    assert r.code != 0 and "admin" in r.err
    assert d.show(job_id)["state"] in ("pending", "running")
    # alice can.
    r = d.cli("cancel", str(job_id))
    assert r.code == 0, r.err
    job = d.wait_job(job_id, lambda j: j["state"] == "cancelled", timeout=30)
    assert job["attempts"][-1]["state"] == "cancelled"


def test_a_second_daemon_on_the_same_database_refuses(broker_daemon):
    d = broker_daemon
    p = subprocess.run(
        [sys.executable, "-m", "broker", "--socket", d.socket + ".2", "daemon"],
        env=d.env, capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 8, p.stderr
    assert "another gbroker daemon" in p.stderr and "--wait" in p.stderr
    assert d.cli("status").code == 0  # the first one is unharmed


def test_daemon_down_is_a_clear_message_and_nothing_is_lost(broker_daemon):
    d = broker_daemon
    d.stop()
    r = d.cli("submit", "--group", "vision", "--time", "5m", "--", "true")
    assert r.code == 6 and "daemon is not running" in r.err and "Nothing was submitted" in r.err
    d.start()
    assert d.cli("history", "--json").json() == []


def ok_json(r):
    assert r.code == 0, r.err
    return r.json()
