"""The store on both backends (SQLite file and a real PostgreSQL server): CRUD, keys, states, lease, events."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from broker.db import store as st
from broker.db.engine import SQLITE_BUSY_TIMEOUT_MS, default_db_url, make_engine, session_factory
from broker.db.models import AppendOnlyError, Attempt, Event, Job
from broker.spec import JobSpec
from broker.states import AttemptState, JobState
from policies.base import Capacity

NOW = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]


def spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {"name": "train", "kind": "finetune", "group": "vision", "time_limit_s": 7200,
                                "gpus_per_node": 4, "nodes": 1, "command": ("python", "train.py")}
    base.update(kw)
    return JobSpec(**base)


def new_job(session: Session, key: str = "gb-000000000001", **kw: Any) -> Job:
    args: dict[str, Any] = {"key": key, "spec": spec(), "owner_uid": 1001, "owner_name": "ana", "now": NOW}
    args.update(kw)
    return st.create_job(session, **args)


# --------------------------------------------------------------------------- jobs


def test_create_and_read_back(store: sessionmaker[Session]) -> None:
    deadline = datetime(2026, 9, 3, 0, 0, tzinfo=timezone(timedelta(hours=2)))
    with store.begin() as s:
        job = new_job(s, spec=spec(deadline=deadline.astimezone(UTC)), estimate_micros=10**15,
                      partition="gpu-spot", capacity=Capacity.SPOT, placement_policy="cheapest")
        job_id = job.id
    with store() as s:
        job2 = st.get_job(s, job_id)
        assert job2 is not None
        assert (job2.key, job2.owner_uid, job2.owner_name, job2.group_name, job2.name, job2.kind) == (
            "gb-000000000001", 1001, "ana", "vision", "train", "finetune")
        assert job2.state is JobState.ADMITTED
        assert job2.capacity is Capacity.SPOT and job2.partition == "gpu-spot"
        assert job2.estimate_micros == 10**15 and job2.reserved_micros == 0
        assert job2.deadline == deadline and job2.deadline.tzinfo == UTC
        assert job2.created_at == NOW and job2.created_at.tzinfo == UTC
        assert job2.finished_at is None and job2.reclaims == 0 and job2.done_s == 0
        assert '"group":"vision"' in job2.spec_json
        assert st.get_job_by_key(s, "gb-000000000001") is job2
        assert st.get_job(s, 999_999) is None and st.get_job_by_key(s, "gb-nope") is None
        assert [e.kind for e in st.job_events(s, job_id)] == ["created"]


def test_existing_key_returns_the_existing_job(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        first = new_job(s).id
    with store.begin() as s:
        again = new_job(s, now=NOW + timedelta(minutes=5))
        assert again.id == first and again.created_at == NOW
    with store() as s:
        assert len(st.list_jobs(s)) == 1
        assert len(st.job_events(s, first)) == 1  # the retry logged nothing


def test_existing_key_with_another_request_or_owner_is_refused(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        new_job(s)
    with store() as s:
        with pytest.raises(st.IdempotencyConflict, match="different request"):
            new_job(s, spec=spec(nodes=2))
        with pytest.raises(st.IdempotencyConflict, match="another user"):
            new_job(s, owner_uid=1002)


def test_a_retry_is_the_same_request_when_another_release_stored_it_with_its_defaults(
        store: sessionmaker[Session]) -> None:
    import json

    with store.begin() as s:
        first = new_job(s)
        stored = json.loads(first.spec_json)
        stored["signal_lead_s"] = 120  # an earlier release wrote every default out
        first.spec_json = json.dumps(stored, sort_keys=True, separators=(",", ":"))
    with store() as s:
        assert new_job(s).id == first.id
        with pytest.raises(st.IdempotencyConflict, match="different request"):
            new_job(s, spec=spec(nodes=2))


def test_database_itself_refuses_a_duplicate_key(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        new_job(s)
    with store() as s:
        dup = Job(key="gb-000000000001", owner_uid=1, owner_name="x", group_name="g", name="n", kind="other",
                  spec_json="{}", state=JobState.ADMITTED, created_at=NOW, updated_at=NOW)
        s.add(dup)
        with pytest.raises(IntegrityError):
            s.flush()


def test_concurrent_create_with_one_key_makes_one_job(store: sessionmaker[Session]) -> None:
    barrier = threading.Barrier(4)
    ids: list[int] = []
    errors: list[BaseException] = []

    def submit() -> None:
        try:
            barrier.wait()
            with store.begin() as s:
                ids.append(new_job(s, key="gb-racing000001").id)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test thread)
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(ids) == 4 and len(set(ids)) == 1
    with store() as s:
        assert len(st.list_jobs(s)) == 1


def test_list_jobs_and_active_jobs(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        a = new_job(s, key="gb-a")
        b = new_job(s, key="gb-b", owner_uid=2002, owner_name="bo", spec=spec(group="physics"))
        c = new_job(s, key="gb-c")
        st.set_job_state(s, c, JobState.CANCELLED, "owner cancelled", NOW)
    with store() as s:
        assert [j.key for j in st.list_jobs(s)] == ["gb-c", "gb-b", "gb-a"]
        assert [j.key for j in st.list_jobs(s, owner_uid=1001)] == ["gb-c", "gb-a"]
        assert [j.key for j in st.list_jobs(s, group_name="physics")] == ["gb-b"]
        assert [j.key for j in st.list_jobs(s, states=[JobState.CANCELLED])] == ["gb-c"]
        assert [j.key for j in st.list_jobs(s, limit=1)] == ["gb-c"]
        assert [j.id for j in st.active_jobs(s)] == [a.id, b.id]


# --------------------------------------------------------------------------- states


def test_state_moves_are_logged(store: sessionmaker[Session]) -> None:
    later = NOW + timedelta(hours=1)
    with store.begin() as s:
        job = new_job(s)
        assert st.set_job_state(s, job, JobState.PENDING, "sbatch accepted", NOW)
        assert st.set_job_state(s, job, JobState.RUNNING, "", NOW)
        assert not st.set_job_state(s, job, JobState.RUNNING, "", NOW)  # repeat: no trail
        assert st.set_job_state(s, job, JobState.COMPLETED, "exit 0", later)
        job_id = job.id
    with store() as s:
        done = st.get_job(s, job_id)
        assert done is not None
        assert done.state is JobState.COMPLETED and done.finished_at == later and done.reason == "exit 0"
        events = st.job_events(s, job_id)
        assert [e.kind for e in events] == ["created", "state", "state", "state"]
        assert events[1].message == "admitted -> pending: sbatch accepted"
        assert '"to": "completed"' in events[3].data_json


def test_illegal_state_move_is_refused(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        job = new_job(s)
        st.set_job_state(s, job, JobState.CANCELLED, "", NOW)
    with store() as s:
        fresh = st.get_job(s, job.id)
        assert fresh is not None
        with pytest.raises(st.IllegalTransition, match="cancelled to running"):
            st.set_job_state(s, fresh, JobState.RUNNING, "", NOW)
        assert fresh.state is JobState.CANCELLED
        with pytest.raises(st.IllegalTransition):
            st.set_job_state(s, fresh, JobState.ADMITTED, "", NOW)
        assert len(st.job_events(s, job.id)) == 2  # created, cancelled: the refusals logged nothing


def test_stored_state_is_the_enum_value(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        job = new_job(s)
        st.set_job_state(s, job, JobState.PENDING, "", NOW)
        st.set_job_state(s, job, JobState.DEADLINE_MISSED, "too late", NOW)
    with store() as s:
        raw = s.execute(text("SELECT state, capacity FROM jobs")).one()
        assert tuple(raw) == ("deadline_missed", "none")


# --------------------------------------------------------------------------- attempts


def test_attempts_are_numbered_and_share_slurm_ids(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        job = new_job(s)
        a1 = st.add_attempt(s, job, partition="gpu-spot", capacity=Capacity.SPOT, now=NOW)
        a1.slurm_job_id = 2**40  # BigInteger
        a1.state = AttemptState.RECLAIMED
        a2 = st.add_attempt(s, job, partition="gpu-spot", capacity=Capacity.SPOT, now=NOW)
        a2.slurm_job_id = 2**40  # Slurm requeued under the same id
        a2.slurm_restarts = 1
        a3 = st.add_attempt(s, job, partition="gpu-ondemand", capacity=Capacity.ONDEMAND, now=NOW)
        assert [a.number for a in (a1, a2, a3)] == [1, 2, 3]
        assert [a.number for a in job.attempts] == [1, 2, 3]
        assert a3.state is AttemptState.SUBMITTING and a3.slurm_job_id is None
        job_id = job.id
    with store() as s:
        assert [a.number for a in st.job_attempts(s, job_id)] == [1, 2, 3]
        same = st.attempts_by_slurm_id(s, [2**40])
        assert [(a.number, a.slurm_restarts) for a in same] == [(1, 0), (2, 1)]
        assert st.attempts_by_slurm_id(s, []) == []


def test_attempt_number_is_unique_per_job(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        job = new_job(s)
        st.add_attempt(s, job, partition=None, capacity=Capacity.SPOT, now=NOW)
        job_id = job.id
    with store() as s:
        s.add(Attempt(job_id=job_id, number=1, capacity=Capacity.SPOT, state=AttemptState.SUBMITTING,
                      created_at=NOW))
        with pytest.raises(IntegrityError):
            s.flush()


def test_foreign_keys_are_enforced(store: sessionmaker[Session]) -> None:
    with store() as s:
        s.add(Attempt(job_id=424242, number=1, capacity=Capacity.SPOT, state=AttemptState.SUBMITTING,
                      created_at=NOW))
        with pytest.raises(IntegrityError):
            s.flush()


def test_naive_datetimes_are_refused(store: sessionmaker[Session]) -> None:
    with store() as s, pytest.raises(Exception, match="naive datetime"):
        new_job(s, now=datetime(2026, 9, 1, 12, 0))


# --------------------------------------------------------------------------- events


def test_events_are_append_only(store: sessionmaker[Session]) -> None:
    with store.begin() as s:
        job = new_job(s)
        ev = st.add_event(s, "note", "hello", now=NOW, job_id=job.id, data={"n": 1})
        st.add_event(s, "daemon", "started", now=NOW)  # an event without a job
    with store() as s:
        stored = s.get(Event, ev.id)
        assert stored is not None and stored.data_json == '{"n": 1}'
        stored.message = "rewritten"
        with pytest.raises(AppendOnlyError):
            s.flush()
        s.rollback()
        s.delete(s.get(Event, ev.id))
        with pytest.raises(AppendOnlyError):
            s.flush()
    # and the database refuses too, whatever the client
    for sql in ("UPDATE events SET message = 'x'", "DELETE FROM events"):
        with store() as s, pytest.raises(DBAPIError, match="append-only"):
            s.execute(text(sql))
    with store() as s:
        assert s.execute(text("SELECT count(*) FROM events")).scalar_one() == 3
        assert [e.message for e in st.job_events(s, job.id)] == ["job gb-000000000001 created as admitted",
                                                                     "hello"]


# --------------------------------------------------------------------------- lease


def test_lease_two_holders_and_expiry(store: sessionmaker[Session]) -> None:
    with store() as s:
        assert st.acquire_lease(s, "daemon", "host-a:1", 30, NOW)
        assert st.lease_holder(s, "daemon", NOW) == "host-a:1"
        assert not st.acquire_lease(s, "daemon", "host-b:2", 30, NOW + timedelta(seconds=10))
        assert st.acquire_lease(s, "daemon", "host-a:1", 30, NOW + timedelta(seconds=10))  # mine: extends
        assert not st.acquire_lease(s, "daemon", "host-b:2", 30, NOW + timedelta(seconds=39))
        assert st.renew_lease(s, "daemon", "host-a:1", 30, NOW + timedelta(seconds=20))
        # host-a stops renewing; at expiry host-b takes over
        assert st.lease_holder(s, "daemon", NOW + timedelta(seconds=50)) is None
        assert st.acquire_lease(s, "daemon", "host-b:2", 30, NOW + timedelta(seconds=50))
        assert not st.renew_lease(s, "daemon", "host-a:1", 30, NOW + timedelta(seconds=51))
        assert not st.release_lease(s, "daemon", "host-a:1")
        assert st.lease_holder(s, "daemon", NOW + timedelta(seconds=51)) == "host-b:2"
        assert st.release_lease(s, "daemon", "host-b:2")
        assert st.acquire_lease(s, "daemon", "host-a:1", 30, NOW + timedelta(seconds=52))
        assert st.acquire_lease(s, "other-lease", "host-b:2", 30, NOW)  # names are independent


def test_lease_is_visible_to_other_sessions(store: sessionmaker[Session]) -> None:
    with store() as a, store() as b:
        assert st.acquire_lease(a, "daemon", "A", 30, NOW)
        assert st.lease_holder(b, "daemon", NOW) == "A"
        assert not st.acquire_lease(b, "daemon", "B", 30, NOW)


def race_for_lease(store: sessionmaker[Session], name: str, contenders: int) -> list[str]:
    """Start `contenders` threads at one barrier, each acquiring `name`; return the winners."""
    barrier = threading.Barrier(contenders)
    wins: list[str] = []
    errors: list[BaseException] = []

    def contend(holder: str) -> None:
        try:
            with store() as s:
                barrier.wait()
                if st.acquire_lease(s, name, holder, 30, NOW):
                    wins.append(holder)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test thread)
            errors.append(exc)

    threads = [threading.Thread(target=contend, args=(f"h{i}",)) for i in range(contenders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return wins


@pytest.mark.parametrize("expired", [False, True], ids=["free", "expired"])
def test_concurrent_acquire_threads_one_wins(store: sessionmaker[Session], expired: bool) -> None:
    for r in range(10):
        name = f"race-{r}"
        if expired:
            with store() as s:
                assert st.acquire_lease(s, name, "old-holder", 1, NOW - timedelta(hours=1))
        wins = race_for_lease(store, name, contenders=4)
        assert len(wins) == 1, f"round {r}: winners {wins}"
        with store() as s:
            assert st.lease_holder(s, name, NOW) == wins[0]


CONTENDER = """
import sys, time
from datetime import datetime, timezone
from broker.db.engine import make_engine, session_factory
from broker.db import store
from broker.db.models import Lease
from sqlalchemy import select
url, holder, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
sessions = session_factory(make_engine(url))
now = datetime(2026, 9, 1, 12, 0, tzinfo=timezone.utc)
with sessions() as s:
    s.execute(select(Lease.name)).all()  # connect before the start line
    time.sleep(max(0.0, start - time.time()))
    print("won" if store.acquire_lease(s, "daemon", holder, 30, now) else "lost")
