"""The tick and the submit path against hostile or broken input (service layer, fake Slurm).

* a row the daemon cannot read back stops only its own job, once, never the tick;
* a Slurm id that Slurm shows as someone else's is never acted on;
* a retried submission (same key) returns the first job, never a second one;
* a refused submission leaves nothing behind, not even its log file;
* lost work comes from what the owner's checkpoint directory showed, never from root's view.
"""

from __future__ import annotations

import logging
import pwd
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from broker.caller import Caller
from broker.db.store import IdempotencyConflict
from broker.errors import AdmissionRefused, SpecError
from broker.jobs.handlers import cancel_jobs, list_jobs, show_job
from ledger_fakes import ROOT, FakeJob, FakeRun, World, caller, job_spec, setup_lab


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def test_a_bad_row_stops_only_its_job_and_is_logged_once(world: World, caplog: pytest.LogCaptureFixture) -> None:
    bad = world.submit(user="alice")
    good = world.submit(user="carol", group="climate")
    with world.svc.tx() as s:
        s.execute(text("UPDATE jobs SET spec_json = '{oops' WHERE id = :i"), {"i": bad["id"]})
    world.slurm.start(bad["slurm_job_id"])
    world.slurm.start(good["slurm_job_id"])
    world.advance(30)
    world.slurm.reclaim(bad["slurm_job_id"])  # settling this one needs its spec
    world.slurm.finish(good["slurm_job_id"])
    with caplog.at_level(logging.ERROR, logger="broker.jobs.reconcile"):
        for _ in range(4):
            world.tick()
            world.advance(1)
    assert show_job(world.svc, ROOT, good["id"])["state"] == "completed"
    shown = show_job(world.svc, ROOT, bad["id"])
    assert "could not process this job" in shown["reason"]
    assert [e["kind"] for e in shown["events"]].count("tick_error") == 1
    assert sum(f"job {bad['id']}:" in r.getMessage() for r in caplog.records) == 1


def test_an_id_slurm_shows_as_someone_elses_is_never_touched(world: World) -> None:
    out = world.submit(user="alice")
    sid = out["slurm_job_id"]
    # As if the id gbroker recorded were bob's job (a forged sbatch answer, a reused id).
    world.slurm.jobs_by_id[sid].user = "bob"
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert shown["state"] == "failed" and "not to this job of alice" in shown["reason"]
    before = dict(world.slurm.calls)
    cancel_jobs(world.svc, caller("alice"), [out["id"]])
    assert world.slurm.calls.get("scancel", 0) == before.get("scancel", 0)
    assert not world.slurm.jobs_by_id[sid].done


def _planted(world: World, name: str, user: str = "bob") -> FakeJob:
    """A job another user submitted under a name of gbroker's (anyone may pass --job-name)."""
    world.slurm.next_id += 1
    fake = FakeJob(world.slurm.next_id, name, name, user, "", "spot", 1, 600,
                   runs=[FakeRun(submit=world.clock.now())], held=True)
    world.slurm.jobs_by_id[fake.job_id] = fake
    return fake


def test_another_users_job_named_like_an_unsubmitted_attempt_neither_fails_it_nor_is_adopted(world: World) -> None:
    from broker.jobs.submit import slurm_name

    world.slurm.down = True
    out = world.submit(user="alice")
    assert out["slurm_job_id"] is None
    key = show_job(world.svc, ROOT, out["id"])["key"]
    planted = _planted(world, slurm_name(key, 1))
    world.slurm.down = False
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert shown["state"] not in ("failed", "cancelled"), shown["reason"]
    sid = shown["attempts"][0]["slurm_job_id"]
    assert sid is not None and sid != planted.job_id
    assert world.slurm.jobs_by_id[sid].user == "alice" and not planted.done


def test_the_owners_job_is_adopted_when_another_users_job_has_the_same_name(world: World) -> None:
    from broker.db.models import Attempt
    from broker.jobs.submit import slurm_name

    out = world.submit(user="alice")
    sid = out["slurm_job_id"]
    key = show_job(world.svc, ROOT, out["id"])["key"]
    with world.svc.tx() as s:  # as after a crash between sbatch and the commit of its id
        s.query(Attempt).filter(Attempt.slurm_job_id == sid).update({"slurm_job_id": None})
    _planted(world, slurm_name(key, 1))  # listed after alice's own
    sbatches = world.slurm.calls.get("sbatch", 0)
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert shown["state"] not in ("failed", "cancelled"), shown["reason"]
    assert [a["slurm_job_id"] for a in shown["attempts"]] == [sid]
    assert world.slurm.calls.get("sbatch", 0) == sbatches, "submitted a second time"


def test_cancel_verifies_ids_before_root_cancels_them(world: World) -> None:
    out = world.submit(user="alice")
    sid = out["slurm_job_id"]
    world.slurm.jobs_by_id[sid].comment = "gb-someoneelse"
    world.slurm.jobs_by_id[sid].name = "gb-someoneelse-1"
    cancel_jobs(world.svc, caller("alice"), [out["id"]])
    assert not world.slurm.jobs_by_id[sid].done, "root cancelled a job that does not carry this job's key"
    assert show_job(world.svc, ROOT, out["id"])["state"] == "cancelled"


