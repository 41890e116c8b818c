"""The job list is made in a few queries for all its jobs, and says what each job's own summary says."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import event

from array_fakes import array_world, submit_array
from broker.db.models import Job
from broker.jobs.handlers import list_jobs
from broker.jobs.views import job_summary
from ledger_fakes import caller


def test_the_list_is_each_jobs_summary_in_a_fixed_number_of_queries(tmp_path: Path) -> None:
    w = array_world(f"sqlite:///{tmp_path / 'gb.db'}")
    plain = [w.submit(name=f"p{i}") for i in range(6)]
    submit_array(w, pieces="1-8")
    sid = plain[-1]["slurm_job_id"]
    assert sid is not None
    assert w.slurm.start(sid)  # the last plain job runs and is reclaimed: a second attempt
    w.tick()
    assert w.slurm.reclaim(sid)
    w.tick()
    w.tick()
    alice = caller("alice")
    statements: list[str] = []
    engine = w.svc.reads.kw["bind"]
    listener = lambda *a: statements.append(a[2])  # noqa: E731
    event.listen(engine, "before_cursor_execute", listener)
    try:
        listed = list_jobs(w.svc, alice, active=False)
    finally:
        event.remove(engine, "before_cursor_execute", listener)
    assert len(listed) == 7
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) <= 3, statements
    now = w.clock.now()
    with w.svc.read() as s:
        for row in listed:
            assert row == job_summary(s, s.get(Job, row["id"]), now), row["id"]
    assert any("pieces" in row for row in listed)
    assert {row["id"]: row["attempts"] for row in listed}[plain[-1]["id"]] == 2
