"""A reconcile tick that runs while a submit is half-way never sbatches the job a second time.

The daemon answers clients on threads while its tick runs on another; these
tests put the tick at the two unlucky moments deterministically (fake Slurm,
real database): right after the intent is committed, and between the tick's
squeue and its database read while a submit completes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from broker.jobs.reconcile import reconcile
from broker.states import JobState
from ledger_fakes import ROOT, World, setup_lab


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def show(w: World, job_id: int) -> dict[str, Any]:
    from broker.jobs.handlers import show_job

    return show_job(w.svc, ROOT, job_id)


class TickAt:
    """Crash points that run one reconcile tick at a named point instead of dying."""

    def __init__(self, w: World, point: str) -> None:
        self.w, self.point, self.ran = w, point, 0

    def reach(self, name: str) -> None:
        if name == self.point and not self.ran:
            self.ran += 1
            reconcile(self.w.svc)


def test_a_tick_between_intent_and_sbatch_does_not_submit_the_job_again(world: World) -> None:
    world.svc.crash = TickAt(world, "after_intent")
    out = world.submit()
    assert world.svc.crash.ran == 1
    assert world.slurm.calls.get("sbatch") == 1, "the tick submitted the job as well"
    assert [j.job_id for j in world.slurm.jobs_by_id.values()] == [out["slurm_job_id"]]
    world.tick()
    assert world.slurm.calls.get("sbatch") == 1


def test_a_tick_with_a_queue_listing_older_than_the_sbatch_leaves_the_job_alone(world: World) -> None:
    original = world.slurm.jobs
    box: dict[str, Any] = {}

    def listing_then_submit(*a: Any, **kw: Any) -> Any:
        listed = original(*a, **kw)  # taken before the submit below reaches Slurm
        if "out" not in box:
            box["out"] = world.submit()
        return listed

    world.slurm.jobs = listing_then_submit  # type: ignore[method-assign]
    reconcile(world.svc)
    out = box["out"]
    assert world.slurm.calls.get("sbatch") == 1
    job = show(world, out["id"])
    assert job["state"] == JobState.PENDING.value, job["state"]  # not "unknown" from a stale listing
    world.tick()
    job = show(world, out["id"])
    assert job["state"] == JobState.PENDING.value
    assert [a["slurm_job_id"] for a in job["attempts"]] == [out["slurm_job_id"]]


def test_twenty_threads_submitting_while_ticks_run_give_one_slurm_job_each(world: World) -> None:
    import threading

    stop = threading.Event()
    errors: list[BaseException] = []

    def ticker() -> None:
        while not stop.is_set():
            try:
                reconcile(world.svc)
            except BaseException as exc:  # pragma: no cover (reported below)
                errors.append(exc)

    t = threading.Thread(target=ticker)
    t.start()
    outs: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one() -> None:
        o = world.submit(time="1m")
        with lock:
            outs.append(o)

    threads = [threading.Thread(target=one) for _ in range(20)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    stop.set()
    t.join()
    assert not errors, errors
    assert len(outs) == 20
    assert world.slurm.calls.get("sbatch") == 20
    for o in outs:
        attempts = show(world, o["id"])["attempts"]
        assert [a["slurm_job_id"] for a in attempts] == [o["slurm_job_id"]]



class CancelAt:
    """A crash point that cancels every job (as alice, their owner) at a named point instead of dying."""

    def __init__(self, w: World, point: str) -> None:
        self.w, self.point, self.ran = w, point, 0

    def reach(self, name: str) -> None:
        if name == self.point and not self.ran:
            from broker.db.models import Job
            from broker.jobs.handlers import cancel_jobs
            from ledger_fakes import caller

            self.ran += 1
            with self.w.svc.sessions() as s:
                ids = [j.id for j in s.query(Job).all()]
            cancel_jobs(self.w.svc, caller("alice"), ids)


def test_a_job_cancelled_while_its_sbatch_runs_has_its_slurm_job_cancelled_too(world: World) -> None:
    world.svc.crash = CancelAt(world, "after_sbatch")
    out = world.submit()
    assert world.svc.crash.ran == 1
    job = show(world, out["id"])
    assert job["state"] == JobState.CANCELLED.value
    (slurm_job,) = world.slurm.jobs_by_id.values()
    assert slurm_job.done and slurm_job.current.state_raw.startswith("CANCELLED"), "the Slurm job was left running"
    assert job["attempts"][0]["state"] == "cancelled"
    assert job["attempts"][0]["slurm_job_id"] == slurm_job.job_id
    world.tick()
    assert show(world, out["id"])["state"] == JobState.CANCELLED.value


def test_a_key_stored_between_the_check_and_the_insert_answers_with_that_job(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another daemon stored the key after this one found it free: the insert writes nothing,
    and the answer is the job stored first (as for any repeat of a key)."""
    from broker.db import store
    from broker.jobs.submit import submit
    from ledger_fakes import caller, job_spec

    first = submit(world.svc, caller("alice"), job_spec(), key="gb-racedkey01")
    real, calls = store.key_is_stored, []

    def free_once(s: Any, key: str) -> bool:
        calls.append(key)
        return real(s, key) if len(calls) > 1 else False

    monkeypatch.setattr(store, "key_is_stored", free_once)
    again = submit(world.svc, caller("alice"), job_spec(), key="gb-racedkey01")
    assert again["id"] == first["id"] and "already submitted" in again["note"], again
    assert len(world.slurm.jobs_by_id) == 1 and len(calls) == 2
    assert len(show(world, first["id"])["attempts"]) == 1


def test_a_committed_sbatch_is_remembered_for_its_window_then_forgotten(world: World, monkeypatch: Any) -> None:
    """sbatch_busy answers from memory: recent commits are kept, old ones dropped from the front."""
    import broker.state as state

    svc = world.svc
    clock = [1000.0]
    monkeypatch.setattr(state.time, "monotonic", lambda: clock[0])
    for attempt in (1, 2, 3):
        assert svc.claim_sbatch(attempt)
        svc.sbatch_finished(attempt, committed=True)
        clock[0] += 100
    assert svc.claim_sbatch(1)  # again, later: it moves to the back
    svc.sbatch_finished(1, committed=True)
    clock[0] += state.SBATCH_MEMORY_S - 150  # at 1750: attempt 2 (at 1100) is older than the window, 3 not yet
    assert svc.claim_sbatch(4)
    svc.sbatch_finished(4, committed=True)
    assert list(svc.sbatched_at) == [3, 1, 4]
    clock[0] += 100
    svc.sbatch_finished(5, committed=True)
    assert list(svc.sbatched_at) == [1, 4, 5]
    assert svc.sbatch_busy(1, since=1200.0) and not svc.sbatch_busy(3, since=0.0)
