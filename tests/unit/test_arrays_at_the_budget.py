"""Budgets reach arrays: at its limit a group's arrays have their waiting pieces held in Slurm (one
hold per Slurm array of the job) and get no retry batch, raising the budget releases them and sends
the batch, and at 100 % with ``cancel`` the running pieces are cancelled, each run once. Also the
tick's one pass over many arrays, and how it falls back to one array at a time when that pass fails."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from array_fakes import array_world, submit_array
from broker.db.ledger_models import BudgetHold
from broker.db.models import Event
from broker.jobs import arrays, lifecycle
from broker.jobs.handlers import show_job
from ledger_fakes import ROOT, World


@pytest.fixture
def world(db_url: str) -> World:
    return array_world(db_url)


def set_budget(w: World, amount: str, **kw: Any) -> None:
    w.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": amount, **kw})


def held_tasks(w: World, array_id: int) -> set[int]:
    return {i for i, raw in w.slurm.arrays[array_id].items() if w.slurm.jobs_by_id[raw].held}


def open_holds(w: World) -> list[tuple[int, int]]:
    with w.svc.sessions() as s:
        return [(h.job_id, h.slurm_job_id) for h in s.execute(
            select(BudgetHold).where(BudgetHold.released_at.is_(None))).scalars()]


def events(w: World, job_id: int, kind: str) -> list[str]:
    with w.svc.sessions() as s:
        return [e.message for e in s.execute(select(Event).where(Event.job_id == job_id, Event.kind == kind)
                                                     .order_by(Event.id)).scalars()]


def test_a_group_at_its_budget_holds_an_arrays_waiting_pieces_sends_no_retry_and_release_resumes(world: World):
    w = world
    job = submit_array(w, pieces="1-4", max_retries=1)
    w.tick()
    (array_id,) = w.slurm.arrays
    t = {i: w.slurm.task(array_id, i) for i in range(1, 5)}
    w.slurm.start(t[1], "spot1")
    w.slurm.start(t[2], "spot2")
    w.advance(30)
    w.tick()
    # The admin cuts the budget under what the array has reserved: vision is at its limit.
    set_budget(w, "0.05")
    w.tick()
    assert open_holds(w) == [(job["id"], array_id)]  # one hold: the job's Slurm array, not a piece's run
    assert held_tasks(w, array_id) == {3, 4}
    assert not w.slurm.start(t[3], "spot3")  # Slurm does not start a held task
    w.tick()
    shown = show_job(w.svc, ROOT, job["id"])
    assert shown["state"] == "running" and "held by gbroker: the group is at its budget" in shown["reason"]
    # A running piece fails: its retry batch is stored but not submitted while the array is held.
    w.slurm.finish(t[2], exit_code=1)
    w.slurm.finish(t[1])
    w.tick()
    w.tick()
    shown = show_job(w.svc, ROOT, job["id"])
    assert len(w.slurm.arrays) == 1 and w.slurm.calls["sbatch"] == 1
    assert shown["state"] == "held", shown["reason"]
    assert shown["reason"].startswith("held by gbroker: the group is at its budget; 1/4 done"), shown["reason"]
    assert any("once the group's budget allows" in m for m in events(w, job["id"], "retry"))
    assert [p["state"] for p in shown["array"]["pieces"]] == ["done", "waiting", "pending", "pending"]
    assert open_holds(w) == [(job["id"], array_id)]  # held once, not again each tick
    # Money is back: released in Slurm, the retry batch goes out, everything runs to the end.
    set_budget(w, "1000")
    w.tick()
    assert open_holds(w) == [] and held_tasks(w, array_id) == set()
    assert events(w, job["id"], "budget_release")
    w.tick()
    retry = [a for a in w.slurm.arrays if a != array_id]
    assert len(retry) == 1 and w.slurm.requests[-1].array == "2"
    for raw in (t[3], t[4], w.slurm.task(retry[0], 2)):
        assert w.slurm.start(raw, "spot3")
    w.advance(10)
    w.tick()
    for raw in (t[3], t[4], w.slurm.task(retry[0], 2)):
        w.slurm.finish(raw)
    w.tick()
    w.tick()
    done = show_job(w.svc, ROOT, job["id"])
    assert done["state"] == "completed" and done["pieces"]["line"] == "4/4 done", done["reason"]


def test_at_100_percent_with_cancel_the_running_pieces_are_cancelled_once_and_the_waiting_held(world: World):
    w = world
    job = submit_array(w, pieces="1-4")
    w.tick()
    (array_id,) = w.slurm.arrays
    t = {i: w.slurm.task(array_id, i) for i in range(1, 5)}
    for i in (1, 2, 3):
        w.slurm.start(t[i], f"spot{i}")
    w.advance(30)
    w.tick()
    w.slurm.finish(t[1])
    w.tick()  # the finished piece is charged: there is spend now
    assert w.status()["spent_micros"] > 0
    set_budget(w, "0.000001", cancel_running=True)
    w.tick()
    assert held_tasks(w, array_id) == {4}
    assert all(w.slurm.jobs_by_id[t[i]].done for i in (2, 3))  # the running tasks, by array and index
    assert not w.slurm.jobs_by_id[t[4]].done  # the waiting piece is held, not cancelled
    assert len(events(w, job["id"], "budget_cancel")) == 1
    w.tick()
    w.tick()
    shown = show_job(w.svc, ROOT, job["id"])
    by_piece = {p["piece"]: p["state"] for p in shown["array"]["pieces"]}
    assert by_piece == {1: "done", 2: "cancelled", 3: "cancelled", 4: "pending"}
    assert shown["state"] == "held" and len(events(w, job["id"], "budget_cancel")) == 1
    # Raised again: the held piece runs and the array ends (cancelled: two of its pieces were).
    set_budget(w, "1000", cancel_running=True)
    w.tick()
    assert w.slurm.start(t[4], "spot4")
    w.advance(5)
    w.tick()
    w.slurm.finish(t[4])
    w.tick()
    w.tick()
    end = show_job(w.svc, ROOT, job["id"])
    assert end["state"] == "cancelled" and end["pieces"]["line"].startswith("2/4 done"), end["reason"]


def test_a_plain_jobs_hold_is_unchanged_next_to_an_array(world: World):
    w = world
    plain = w.submit(gpus=1)
    job = submit_array(w, pieces="1-2")
    w.tick()
    set_budget(w, "0.01")
    w.tick()
    (array_id,) = w.slurm.arrays
    assert sorted(open_holds(w)) == sorted([(plain["id"], plain["slurm_job_id"]), (job["id"], array_id)])
    assert show_job(w.svc, ROOT, plain["id"])["state"] == "held"
    assert show_job(w.svc, ROOT, job["id"])["state"] == "held"


# -- the tick's one pass ---------------------------------------------------------------------------------
def test_many_arrays_are_followed_in_one_pass_and_a_bad_one_does_not_stop_the_others(world: World, monkeypatch):
    w = world
    jobs = [submit_array(w, pieces="1-3") for _ in range(3)]
    w.tick()
    ids = sorted(w.slurm.arrays)
    for a in ids:
        w.slurm.start(w.slurm.task(a, 1), "spot1")
    real = lifecycle.piece_seen
    bad = jobs[1]["id"]

    def piece_seen(p: Any, *args: Any, **kw: Any) -> bool:
        if p.job_id == bad:
            raise RuntimeError("a broken row")
        return real(p, *args, **kw)

    monkeypatch.setattr(lifecycle, "piece_seen", piece_seen)
    w.tick()
    lines = {j["id"]: show_job(w.svc, ROOT, j["id"])["pieces"]["line"] for j in jobs}
    assert lines[jobs[0]["id"]] == lines[jobs[2]["id"]] == "0/3 done, 1 running, 2 pending"
    assert lines[bad] == "0/3 done, 3 pending"
    assert bad not in w.svc.array_seen and jobs[0]["id"] in w.svc.array_seen
    monkeypatch.setattr(lifecycle, "piece_seen", real)
    w.tick()
    assert show_job(w.svc, ROOT, bad)["pieces"]["line"] == "0/3 done, 1 running, 2 pending"


def test_the_ranges_the_queue_does_not_show_are_the_gaps_between_its_runs():
    assert arrays._runs_of((5, 1, 2, 3, 9, 10)) == [(1, 3), (5, 5), (9, 10)]
    assert arrays._task_runs("17-1000%64") == [(17, 1000)]
    assert arrays._task_runs("3,5-9,10,1") == [(1, 1), (3, 3), (5, 10)]
    assert arrays._task_runs("5-11:3") == [(5, 5), (8, 8), (11, 11)]  # a step: through the grammar
    assert arrays._task_runs("x-y") == []  # unreadable: asked about again (as before)
    assert arrays._merge([(17, 1000), (3, 3), (1, 1), (2, 2), (4, 16)]) == [(1, 1000)]
    far = arrays.FAR
    assert arrays._gaps([(1, 3), (5, 5)]) == [(-far, 0), (4, 4), (6, far)]
    assert arrays._gaps([]) == [(-far, far)]
    listed = arrays._Listed()
    row, later = object(), object()
    listed.alone[(7, 2)] = (1, row)  # type: ignore[assignment]
    listed.spans[7] = [(2, 9, 2, later)]  # type: ignore[list-item]
    assert listed.get(7, 2) is later and listed.get(7, 5) is later and listed.get(7, 10) is None
    assert listed.get(8, 2) is None and listed.runs(7) == [(2, 9)]


def test_array_tasks_are_cancelled_by_array_and_index_not_by_their_own_ids():
    from broker.slurm.cli_backend import CliBackend
    from broker.slurm.runner import CompletedRun

    calls: list[list[str]] = []

    class Recording:
        def run(self, argv: Any, *, timeout_s: Any = None, env: Any = None, user: Any = None,
                input: Any = None) -> CompletedRun:  # noqa: A002 - the runner's own keyword
            calls.append(list(argv))
            return CompletedRun(list(argv), "", "", 0, 0.0)

    backend = CliBackend(Recording())  # type: ignore[arg-type]
    backend.cancel_tasks([(120, 2), (120, 3), (130, 1)])
    backend.cancel_tasks([])
    assert [c[1:] for c in calls] == [["120_2", "120_3", "130_1"]] and calls[0][0].endswith("scancel")


def test_an_array_id_is_verified_by_its_tasks_rows(world: World):
    from broker.ownership import verified

    w = world
    job = submit_array(w, pieces="1-3")
    w.tick()
    (array_id,) = w.slurm.arrays
    w.slurm.start(w.slurm.task(array_id, 2), "spot2")
    with w.svc.sessions() as s:
        from broker.db.models import Job

        key = s.get(Job, job["id"]).key  # type: ignore[union-attr]
    assert verified(w.svc, [(array_id, key, "alice")]) == [array_id]
    assert verified(w.svc, [(array_id, key, "bob")]) == []  # shown as alice's: not bob's job