"""


def test_concurrent_acquire_processes_one_wins(migrated_url: str) -> None:
    start = time.time() + 3.0
    procs = [
        subprocess.Popen([sys.executable, "-c", CONTENDER, migrated_url, f"proc-{i}", str(start)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        for i in range(4)
    ]
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    outcomes = [out.strip() for out, _ in results]
    assert sorted(outcomes) == ["lost", "lost", "lost", "won"]
    winner = f"proc-{outcomes.index('won')}"
    with session_factory(make_engine(migrated_url))() as s:
        assert st.lease_holder(s, "daemon", NOW) == winner


# --------------------------------------------------------------------------- engine


def test_sqlite_engine_settings(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "gbroker.db"
    eng = make_engine(f"sqlite:///{path}")
    with eng.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == SQLITE_BUSY_TIMEOUT_MS == 20_000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    assert path.parent.is_dir()
    eng.dispose()


def test_unsupported_url_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        make_engine("mysql://x@localhost/db")


def test_default_db_url() -> None:
    assert default_db_url(uid=0, env={}) == "sqlite:////var/lib/gbroker/gbroker.db"
    assert default_db_url(uid=1001, env={"XDG_STATE_HOME": "/home/ana/.state", "HOME": "/home/ana"}) == (
        "sqlite:////home/ana/.state/gbroker/gbroker.db")
    assert default_db_url(uid=1001, env={"HOME": "/home/ana"}) == "sqlite:////home/ana/.local/state/gbroker/gbroker.db"
    assert default_db_url(uid=1001, env={"XDG_STATE_HOME": "rel", "HOME": "/home/ana"}) == (
        "sqlite:////home/ana/.local/state/gbroker/gbroker.db")
