"""A job on on-demand goes back to spot when the policy's rule for a job on on-demand says so.

The simulator asks the policy at every step whatever the job is doing; the
daemon asks a running job at every tick too, so a job that an outage or a
tight slack sent to on-demand returns to spot once spot is back and the
policy says the round trip pays (gbroker: at once unless round trips are
scarce). The move is a requeue onto the spot partition, like the moves to
on-demand and to owned capacity. Service layer on a real database, fake
Slurm, fake clock; the node census fed as the node tick feeds it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import policies
from broker.jobs.handlers import show_job
from broker.jobs.submit import submit
from broker.pools.catalog import Pool
from broker.slurm.backend import NodeInfo
from broker.states import AttemptState, NodeState
from ledger_fakes import ROOT, World, caller, job_spec, setup_lab


@pytest.fixture(params=["partitions", "pools"])
def world(tmp_path: Path, request: pytest.FixtureRequest) -> World:
    """The two partitions of a settings file from before pools, or the same two as a [pools] catalog."""
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    w.svc.policy = policies.from_name("gbroker")
    if request.param == "pools":
        w.svc.settings = replace(w.svc.settings, pools=(Pool("spot", "spot", "spot"),
                                                         Pool("ondemand", "ondemand", "ondemand")))
    return w


def census(w: World, spot_up: bool) -> None:
    """One node tick's census: on-demand nodes always, spot nodes only while spot is there."""
    nodes = [NodeInfo(f"od{i}", "idle", NodeState.IDLE, ["ondemand"], [], 4, "") for i in (1, 2)]
    if spot_up:
        nodes += [NodeInfo(f"spot{i}", "idle", NodeState.IDLE, ["spot"], [], 4, "") for i in (1, 2)]
    w.svc.market.observe(nodes, {}, w.svc.settings.catalog(), w.clock.now())


