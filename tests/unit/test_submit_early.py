"""The submit's early sbatch: started before the intent is stored, given its script only after
the commit, aborted (nothing queued) whenever the submission stops before that. Real database,
fake Slurm; the real child process is in tests/unit/test_proc_start.py and on the dev cluster."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from broker.db.models import Attempt, Job
from broker.errors import BrokerError
from broker.slurm.backend import StartedSubmit, SubmitRequest
from broker.states import AttemptState
from ledger_fakes import World, setup_lab


class Early(StartedSubmit):
    def __init__(self, world: World, req: SubmitRequest, log: list[str]) -> None:
        self.world, self.req, self.log, self.argv = world, req, log, ["sbatch"]
        self.done = False

    def finish(self, script: str) -> int:
        assert not self.done
        self.done = True
        with self.world.svc.sessions() as s:  # the intent is committed before the script goes out
            attempt = s.query(Attempt).one()
            assert attempt.state == AttemptState.SUBMITTING and s.get(Job, attempt.job_id) is not None
        self.log.append("finish")
        return self.world.slurm.submit(replace(self.req, script=script))

    def abort(self) -> None:
        if not self.done:  # as the real one: nothing once it finished or was aborted
            self.done = True
            self.log.append("abort")


@pytest.fixture
def world(tmp_path: Path) -> tuple[World, list[str]]:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    log: list[str] = []

    def start_submit(req: SubmitRequest) -> StartedSubmit:
        log.append("start")
        return Early(w, req, log)

    w.slurm.start_submit = start_submit  # type: ignore[method-assign]
    return w, log


def test_the_script_goes_to_the_early_sbatch_after_the_intent(world: tuple[World, list[str]]) -> None:
    w, log = world
    out = w.submit()
    assert log == ["start", "finish"]
    assert w.slurm.calls.get("sbatch") == 1 and out["slurm_job_id"] in w.slurm.jobs_by_id
    queued = next(iter(w.slurm.jobs_by_id.values()))
    assert queued.name == f"{out['key']}-1"


def test_a_refused_submission_aborts_the_early_sbatch(world: tuple[World, list[str]]) -> None:
    w, log = world
    with pytest.raises(BrokerError):
        w.submit(user="carol")  # not a member of vision: refused by admission, after the start
    assert log == ["start", "abort"] and not w.slurm.calls.get("sbatch")
    with w.svc.sessions() as s:
        assert s.query(Job).count() == 0


def test_a_crash_after_the_intent_aborts_the_early_sbatch(world: tuple[World, list[str]]) -> None:
    w, log = world

    class Crash(Exception):
        pass

    def reach(name: str) -> None:
        if name == "after_intent":
            raise Crash

    w.svc.crash.reach = reach  # type: ignore[method-assign]
    with pytest.raises(Crash):
        w.submit()
    assert log == ["start", "abort"] and not w.slurm.calls.get("sbatch")
    w.crash.reach = lambda name: None  # type: ignore[method-assign]
    w.restart()  # the daemon that crashed is gone; a new one finds the stored intent
    w.tick()  # and the tick submits it, once
    assert w.slurm.calls.get("sbatch") == 1


def test_an_early_sbatch_for_another_request_is_aborted_and_sbatch_runs_as_usual(
        world: tuple[World, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    import broker.jobs.submit as submit_mod

    w, log = world
    original = submit_mod.start_sbatch

    def start_other(svc: Any, request: SubmitRequest) -> Any:
        return original(svc, replace(request, partition="elsewhere"))

    monkeypatch.setattr(submit_mod, "start_sbatch", start_other)
    out = w.submit()
    assert log == ["start", "abort"] and w.slurm.calls.get("sbatch") == 1
    assert w.slurm.jobs_by_id[out["slurm_job_id"]].partition == "spot"