def test_a_retried_submission_returns_the_first_job(world: World) -> None:
    from broker.jobs.submit import submit

    spec = job_spec()
    first = submit(world.svc, caller("alice"), spec, "gb-aaaaaaaaaaaa")
    again = submit(world.svc, caller("alice"), spec, "gb-aaaaaaaaaaaa")
    assert again["id"] == first["id"] and "already submitted" in again["note"]
    assert world.slurm.calls["sbatch"] == 1
    assert len(list_jobs(world.svc, caller("alice"), active=False)) == 1
    with pytest.raises(IdempotencyConflict):
        submit(world.svc, caller("alice"), job_spec(time="20m"), "gb-aaaaaaaaaaaa")  # same key, other job
    bob = Caller(uid=pwd.getpwnam("bob").pw_uid, gid=0, pid=1, name="bob", is_admin=False)
    with pytest.raises(IdempotencyConflict):
        submit(world.svc, bob, spec, "gb-aaaaaaaaaaaa")  # someone else's key
    with pytest.raises(SpecError):
        submit(world.svc, caller("alice"), spec, "gb-$(id)")


def test_a_job_that_may_not_be_interrupted_is_not_forced_onto_spot(world: World) -> None:
    with pytest.raises(SpecError, match="partition spot is spot capacity.*interruptible = false"):
        world.submit(user="alice", interruptible=False, partition="spot")
    assert list_jobs(world.svc, ROOT, {"all_users": True}) == [] and world.slurm.calls.get("sbatch", 0) == 0
    assert world.submit(user="alice", interruptible=False, partition="ondemand")["slurm_job_id"] is not None


def test_a_refused_submission_leaves_no_row_and_no_log(world: World) -> None:
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "0.01"})
    with pytest.raises(AdmissionRefused):
        world.submit(user="alice", time="2h")
    assert list_jobs(world.svc, ROOT, active=False, all_users=True) == []
    assert world.svc.files.logs == []


def test_group_spelling_is_folded_as_slurm_folds_account_names(world: World) -> None:
    world.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "0.01"})
    for spelling in ("VISION", "Vision"):
        with pytest.raises(AdmissionRefused) as err:
            world.submit(user="alice", group=spelling, time="2h")
        assert "group vision" in err.value.message
    with pytest.raises(SpecError):
        world.ops()["group_add"](ROOT, {"name": "Vision", "members": ["carol"]})


def test_lost_work_comes_from_the_owners_view_of_the_checkpoint_directory(world: World) -> None:
    spec = job_spec()
    spec["checkpoint"] = {"style": "signal", "dir": "/scratch/alice/ck"}
    from broker.jobs.submit import submit

    out = submit(world.svc, caller("alice"), spec)
    world.slurm.start(out["slurm_job_id"])
    world.tick()
    world.advance(100)
    world.svc.files.saved_at["/scratch/alice/ck"] = (world.clock.now() - timedelta(seconds=30)).timestamp()
    world.slurm.reclaim(out["slurm_job_id"])
    world.tick()
    first = show_job(world.svc, ROOT, out["id"])["attempts"][0]
    assert first["state"] == "reclaimed" and first["lost_s"] == 30


def test_a_job_slurm_held_after_its_own_launch_failure_is_released_not_counted_as_a_reclaim(world: World) -> None:
    out = world.submit(user="alice", time="10m")
    sid = out["slurm_job_id"]
    world.slurm.start(sid)
    world.tick()
    world.advance(80)  # gbroker saw it run for 80 s
    world.slurm.lose_launch(sid)
    world.tick()
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert [a["state"] for a in shown["attempts"]] == ["lost", "pending"]
    assert shown["reclaims"] == 0 and shown["failures"] == 0
    assert world.slurm.calls.get("release", 0) == 1 and not world.slurm.jobs_by_id[sid].held
    assert [e["kind"] for e in shown["events"]].count("released") == 1
    world.slurm.start(sid)
    world.tick()
    world.advance(60)
    world.slurm.finish(sid)
    world.tick()
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert shown["state"] == "completed"
    lines = [ln for ln in world.lines(job_id=out["id"]) if ln["run_index"] == 0]
    assert sum(ln["seconds"] for ln in lines) == 80 and {ln["tag"] for ln in lines} == {"lost"}
    assert any("Slurm lost it" in e["message"] for e in shown["events"])


def test_a_launch_that_keeps_failing_is_given_up_after_a_few_releases(world: World) -> None:
    out = world.submit(user="alice", time="10m")
    sid = out["slurm_job_id"]
    for _ in range(5):
        world.slurm.start(sid)
        world.tick()
        world.advance(5)
        world.slurm.lose_launch(sid)
        world.tick()
        world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert shown["state"] == "failed" and "failed to launch it" in shown["reason"]
    assert world.slurm.jobs_by_id[sid].done


def test_a_run_the_controller_forgot_is_resubmitted_after_a_grace(world: World) -> None:
    out = world.submit(user="alice", time="10m")
    sid = out["slurm_job_id"]
    world.slurm.start(sid)
    world.tick()
    world.advance(30)
    world.slurm.forget(sid)
    world.tick()
    assert show_job(world.svc, ROOT, out["id"])["state"] == "unknown"
    world.advance(121)
    world.tick()
    shown = show_job(world.svc, ROOT, out["id"])
    assert [a["state"] for a in shown["attempts"]] == ["lost", "pending"]
    assert shown["attempts"][1]["slurm_job_id"] != sid and shown["reclaims"] == 0
    lines = [ln for ln in world.lines(job_id=out["id"]) if ln["slurm_job_id"] == sid]
    assert sum(ln["seconds"] for ln in lines) == 30  # up to when it went missing, not the grace after
