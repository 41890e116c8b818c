"""Boot failures and completing runs, as the reconcile tick reads them (the fake Slurm, a real database).

A run whose node never came up (Slurm's ResumeTimeout: NODE_FAIL of a run gbroker only ever saw
booting) is a boot failure: no reclaim, no lost work, no charge, and after two on one node the job is
kept off it. A run Slurm is ending (COMPLETING) reads as completing, with its silent node named.
The same on the real dev cluster: tests/integration/test_node_boot_failure.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.jobs.handlers import show_job
from broker.jobs.reconcile import _boot_failure
from broker.slurm.backend import NodeInfo
from broker.slurm.statemap import parse_node_state
from broker.states import JobState, NodeState, can_move
from ledger_fakes import ROOT, FakeRun, World, setup_lab


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def _updates(world: World) -> list[tuple[int, dict[str, object]]]:
    """Record every ``update`` the tick sends (and still let the fake apply it)."""
    seen: list[tuple[int, dict[str, object]]] = []
    real = world.slurm.update

    def update(job_id: int, **fields: object) -> None:
        seen.append((job_id, fields))
        real(job_id, **fields)

    world.slurm.update = update  # type: ignore[method-assign]
    return seen


def _boot_then_fail(world: World, sid: int, node: str) -> None:
    """The run is given ``node``, waits for its boot past the tick, and Slurm gives up (ResumeTimeout):
    NODE_FAIL after 100 s of allocation, requeued under the same id, as 22.05 does on the dev cluster."""
    job = world.slurm.jobs_by_id[sid]
    run = job.current
    run.start, run.state_raw, run.node, run.partition = world.clock.now(), "CONFIGURING", node, job.partition
    world.tick()
    world.advance(100)
    run.end, run.state_raw = world.clock.now(), "NODE_FAIL"
    job.runs.append(FakeRun(submit=world.clock.now(), partition=job.partition))
    world.tick()


def test_two_boot_failures_on_one_node_are_no_reclaims_cost_nothing_and_keep_the_job_off_it(world: World) -> None:
    updates = _updates(world)
    out = world.submit(time="10m")
    sid = out["slurm_job_id"]
    _boot_then_fail(world, sid, "spot1")
    job = show_job(world.svc, ROOT, out["id"])
    assert [a["state"] for a in job["attempts"]] == ["boot_failed", "pending"]
    assert (job["reclaims"], job["attempts"][0]["lost_s"], job["attempts"][0]["started_at"]) == (0, 0, None)
    assert [e for e in job["events"] if e["kind"] == "boot_failed"][0]["message"].startswith(
        "attempt 1: spot1 never came up (Slurm gave up waiting for the boot and ended the run NODE_FAIL)")
    assert not [f for _, f in updates if "exclude_nodes" in f]  # one failure is no reason to avoid the node

    _boot_then_fail(world, sid, "spot1")
    assert (sid, {"exclude_nodes": "spot1"}) in updates
    world.slurm.start(sid, node="spot2")
    world.tick()
    world.advance(30)
    world.slurm.finish(sid)
    world.tick()
    world.tick()
    job = show_job(world.svc, ROOT, out["id"])
    assert job["state"] == "completed"
    assert [a["state"] for a in job["attempts"]] == ["boot_failed", "boot_failed", "completed"]
    assert job["reclaims"] == 0
    kinds = [e["kind"] for e in job["events"]]
    assert (kinds.count("boot_failed"), kinds.count("reclaimed"), kinds.count("nodes_excluded")) == (2, 0, 1)
    charged = [e for e in job["events"] if e["kind"] == "charged"]
    assert [c["message"].split(":")[0] for c in charged] == [
        f"run 0 of Slurm job {sid} (NODE_FAIL, 0s x 1 GPU on spot)",
        f"run 1 of Slurm job {sid} (NODE_FAIL, 0s x 1 GPU on spot)",
        f"run 2 of Slurm job {sid} (COMPLETED, 30s x 1 GPU on spot)",
    ]
    assert [line["seconds"] for line in world.lines(job_id=out["id"])] == [30]


def test_a_run_that_was_running_when_its_node_failed_is_still_a_reclaim(world: World) -> None:
    out = world.submit(time="10m")
    sid = out["slurm_job_id"]
    world.slurm.start(sid, node="spot1")
    world.tick()
    world.advance(60)
    world.slurm.reclaim(sid)
    world.tick()
    job = show_job(world.svc, ROOT, out["id"])
    assert [a["state"] for a in job["attempts"]][:1] == ["reclaimed"]
    assert job["reclaims"] == 1


@pytest.mark.parametrize(("cause", "seen_booting", "boot_failure"), [
    ("NODE_FAIL", True, True), ("NODE_FAIL", False, False), ("BOOT_FAIL", False, True),
    ("PREEMPTED", True, False), ("REQUEUED", True, False),
])
def test_what_counts_as_a_boot_failure(cause: str, seen_booting: bool, boot_failure: bool) -> None:
    assert _boot_failure(cause, seen_booting) is boot_failure


def _silent(name: str) -> NodeInfo:
    parsed = parse_node_state("completing*")
    return NodeInfo(name=name, state_raw="completing*", state=parsed.state, partitions=["ondemand"], features=[],
                    gpus=4, reason="", flags=parsed.flags)


def test_a_run_slurm_is_ending_on_a_silent_node_reads_completing_not_running(world: World) -> None:
    out = world.submit(time="10m")
    sid = out["slurm_job_id"]
    world.slurm.start(sid, node="od1")
    world.tick()
    assert show_job(world.svc, ROOT, out["id"])["reason"] == "running on od1"
    world.slurm.jobs_by_id[sid].current.state_raw = "COMPLETING"
    asked: list[Any] = []

    def nodes() -> list[NodeInfo]:
        asked.append(1)
        return [_silent("od1")]

    world.slurm.nodes = nodes  # type: ignore[method-assign]
    world.tick()
    job = show_job(world.svc, ROOT, out["id"])
    assert (job["state"], job["reason"]) == (
        "completing", "completing on od1: Slurm is ending it and waits for od1, not responding; it ends when the "
        "node answers or Slurm gives up on it")
    assert [a["state"] for a in job["attempts"]] == ["completing"]  # shown as Slurm says; it still holds od1
    world.tick()
    assert [e["kind"] for e in show_job(world.svc, ROOT, out["id"])["events"]].count("completing") == 1
    assert len(asked) == 2  # one sinfo per tick, only while a job is completing

    world.slurm.jobs_by_id[sid].current.state_raw = "RUNNING"
    world.slurm.cancel([sid])
    world.tick()
    world.tick()
    assert show_job(world.svc, ROOT, out["id"])["state"] == "cancelled"
    assert len(asked) == 2


def test_completing_is_a_live_state_between_running_and_the_end() -> None:
    assert parse_node_state("completing*").not_responding
    assert parse_node_state("completing*").state is not NodeState.IDLE
    assert can_move(JobState.RUNNING, JobState.COMPLETING)
    assert all(can_move(JobState.COMPLETING, end) for end in (JobState.CANCELLED, JobState.TIMEOUT,
                                                               JobState.RECOVERING, JobState.COMPLETED))
