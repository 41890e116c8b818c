"""A deadline job running on spot is requeued onto on-demand when the policy says so.

The simulator asks the policy at every step, running or not; the daemon does
the same at every tick, so a late reclaim can no longer leave too little time
to finish on on-demand. Service layer on a real database, fake Slurm, fake clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import policies
from broker.jobs.handlers import show_job
from ledger_fakes import ROOT, World, setup_lab


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def run_on_spot(w: World, out: dict[str, Any]) -> int:
    sid = out["slurm_job_id"]
    assert w.slurm.start(sid, node="spot1")
    w.tick()
    assert show_job(w.svc, ROOT, out["id"])["state"] == "running"
    return sid


@pytest.mark.parametrize("policy", ["gbroker", "greedy", "uniform-progress", "simple"])
def test_spot_job_is_moved_while_the_deadline_can_still_be_met_on_ondemand(world: World, policy: str) -> None:
    world.svc.policy = policies.from_name(policy)
    deadline_s = 16 * 60
    out = world.submit(time="10m", deadline_in_s=deadline_s)
    assert out["capacity"] == "spot"
    sid = run_on_spot(world, out)
    moved_at = None
    for t in range(0, deadline_s, 15):
        world.advance(15)
        world.tick()
        if world.slurm.calls.get("requeue"):
            moved_at = t + 15
            break
    assert moved_at is not None, "never moved off spot"
    print(f"{policy}: moved off spot {moved_at}s after the start, {deadline_s - moved_at}s before the deadline")
    # Not a moment too late: the whole job (it cannot checkpoint) still fits on on-demand.
    assert deadline_s - moved_at >= 10 * 60, moved_at
    job = show_job(world.svc, ROOT, out["id"])
    assert any(e["kind"] == "fallback" and "requeued to ondemand" in e["message"] for e in job["events"])
    world.tick()  # sees the requeue: the next run goes to on-demand on the same Slurm job
    job = show_job(world.svc, ROOT, out["id"])
    assert [(a["capacity"], a["state"]) for a in job["attempts"]] == [("spot", "moved"), ("ondemand", "pending")]
    assert world.slurm.jobs_by_id[sid].partition == "ondemand"
    assert job["reclaims"] == 0, "our own move is not a reclaim"
    assert world.slurm.start(sid, node="od1")
    world.advance(60)
    world.tick()
    world.advance(8 * 60)
    assert world.slurm.finish(sid)
    world.tick()
    job = show_job(world.svc, ROOT, out["id"])
    assert job["state"] == "completed"
    assert world.slurm.calls["requeue"] == 1


def test_a_job_with_ample_slack_stays_on_spot(world: World) -> None:
    world.svc.policy = policies.from_name("gbroker")
    out = world.submit(time="10m", deadline_in_s=6 * 3600)
    assert out["capacity"] == "spot"
    run_on_spot(world, out)
    for _ in range(30):
        world.advance(15)
        world.tick()
    assert not world.slurm.calls.get("requeue")
    assert show_job(world.svc, ROOT, out["id"])["state"] == "running"


def test_a_forced_spot_partition_is_never_moved(world: World) -> None:
    world.svc.policy = policies.from_name("greedy")
    out = world.submit(time="10m", deadline_in_s=12 * 60, partition="spot")
    run_on_spot(world, out)
    for _ in range(20):
        world.advance(15)
        world.tick()
    assert not world.slurm.calls.get("requeue")


def test_a_failed_requeue_is_tried_again_at_the_next_tick(world: World) -> None:
    world.svc.policy = policies.from_name("greedy")
    out = world.submit(time="10m", deadline_in_s=12 * 60)
    assert out["capacity"] == "spot"
    sid = run_on_spot(world, out)
    real = world.slurm.requeue
    fails = {"left": 1}

    def flaky(ids: Any) -> None:
        if fails["left"]:
            fails["left"] -= 1
            from broker.errors import SlurmError

            raise SlurmError("Slurm busy", argv=["scontrol", "requeue"], returncode=1, stderr="busy")
        real(ids)

    world.slurm.requeue = flaky  # type: ignore[method-assign]

    def fallbacks() -> list[dict[str, Any]]:
        return [e for e in show_job(world.svc, ROOT, out["id"])["events"] if e["kind"] == "fallback"]

    for _ in range(10):
        world.advance(15)
        world.tick()
        if fallbacks():
            break
    events = fallbacks()
    assert events and fails["left"] == 0
    assert world.slurm.jobs_by_id[sid].current.state_raw == "RUNNING"
    world.advance(15)
    world.tick()
    assert world.slurm.jobs_by_id[sid].runs[0].state_raw == "REQUEUED"
    # One decision, told once, carried out when Slurm took it.
    assert [e for e in show_job(world.svc, ROOT, out["id"])["events"] if e["kind"] == "fallback"] == events
    assert len(events) == 1


def test_progress_counts_kept_work_and_the_last_checkpoint(tmp_path: Path) -> None:
    from broker.db.models import Attempt
    from broker.jobs.placement import progress_s
    from broker.spec import spec_from_dict

    t0 = datetime(2026, 10, 1, 8, 0, tzinfo=UTC)
    base = {"name": "p", "group": "vision", "time_limit": "2h", "command": ["true"], "workdir": "/tmp"}
    ck = spec_from_dict(dict(base, checkpoint={"style": "signal", "dir": str(tmp_path)}))
    plain = spec_from_dict(dict(base, checkpoint={"style": "none"}))
    first = Attempt(number=1, started_at=t0, ended_at=t0 + timedelta(seconds=1000), lost_s=100)
    second = Attempt(number=2, started_at=t0 + timedelta(seconds=1200), ended_at=None, lost_s=0)
    now = t0 + timedelta(seconds=1500)
    # No checkpoint of the running attempt yet: its 300 s are done but not safe.
    assert progress_s(ck, [first, second], now) == (900 + 300, 900)
    # The directory (seen as its owner) shows a save 200 s into the running attempt.
    saved = (t0 + timedelta(seconds=1400)).timestamp()
    assert progress_s(ck, [first, second], now, saved) == (1200, 900 + 200)
    # Without checkpoints only the running attempt counts, and none of it is safe.
    assert progress_s(plain, [first, second], now) == (300, 0)