def watch(w: World, spot_up: bool, seconds: int, step: int = 30) -> None:
    for _ in range(seconds // step):
        census(w, spot_up)
        w.advance(step)


def submit_job(w: World, *, deadline_in_s: int, time: str = "60m", style: str = "signal", **kw: Any) -> dict[str, Any]:
    spec = job_spec(time=time, **kw)
    spec["deadline"] = (w.clock.now() + timedelta(seconds=deadline_in_s)).isoformat()
    if style != "none":
        spec["checkpoint"] = {"style": style, "dir": "/tmp/gbroker-ck"}
    return submit(w.svc, caller("alice"), spec)


def on_ondemand_in_an_outage(w: World, **kw: Any) -> tuple[dict[str, Any], int]:
    """A deadline job placed on on-demand while spot is out (slack under 12 % of the work), running."""
    watch(w, spot_up=False, seconds=600)
    w.tick()
    out = submit_job(w, deadline_in_s=66 * 60, **kw)
    assert (out["partition"], out["capacity"]) == ("ondemand", "ondemand"), out
    sid = out["slurm_job_id"]
    assert w.slurm.start(sid, node="od1")
    w.tick()
    assert show_job(w.svc, ROOT, out["id"])["state"] == "running"
    return out, sid


def moves(w: World, job_id: int) -> list[str]:
    return [e["message"] for e in show_job(w.svc, ROOT, job_id)["events"] if e["kind"] == "fallback"]


def test_spot_back_moves_the_job_from_ondemand_to_spot_and_the_next_run_is_there(world: World) -> None:
    out, sid = on_ondemand_in_an_outage(world)
    # Still out: it stays on on-demand, tick after tick.
    for _ in range(3):
        watch(world, spot_up=False, seconds=60)
        world.tick()
    assert moves(world, out["id"]) == [] and world.slurm.calls.get("requeue", 0) == 0
    # Spot comes back: the next tick decides the move and asks Slurm to requeue the job.
    watch(world, spot_up=True, seconds=60)
    world.tick()
    said = moves(world, out["id"])
    assert len(said) == 1 and "requeued to spot back to spot, cheaper while it lasts" in said[0], said
    assert "back to spot in spot" in said[0], said
    assert world.slurm.calls.get("requeue") == 1
    # The requeue's TERM reached the program, which saved: its work on on-demand is kept.
    world.svc.files.saved_at["/tmp/gbroker-ck"] = world.clock.now().timestamp()
    world.tick()  # Slurm has requeued it: the attempt moved, the next one waits on spot
    job = show_job(world.svc, ROOT, out["id"])
    assert [(a["partition"], a["state"]) for a in job["attempts"]] == [("ondemand", "moved"), ("spot", "pending")]
    assert job["attempts"][0]["lost_s"] == 0, job["attempts"][0]
    assert world.slurm.jobs_by_id[sid].partition == "spot"
    assert (job["partition"], job["capacity"]) == ("spot", "spot")
    assert world.slurm.start(sid, node="spot1")
    world.tick()
    assert show_job(world.svc, ROOT, out["id"])["state"] == "running"
    # On spot now, with spot there: no move back and forth.
    watch(world, spot_up=True, seconds=60)
    world.tick()
    assert len(moves(world, out["id"])) == 1


def test_the_deadline_net_keeps_a_job_with_too_little_slack_on_ondemand(world: World) -> None:
    watch(world, spot_up=False, seconds=600)
    world.tick()
    out = submit_job(world, deadline_in_s=60 * 60 + 90)  # 30 s of slack past the changeover
    assert out["capacity"] == "ondemand"
    assert world.slurm.start(out["slurm_job_id"], node="od1")
    world.tick()
    watch(world, spot_up=True, seconds=120)
    world.tick()
    assert moves(world, out["id"]) == [] and world.slurm.calls.get("requeue", 0) == 0


@pytest.mark.parametrize("what", ["not interruptible", "forced partition", "ondemand policy"])
def test_jobs_that_must_not_move_stay_on_ondemand(world: World, what: str) -> None:
    """(A job that cannot checkpoint: the policy's own test, tests/unit/test_place_catalog.py.)"""
    kw: dict[str, Any] = {}
    if what == "not interruptible":
        kw["interruptible"] = False
    elif what == "forced partition":
        kw["partition"] = "ondemand"
    else:
        world.svc.policy = policies.from_name("ondemand")
    out, _ = on_ondemand_in_an_outage(world, **kw)
    watch(world, spot_up=True, seconds=120)
    world.tick()
    world.tick()
    assert moves(world, out["id"]) == [] and world.slurm.calls.get("requeue", 0) == 0
    assert show_job(world.svc, ROOT, out["id"])["attempts"][-1]["partition"] == "ondemand"


def test_a_full_spot_quota_keeps_the_job_on_ondemand_and_says_so_once(world: World) -> None:
    world.ops()["quota_set"](ROOT, {"group": "vision", "limits": {"class:spot": 0}})
    out, _ = on_ondemand_in_an_outage(world)
    for _ in range(3):
        watch(world, spot_up=True, seconds=60)
        world.tick()
    assert moves(world, out["id"]) == [] and world.slurm.calls.get("requeue", 0) == 0
    held = [e["message"] for e in show_job(world.svc, ROOT, out["id"])["events"] if e["kind"] == "quota_held"]
    assert held == ["not moved to spot: group vision's quota is 0 spot GPUs at once, 0 are queued or running "
                    "there and this job needs 1; it keeps running on ondemand"], held
    # The limit lifted: the next tick moves it.
    world.ops()["quota_set"](ROOT, {"group": "vision", "limits": {"class:spot": None}})
    watch(world, spot_up=True, seconds=30)
    world.tick()
    assert len(moves(world, out["id"])) == 1 and world.slurm.calls.get("requeue") == 1


def test_a_move_settled_while_slurm_still_shows_the_last_run_gets_its_partition_before_it_starts(
        world: World) -> None:
    """Accounting can say the run was requeued while the queue still shows it running (its last
    run's start). The next attempt is stored then, but Slurm's job can only change partition once
    it shows pending: the following tick changes it, before the requeue delay is skipped, or the
    job would start again on on-demand. (It did, on the dev cluster: the fix-up ran only for
    attempts that were not on spot.)"""
    out, sid = on_ondemand_in_an_outage(world)
    watch(world, spot_up=True, seconds=60)
    world.tick()
    assert world.slurm.calls.get("requeue") == 1
    world.svc.files.saved_at["/tmp/gbroker-ck"] = world.clock.now().timestamp()
    real, last = world.slurm.jobs, world.slurm.jobs_by_id[sid].runs[-2]

    def still_running(job_ids: Any = None, name_prefix: str | None = None) -> list[Any]:
        return [replace(j, state_raw="RUNNING", state=AttemptState.RUNNING, reason="None", nodes=[last.node],
                        start_time=last.start) if j.job_id == sid else j for j in real(job_ids, name_prefix)]

    world.slurm.jobs = still_running  # type: ignore[method-assign]
    world.tick()
    world.slurm.jobs = real  # type: ignore[method-assign]
    job = show_job(world.svc, ROOT, out["id"])
    assert [(a["partition"], a["state"]) for a in job["attempts"]] == [("ondemand", "moved"), ("spot", "pending")]
    assert world.slurm.jobs_by_id[sid].partition == "ondemand"  # it looked running: no update asked yet
    world.tick()
    assert world.slurm.jobs_by_id[sid].partition == "spot"
