"""Admission's running totals (broker/money/totals.py): exact against the database, and O(1) in the queue.

What a group's jobs hold and their GPUs in flight are kept in memory and added
to by each submission; here they are compared, to the micro-unit and the GPU,
with what the database adds up itself, through submissions, starts, reclaims,
charges, cancellations, refusals and a daemon restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from broker.errors import AdmissionRefused
from broker.jobs.handlers import cancel_jobs
from broker.money import budgets as B
from broker.money import totals
from ledger_fakes import ROOT, World, setup_lab


@pytest.fixture
def world(tmp_path: Path) -> World:
    w = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(w.svc, vision_budget="100")
    w.ops()["quota_set"](ROOT, {"group": "vision", "max_gpus": 40, "max_ondemand_gpus": 8})
    return w


def _kept_and_asked(w: World, account: str = "vision") -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(what admission keeps, what the database adds up now), each as (holdings, GPU rows, moving off on-demand)."""
    def shape(rows: list[tuple[Any, ...]], flight: B.InFlight) -> tuple[Any, ...]:
        # The plain rule's row is its sum (the rest of it is not read); a job that goes on, all of it.
        held = [(None, int(r[-1])) if r[0] is None else (*r[:-1], int(r[-1])) for r in rows]
        return (sorted(held, key=repr), sorted(flight.rows, key=repr), flight.moving_off_ondemand)

    with w.svc.read() as s:
        kept = shape(totals.holdings(s, account), totals.in_flight(s, account))
    with w.svc.read() as s:
        asked = shape(B.holdings(s, account), B.in_flight(s, account))
    return kept, asked


def _reserved(w: World) -> int:
    return int(w.status()["reserved_micros"])


def test_the_totals_agree_with_the_database_through_a_jobs_whole_life(world: World) -> None:
    w = world
    ids = [w.submit(gpus=g, time="1h")["slurm_job_id"] for g in (1, 2, 4)]
    w.submit(gpus=1, time="2h", interruptible=False)
    kept, asked = _kept_and_asked(w)
    assert kept == asked and asked[0][0][-1] > 0  # something is held
    w.tick()
    for sid in ids:
        w.slurm.start(sid)
    w.advance(600)
    assert w.slurm.reclaim(ids[0])  # goes on: holds its next attempt
    w.tick()
    assert _kept_and_asked(w)[0] == _kept_and_asked(w)[1]
    w.submit(gpus=3, time="30m")  # added to the totals the tick's commit made stale: read again
    kept, asked = _kept_and_asked(w)
    assert kept == asked
    w.slurm.finish(ids[1])
    w.advance(60)
    w.tick()
    cancel_jobs(w.svc, ROOT, [1])  # its reservation released
    w.submit(gpus=2, time="1h")
    kept, asked = _kept_and_asked(w)
    assert kept == asked


def test_after_a_restart_the_totals_are_read_again_and_agree_to_the_micro_unit(world: World) -> None:
    w = world
    for g in (1, 2, 3):
        w.submit(gpus=g, time="90m")
    before = _reserved(w)
    kept, _ = _kept_and_asked(w)
    w.restart()
    assert _kept_and_asked(w) == (kept, kept)
    assert _reserved(w) == before == sum(row[-1] for row in kept[0])
    w.submit(gpus=1, time="90m")
    kept, asked = _kept_and_asked(w)
    assert kept == asked


def test_a_refused_submission_adds_nothing(world: World) -> None:
    w = world
    for _ in range(5):
        w.submit(gpus=8, time="10m")
    with pytest.raises(AdmissionRefused, match="quota is 40 GPUs at once; 40 are queued or running"):
        w.submit(gpus=1, time="10m")
    kept, asked = _kept_and_asked(w)
    assert kept == asked
    assert sum(g for *_, g in kept[1]) == 40


def test_an_admission_reads_no_queued_job_once_the_totals_are_kept(world: World) -> None:
    """The same statements per submission with 5 or 300 jobs queued, none of them the sums over the queue."""
    w = world
    w.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "100000"})
    w.ops()["quota_set"](ROOT, {"group": "vision", "max_gpus": 100_000, "max_ondemand_gpus": 100_000})
    engine = w.svc.sessions.kw["bind"].engine
    statements: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    def one_submission() -> list[str]:
        statements.clear()
        w.submit(time="10m")
        return list(statements)

    w.submit(time="10m")
    event.listen(engine, "after_cursor_execute", seen)
    try:
        few = [one_submission() for _ in range(5)][-1]
        for _ in range(300):
            w.submit(time="10m")
        many = one_submission()
    finally:
        event.remove(engine, "after_cursor_execute", seen)
    assert len(few) == len(many)
    assert not [q for q in many if "sum(jobs.gpus)" in q.lower() or "reservation_releases" in q.lower()]
    kept, asked = _kept_and_asked(w)
    assert kept == asked and sum(g for *_, g in kept[1]) == 307


def test_the_totals_under_postgres_too(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc, vision_budget="100")
    for g in (1, 2):
        w.submit(gpus=g, time="1h")
    kept, asked = _kept_and_asked(w)
    assert kept == asked and sum(g for *_, g in kept[1]) == 3
