"""Job and attempt lifecycles: the attempt transition table, the named transitions, and who may set a state.

The table and the scan of the tree need no database; the transitions run on
the store (SQLite and PostgreSQL), a moving attempt end to end on the fake
Slurm and a fake clock.
"""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import policies
from broker.db import store as st
from broker.db.models import Attempt, Job
from broker.db.store import IllegalTransition
from broker.errors import SlurmError
from broker.jobs import lifecycle
from broker.jobs.handlers import show_job
from broker.spec import JobSpec
from broker.states import (
    ATTEMPT_ALLOWED,
    ATTEMPT_RUNNING,
    ATTEMPT_TERMINAL,
    AttemptState,
    JobState,
    can_move_attempt,
)
from ledger_fakes import ROOT, World, setup_lab
from policies.base import Capacity

A = AttemptState
NOW = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
ROOT_DIR = Path(__file__).resolve().parents[2]
STATE_SETTERS = {"broker/jobs/lifecycle.py", "broker/db/store.py"}
"""The only modules that may assign a job's or an attempt's ``state``."""


# -- the table --------------------------------------------------------------------------
def test_every_attempt_state_has_a_row() -> None:
    assert set(ATTEMPT_ALLOWED) == set(AttemptState)


@pytest.mark.parametrize("ended", sorted(ATTEMPT_TERMINAL))
def test_an_ended_attempt_moves_nowhere(ended: AttemptState) -> None:
    assert ATTEMPT_ALLOWED[ended] == frozenset()
    assert [s for s in AttemptState if s != ended and can_move_attempt(ended, s)] == []


@pytest.mark.parametrize("live", sorted(set(AttemptState) - ATTEMPT_TERMINAL))
def test_a_live_attempt_can_end_every_way_but_moved_unless_it_is_moving(live: AttemptState) -> None:
    ends = {s for s in ATTEMPT_TERMINAL if can_move_attempt(live, s)}
    assert ends == (ATTEMPT_TERMINAL if live == A.MOVING else ATTEMPT_TERMINAL - {A.MOVED})


def test_the_moves_on_the_way() -> None:
    assert can_move_attempt(A.SUBMITTING, A.PENDING) and can_move_attempt(A.SUBMITTING, A.RUNNING)
    assert can_move_attempt(A.PENDING, A.RUNNING) and can_move_attempt(A.RUNNING, A.MOVING)
    assert not can_move_attempt(A.RUNNING, A.PENDING)
    assert not can_move_attempt(A.PENDING, A.MOVING)
    assert not can_move_attempt(A.MOVING, A.RUNNING)
    assert not can_move_attempt(A.PENDING, A.SUBMITTING)
    assert can_move_attempt(A.RUNNING, A.RUNNING)  # staying put is no move
    assert ATTEMPT_RUNNING == {A.RUNNING, A.MOVING}


