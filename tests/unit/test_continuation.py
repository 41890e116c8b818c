"""A run that ends to go on: a self-requeue (Lightning's auto_requeue) or exit 75 after saving.

Not a reclaim (no reclaim count, nothing in the reclaim rate), not a failure
(no retry used), its work billed as useful; the next attempt follows at once
on the same capacity. A program that ends badly after the time-limit warning
(the batch script's 124) has run out of time: the job ends as a timeout and
is not retried. A requeued job that Slurm still shows completing its old run
never opens a phantom running attempt. Service layer, fake Slurm, fake clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.jobs.handlers import show_job
from broker.jobs.placement import reclaim_history
from ledger_fakes import ROOT, World, setup_lab


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def test_a_job_that_requeues_itself_continues_and_is_neither_reclaimed_nor_lost(world: World) -> None:
    out = world.submit(time="10m")
    sid = out["slurm_job_id"]
    world.slurm.start(sid)
    world.tick()
    world.advance(300)
    world.slurm.requeue([sid])  # what Lightning's handler runs: scontrol requeue $SLURM_JOB_ID
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert [a["state"] for a in shown["attempts"]] == ["continued", "pending"]
    assert shown["reclaims"] == 0 and shown["failures"] == 0
    assert world.slurm.calls.get("start_now", 0) >= 1  # no two-minute requeue delay
    world.slurm.start(sid)
    world.tick()
    world.advance(120)
    world.slurm.finish(sid)
    world.tick()
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert shown["state"] == "completed"
    lines = world.lines(job_id=out["id"])
    assert {ln["tag"] for ln in lines} == {"useful"} and sum(ln["seconds"] for ln in lines) == 420
    with world.svc.sessions() as s:
        assert reclaim_history(s, world.clock.now()).rate(1) == 0.0


def test_exit_75_continues_in_a_new_submission(world: World) -> None:
    out = world.submit(time="10m")
    sid = out["slurm_job_id"]
    world.slurm.start(sid)
    world.tick()
    world.advance(200)
    world.slurm.finish(sid, exit_code=75)
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert [a["state"] for a in shown["attempts"]] == ["continued", "pending"]
    assert shown["attempts"][1]["slurm_job_id"] not in (None, sid)
    assert shown["failures"] == 0 and shown["reclaims"] == 0 and shown["state"] == "pending"


def test_ending_badly_after_the_warning_is_a_timeout_not_a_failure(world: World) -> None:
    out = world.submit(time="10m")
    sid = out["slurm_job_id"]
    world.slurm.start(sid)
    world.tick()
    world.advance(600)
    world.slurm.finish(sid, exit_code=124)
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert shown["state"] == "timeout" and [a["state"] for a in shown["attempts"]] == ["timeout"]
    assert world.slurm.calls["sbatch"] == 1  # not retried


def test_a_requeued_job_still_completing_opens_no_phantom_running_attempt(world: World) -> None:
    out = world.submit(time="10m")
    sid = out["slurm_job_id"]
    world.slurm.start(sid)
    world.tick()
    world.advance(100)
    old_start = world.slurm.jobs_by_id[sid].current.start
    world.slurm.requeue([sid])
    job = world.slurm.jobs_by_id[sid]
    job.current.state_raw, job.current.start = "COMPLETING", old_start  # the old run's last moments
    world.tick()
    world.tick()  # and again, while Slurm still shows the old run completing
    shown = show_job(world.svc, ROOT, out["id"])
    assert [a["state"] for a in shown["attempts"]] == ["continued", "pending"], shown["attempts"]
    job.current.state_raw, job.current.start = "PENDING", None
    world.advance(5)
    world.slurm.start(sid)
    world.tick()
    world.advance(50)
    world.slurm.finish(sid)
    world.tick()
    attempts = show_job(world.svc, ROOT, out["id"])["attempts"]
    assert [a["state"] for a in attempts] == ["continued", "completed"]
    for a in attempts:  # every attempt ran, and ended after it started
        assert a["started_at"] and a["ended_at"] and a["ended_at"] > a["started_at"], a
