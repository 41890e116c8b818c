"""The on-demand quota holds for gbroker's own moves too, not only at submit.

A job placed on spot can later be moved to on-demand: waiting for spot past
its deadline's safety net, running on spot when the policy says so, or after
reclaims. Each of those would add GPUs to the group's on-demand count, so
each asks the quota first. With no room the job stays on spot, says why once
(a ``quota_held`` event), and moves at a later tick when the quota has room.
Service layer on a real database, fake Slurm, fake clock.
"""

from __future__ import annotations

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


def fill_ondemand_quota(w: World) -> int:
    """On-demand quota of 1 GPU for vision, taken by a running non-interruptible job; its Slurm id."""
    w.ops()["quota_set"](ROOT, {"group": "vision", "max_ondemand_gpus": 1})
    out = w.submit(interruptible=False, time="1h")
    assert out["capacity"] == "ondemand"
    assert w.slurm.start(out["slurm_job_id"], node="od1")
    w.tick()
    return int(out["slurm_job_id"])


def events(w: World, job_id: int, kind: str) -> list[dict[str, Any]]:
    return [e for e in show_job(w.svc, ROOT, job_id)["events"] if e["kind"] == kind]


@pytest.mark.parametrize("quota_full", [True, False])
def test_a_waiting_deadline_job_is_not_moved_past_the_ondemand_quota(world: World, quota_full: bool) -> None:
    world.svc.policy = policies.from_name("greedy")
    blocker = fill_ondemand_quota(world) if quota_full else None
    out = world.submit(time="10m", deadline_in_s=16 * 60)
    assert out["capacity"] == "spot"
    sid = out["slurm_job_id"]
    for _ in range(20):  # 5 minutes of waiting: the safety net wants on-demand well before that
        world.advance(15)
        world.tick()
    job = show_job(world.svc, ROOT, out["id"])
    if not quota_full:
        assert world.slurm.jobs_by_id[sid].partition == "ondemand"
        assert events(world, out["id"], "quota_held") == []
        return
    assert world.slurm.jobs_by_id[sid].partition == "spot"
    assert job["state"] == "pending"
    assert "on-demand quota is full" in job["reason"]
    held = events(world, out["id"], "quota_held")
    assert len(held) == 1, held  # said once, not at every tick
    assert "on-demand quota is 1 GPUs at once, 1 are queued or running there" in held[0]["message"]
    assert events(world, out["id"], "fallback") == []
    # The blocker finishes: the quota has room, the next tick moves the job.
    assert blocker is not None and world.slurm.finish(blocker)
    world.tick()
    world.tick()
    assert world.slurm.jobs_by_id[sid].partition == "ondemand"
    assert len(events(world, out["id"], "fallback")) == 1


def test_a_running_deadline_job_stays_on_spot_while_the_ondemand_quota_is_full(world: World) -> None:
    world.svc.policy = policies.from_name("greedy")
    blocker = fill_ondemand_quota(world)
    out = world.submit(time="10m", deadline_in_s=16 * 60)
    sid = out["slurm_job_id"]
    assert world.slurm.start(sid, node="spot1")
    world.tick()
    for _ in range(24):
        world.advance(15)
        world.tick()
    assert not world.slurm.calls.get("requeue"), "moved past the quota"
    assert show_job(world.svc, ROOT, out["id"])["state"] == "running"
    held = events(world, out["id"], "quota_held")
    assert len(held) == 1 and "it keeps running on spot" in held[0]["message"]
    assert world.slurm.finish(blocker)
    world.tick()
    world.tick()
    assert world.slurm.calls.get("requeue") == 1
    world.tick()
    job = show_job(world.svc, ROOT, out["id"])
    assert [(a["capacity"], a["state"]) for a in job["attempts"]] == [("spot", "moved"), ("ondemand", "pending")]


@pytest.mark.parametrize("quota_full", [True, False])
def test_after_reclaims_the_move_to_ondemand_waits_for_quota(world: World, quota_full: bool) -> None:
    # The World's policy is "simple" with max_spot_reclaims=2: on-demand after the second reclaim.
    if quota_full:
        fill_ondemand_quota(world)
    out = world.submit(time="1h")
    assert out["capacity"] == "spot"
    sid = out["slurm_job_id"]
    for _ in range(2):
        assert world.slurm.start(sid, node="spot1")
        world.tick()
        world.advance(60)
        assert world.slurm.reclaim(sid)
        world.tick()
    job = show_job(world.svc, ROOT, out["id"])
    caps = [a["capacity"] for a in job["attempts"]]
    held = events(world, out["id"], "quota_held")
    if quota_full:
        assert caps == ["spot", "spot", "spot"], caps
        assert world.slurm.jobs_by_id[sid].partition == "spot"
        assert len(held) == 1 and "it resumes on spot" in held[0]["message"]
        assert job["reason"] == "resume on spot: the group's on-demand quota is full"
    else:
        assert caps == ["spot", "spot", "ondemand"], caps
        assert world.slurm.jobs_by_id[sid].partition == "ondemand"
        assert held == []


def test_two_moves_decided_in_one_tick_do_not_share_one_free_slot(world: World) -> None:
    """A job being requeued onto on-demand counts there from the moment the move is decided."""
    world.svc.policy = policies.from_name("greedy")
    world.ops()["quota_set"](ROOT, {"group": "vision", "max_ondemand_gpus": 1})
    outs = [world.submit(time="10m", deadline_in_s=16 * 60) for _ in range(2)]
    for k, out in enumerate(outs):
        assert world.slurm.start(out["slurm_job_id"], node=f"spot{k + 1}")
    world.tick()
    for _ in range(24):
        world.advance(15)
        world.tick()
    assert world.slurm.calls.get("requeue") == 1, world.slurm.calls
    kinds = sorted(
        ("fallback" if events(world, o["id"], "fallback") else "")
        + ("held" if events(world, o["id"], "quota_held") else "")
        for o in outs
    )
    assert kinds == ["fallback", "held"], kinds