# -- only lifecycle.py (and the store) sets a state --------------------------------------
def _state_assignments(path: Path) -> list[int]:
    """Lines of ``<x>.state = ...`` (plain, augmented, annotated, in a tuple) and ``setattr(x, "state", ...)``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value == "state"):
            lines.append(node.lineno)
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets += t.elts
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            elif isinstance(t, ast.Attribute) and t.attr == "state":
                lines.append(t.lineno)
    return lines


def test_only_lifecycle_and_the_store_assign_a_state() -> None:
    problems = []
    for path in sorted((ROOT_DIR / "broker").rglob("*.py")):
        rel = path.relative_to(ROOT_DIR).as_posix()
        if rel not in STATE_SETTERS:
            problems += [f"{rel}:{n} assigns .state; use a transition of broker/jobs/lifecycle.py"
                         for n in _state_assignments(path)]
    assert not problems, "\n".join(problems)


def test_the_scan_sees_each_form(tmp_path: Path) -> None:
    """Guard against a vacuous scan."""
    sample = tmp_path / "m.py"
    sample.write_text("a.state = 1\nb.state, b.x = 2, 3\nc.state += 1\nd.state: int = 4\nsetattr(e, 'state', 5)\n"
                      "f.states = 6\nstate = 7\n")
    assert sorted(_state_assignments(sample)) == [1, 2, 3, 4, 5]
    assert _state_assignments(ROOT_DIR / "broker/jobs/lifecycle.py"), "lifecycle.py sets states"


# -- the transitions on the store -------------------------------------------------------
def new_job(s: Session) -> tuple[Job, Attempt]:
    spec = JobSpec(name="train", kind="finetune", group="vision", time_limit_s=7200, gpus_per_node=4, nodes=1,
                   command=("python", "train.py"))
    job = st.create_job(s, key="gb-000000000001", spec=spec, owner_uid=1001, owner_name="ana", now=NOW,
                        capacity=Capacity.SPOT, partition="spot")
    return job, st.add_attempt(s, job, partition="spot", capacity=Capacity.SPOT, now=NOW)


def kinds(s: Session, job: Job) -> list[str]:
    return [e.kind for e in st.job_events(s, job.id)]


def test_submitted_then_running_twice_then_completed(store: sessionmaker[Session]) -> None:
    later = NOW + timedelta(minutes=1)
    with store.begin() as s:
        job, att = new_job(s)
        lifecycle.attempt_submitted(s, job, att, 4242, NOW)
        assert (att.state, att.slurm_job_id, att.submitted_at, job.state) == (A.PENDING, 4242, NOW, JobState.PENDING)
        lifecycle.attempt_running(s, job, att, "spot1", NOW, later)
        lifecycle.attempt_running(s, job, att, "spot1", later, later + timedelta(seconds=15))  # a later tick
        assert (att.state, att.nodes, att.started_at, job.state) == (A.RUNNING, "spot1", later, JobState.RUNNING)
        att.ended_at = later + timedelta(seconds=90)
        lifecycle.job_completed(s, job, att, later + timedelta(seconds=95))
        assert (att.state, job.state, job.done_s) == (A.COMPLETED, JobState.COMPLETED, 90)
        assert kinds(s, job) == ["created", "state", "submitted", "running", "state", "state"]


def test_a_moving_attempt_stays_moving_while_it_runs(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        job, att = new_job(s)
        lifecycle.attempt_running(s, job, att, "spot1", NOW, NOW)
        lifecycle.attempt_moving(s, job, att, "ondemand", "too little time left", NOW)
        lifecycle.attempt_running(s, job, att, "spot1", NOW, NOW + timedelta(seconds=15))
        assert att.state == A.MOVING
        moving = st.job_events(s, job.id)[-1]
        assert (moving.kind, moving.message) == (
            "fallback", "running on spot; requeued to ondemand to meet the deadline (too little time left)")
        assert kinds(s, job).count("running") == 1


def test_an_illegal_move_raises_and_changes_nothing(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        job, att = new_job(s)
        with pytest.raises(IllegalTransition, match="cannot move from submitting to moving"):
            lifecycle.attempt_moving(s, job, att, "ondemand", "why", NOW)
        assert att.state == A.SUBMITTING and kinds(s, job) == ["created"]
        lifecycle.job_ended(s, job, att, JobState.FAILED, "refused", NOW, ended_at=NOW)
        with pytest.raises(IllegalTransition, match="cannot move from failed to running"):
            lifecycle.attempt_running(s, job, att, "spot1", NOW, NOW)
        with pytest.raises(IllegalTransition, match="cannot move from failed to moved"):
            lifecycle.attempt_moved(s, job, att, "ondemand", NOW)
        assert att.state == A.FAILED


def test_cancelling_a_job_ends_only_its_live_attempts(store: sessionmaker[Session]) -> None:
    later = NOW + timedelta(minutes=5)
    with store.begin() as s:
        job, first = new_job(s)
        first.ended_at = NOW
        lifecycle.attempt_reclaimed(job, first, A.RECLAIMED)
        second = lifecycle.attempt_next(s, job, Capacity.ONDEMAND, "ondemand", "move", NOW)
        assert (job.state, job.capacity, job.partition, job.reclaims) == (
            JobState.RECOVERING, Capacity.ONDEMAND, "ondemand", 1)
        lifecycle.job_cancelled(s, job, "cancelled by ana", later)
        assert (first.state, first.ended_at) == (A.RECLAIMED, NOW)
        assert (second.state, second.ended_at) == (A.CANCELLED, later)
        assert (job.state, job.reason) == (JobState.CANCELLED, "cancelled by ana")


def test_an_attempt_cancelled_while_its_sbatch_ran_keeps_its_end(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        job, att = new_job(s)
        lifecycle.job_cancelled(s, job, "cancelled by ana", NOW)
        lifecycle.attempt_submitted(s, job, att, 4242, NOW)
        assert (att.state, att.slurm_job_id, job.state) == (A.CANCELLED, 4242, JobState.CANCELLED)


@pytest.mark.parametrize(("runs_on", "to", "ondemand_while_moving"), [
    (Capacity.SPOT, Capacity.ONDEMAND, 4),   # to on-demand: counted there from the decision on
    (Capacity.SPOT, Capacity.OWNED, 0),      # spot to owned: never on on-demand
    (Capacity.ONDEMAND, Capacity.OWNED, 4),  # on-demand to owned: runs on on-demand until requeued
])
def test_a_moving_job_counts_where_it_goes_and_on_demand_while_it_runs_there(
        store: sessionmaker[Session], runs_on: Capacity, to: Capacity, ondemand_while_moving: int) -> None:
    """The on-demand quota counted every moving job as on-demand (a spot job moving back to owned
    capacity too); a job moving off on-demand still holds its on-demand GPUs until Slurm requeues it."""
    from broker.config import Settings
    from broker.money.budgets import gpus_in_flight, gpus_in_flight_by

    with store.begin() as s:
        spec = JobSpec(name="train", kind="finetune", group="vision", time_limit_s=7200, gpus_per_node=4, nodes=1,
                       command=("python", "train.py"))
        job = st.create_job(s, key="gb-000000000001", spec=spec, owner_uid=1001, owner_name="ana", now=NOW,
                            capacity=runs_on, partition=runs_on.value)
        att = st.add_attempt(s, job, partition=runs_on.value, capacity=runs_on, now=NOW)
        lifecycle.attempt_submitted(s, job, att, 4242, NOW)
        lifecycle.attempt_running(s, job, att, "node1", NOW, NOW)
        assert gpus_in_flight(s, "vision") == (4, 4 if runs_on is Capacity.ONDEMAND else 0)
        lifecycle.attempt_moving(s, job, att, "own" if to is Capacity.OWNED else "ondemand", "why", NOW, capacity=to)
        s.flush()
        assert att.state == A.MOVING and job.state == JobState.RUNNING
        assert gpus_in_flight(s, "vision") == (4, ondemand_while_moving)
        by = gpus_in_flight_by(s, "vision", Settings())
        assert by[("class", to.value)] == 4 and ("class", runs_on.value) not in by


# -- a moving attempt, end to end --------------------------------------------------------
@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc)
    return w


def test_a_moving_attempt_still_runs_and_counts_as_ondemand(world: World) -> None:
    """While Slurm has not done the requeue yet, the attempt is moving: running (its cost runs on),
    and already on-demand for the quota."""
    from broker.money.budgets import gpus_in_flight

    world.svc.policy = policies.from_name("greedy")
    out = world.submit(time="10m", deadline_in_s=12 * 60)
    sid = out["slurm_job_id"]
    assert world.slurm.start(sid, node="spot1")
    world.tick()

    def refuse(ids: Any) -> None:
        raise SlurmError("Slurm busy", argv=["scontrol", "requeue"], returncode=1, stderr="busy")

    world.slurm.requeue = refuse  # type: ignore[method-assign]
    states: list[str] = []
    for _ in range(20):
        world.advance(15)
        world.tick()
        states = [a["state"] for a in show_job(world.svc, ROOT, out["id"])["attempts"]]
        if states == ["moving"]:
            break
    assert states == ["moving"]
    assert show_job(world.svc, ROOT, out["id"])["state"] == "running"
    assert world.status()["forecast"]["running_micros"] > 0
    with world.svc.sessions() as s:
        assert gpus_in_flight(s, "vision") == (1, 1)


def test_a_move_back_to_owned_capacity_is_asked_again_until_slurm_has_requeued_it(world: World) -> None:
    """A requeue Slurm refused (or a controller that was down) left a move to owned capacity moving for
    good: only a deadline job's move was asked again. Every moving attempt is, at each tick."""
    out = world.submit(time="1h")
    sid = out["slurm_job_id"]
    assert world.slurm.start(sid, node="spot1")
    world.tick()
    with world.svc.tx() as s:
        job = s.get(Job, out["id"])
        att = s.execute(select(Attempt).where(Attempt.job_id == job.id)).scalar_one()
        lifecycle.attempt_moving(s, job, att, "own", "room on owned nodes", world.clock.now(), capacity=Capacity.OWNED)
    asked: list[Any] = []
    real = world.slurm.requeue

    def refuse(ids: Any) -> None:
        asked.append(list(ids))
        raise SlurmError("Slurm busy", argv=["scontrol", "requeue"], returncode=1, stderr="busy")

    world.slurm.requeue = refuse  # type: ignore[method-assign]
    for _ in range(3):
        world.advance(15)
        world.tick()
    assert asked == [[sid]] * 3
    assert [a["state"] for a in show_job(world.svc, ROOT, out["id"])["attempts"]] == ["moving"]
    world.slurm.requeue = real  # type: ignore[method-assign]
    for _ in range(4):
        world.advance(15)
        world.tick()
    attempts = show_job(world.svc, ROOT, out["id"])["attempts"]
    assert [a["state"] for a in attempts][:1] == ["moved"] and attempts[1]["partition"] == "own", attempts
