"""Migrations on both backends: a fresh database reaches head, and the models match the migrations."""

from __future__ import annotations

import io
import subprocess
import sys
import threading
import time
from contextlib import redirect_stdout
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Integer, MetaData, String, inspect, text

from broker.db.engine import make_engine
from broker.db.migrate import alembic_config, current_revision, head_revision, upgrade_to_head
from broker.db.schema import metadata

REPO = Path(__file__).resolve().parents[2]
TABLES = {
    "jobs", "attempts", "events", "lease", "alembic_version",
    # 0002: budgets and the ledger
    "semesters", "lab_groups", "group_members", "quotas", "prices", "budgets", "budget_alerts",
    "budget_holds", "ledger_runs", "charges", "reservation_releases",
    # 0003: node sessions and usage
    "node_sessions", "node_usage",
    # 0008: the notification outbox
    "outbox", "notify_cursor",
    # 0006: quotas per capacity class and GPU type
    "quota_limits",
    # 0009: arrays
    "array_batches", "array_pieces",
    # 0010: dashboard sign-in tokens
    "web_tokens",
    # 0013: dashboard browser sessions
    "web_sessions",
}


def schema_diff(url: str, metadata: MetaData) -> list[Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": False})
            return list(compare_metadata(ctx, metadata))
    finally:
        engine.dispose()


def test_fresh_database_reaches_head(db_url: str) -> None:
    assert current_revision(db_url) is None
    assert upgrade_to_head(db_url) == head_revision()
    assert current_revision(db_url) == head_revision()
    engine = make_engine(db_url)
    try:
        assert set(inspect(engine).get_table_names()) == TABLES
    finally:
        engine.dispose()
    upgrade_to_head(db_url)  # a second start changes nothing
    assert current_revision(db_url) == head_revision()


def test_models_match_migrations(migrated_url: str) -> None:
    assert schema_diff(migrated_url, metadata) == []


def test_the_comparison_would_see_a_difference(migrated_url: str) -> None:
    """Guard against a vacuous check: a model that drifts from the migration must show up."""
    drifted = MetaData(naming_convention=metadata.naming_convention)
    for table in metadata.sorted_tables:
        copy = table.to_metadata(drifted)
        if table.name == "jobs":
            copy.append_column(Column("colour", String(10), nullable=True))
            copy.c.kind.type = String(99)
        if table.name == "lease":
            copy.c.holder.type = Integer()
    kinds = {d[0] if isinstance(d, tuple) else d[0][0] for d in schema_diff(migrated_url, drifted)}
    assert "add_column" in kinds and "modify_type" in kinds


MIGRATOR = """
import sys, time
from broker.db.migrate import upgrade_to_head
url, start = sys.argv[1], float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))
print(upgrade_to_head(url))
"""


def test_two_daemons_migrating_at_once(db_url: str) -> None:
    """Two processes start on an empty database at the same instant: both succeed, the schema is made once."""
    start = time.time() + 3.0
    procs = [
        subprocess.Popen([sys.executable, "-c", MIGRATOR, db_url, str(start)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in results]
    assert [out.strip() for out, _ in results] == [head_revision()] * 2
    assert current_revision(db_url) == head_revision()
    assert schema_diff(db_url, metadata) == []


def test_threads_in_one_process_take_turns(db_url: str) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def start() -> None:
        try:
            barrier.wait()
            upgrade_to_head(db_url)
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test thread)
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert current_revision(db_url) == head_revision()


def test_downgrade_and_upgrade_again(migrated_url: str) -> None:
    command.downgrade(alembic_config(migrated_url), "base")
    assert current_revision(migrated_url) is None
    engine = make_engine(migrated_url)
    try:
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
    upgrade_to_head(migrated_url)
    assert schema_diff(migrated_url, metadata) == []


@pytest.mark.parametrize("url", ["sqlite:////nonexistent/x.db", "postgresql://gbroker@db.invalid/gbroker"])
def test_offline_sql_for_review(url: str) -> None:
    """`alembic upgrade --sql` works for both dialects, triggers included (for a DBA to read first)."""
    out = io.StringIO()
    with redirect_stdout(out):
        command.upgrade(alembic_config(url), "head", sql=True)
    sql = out.getvalue()
    assert "CREATE TABLE jobs" in sql and "CREATE TABLE attempts" in sql
    assert "append-only" in sql


def test_0005_gives_moving_attempts_their_own_state(db_url: str) -> None:
    """A running attempt marked "moving to on-demand" (and not ended) becomes ``moving``; downgrade gives the mark back."""
    from broker.states import AttemptState

    now = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
    moving = "moving to on-demand"
    command.upgrade(alembic_config(db_url), "0004")
    engine = make_engine(db_url)

    def attempts() -> list[tuple[int, str, str | None]]:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT number, state, outcome FROM attempts ORDER BY number")).all()
        return [(r[0], r[1], r[2]) for r in rows]

    try:
        # Rows as 0004 had them (written plainly: today's models have columns 0004 did not).
        with engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO jobs (key, owner_uid, owner_name, group_name, name, kind, spec_json, state, "
                "placement_policy, capacity, reclaims, failures, done_s, estimate_micros, reserved_micros, reason, "
                "created_at, updated_at) VALUES ('gb-000000000001', 1001, 'ana', 'vision', 't', 'finetune', '{}', "
                "'running', '', 'none', 0, 0, 0, 0, 0, '', :now, :now)"), {"now": now})
            job_id = conn.execute(text("SELECT id FROM jobs")).scalar_one()
            # (state, outcome, ended): being moved; moved (ended); reclaimed while being moved; plain running
            for number, (state, outcome, ended) in enumerate(
                    [(AttemptState.RUNNING, moving, False), (AttemptState.RECLAIMED, moving, True),
                     (AttemptState.COMPLETED, None, True), (AttemptState.RUNNING, None, False)], start=1):
                conn.execute(text(
                    "INSERT INTO attempts (job_id, number, partition, capacity, state, nodes, created_at, "
                    "ended_at, outcome, lost_s, slurm_restarts) VALUES (:job, :number, 'spot', 'spot', :state, '', "
                    ":now, :ended, :outcome, 0, 0)"),
                    {"job": job_id, "number": number, "state": state.value, "now": now,
                     "ended": now if ended else None, "outcome": outcome})
        before = attempts()
        command.upgrade(alembic_config(db_url), "0005")
        assert attempts() == [(1, "moving", None), (2, "reclaimed", moving), (3, "completed", None),
                              (4, "running", None)]
        command.downgrade(alembic_config(db_url), "0004")
        assert attempts() == before
    finally:
        engine.dispose()


def test_0012_fills_each_jobs_gpus_from_its_spec_and_admission_counts_a_row_without(db_url: str) -> None:
    from broker.config import Settings
    from broker.db.engine import session_factory
    from broker.money.budgets import gpus_in_flight, gpus_in_flight_by

    now = datetime(2026, 9, 1, 12, 0, tzinfo=UTC)
    command.upgrade(alembic_config(db_url), "0011")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            for key, spec, state, capacity in [
                ("gb-000000000001", '{"nodes": 2, "gpus_per_node": 4}', "running", "ondemand"),
                ("gb-000000000002", '{"gpus_per_node": 3}', "pending", "spot"),
                ("gb-000000000003", '{}', "completed", "spot"),
            ]:
                conn.execute(text(
                    "INSERT INTO jobs (key, owner_uid, owner_name, group_name, name, kind, spec_json, state, "
                    "placement_policy, capacity, partition, reclaims, failures, done_s, estimate_micros, "
                    "reserved_micros, reason, created_at, updated_at) VALUES (:key, 1001, 'ana', 'vision', 't', "
                    "'other', :spec, :state, '', :capacity, :capacity, 0, 0, 0, 0, 0, '', :now, :now)"),
                    {"key": key, "spec": spec, "state": state, "capacity": capacity, "now": now})
        command.upgrade(alembic_config(db_url), "0012")
        with engine.begin() as conn:
            assert conn.execute(text("SELECT key, gpus FROM jobs ORDER BY key")).all() == [
                ("gb-000000000001", 8), ("gb-000000000002", 3), ("gb-000000000003", 1)]
            conn.execute(text("UPDATE jobs SET gpus = NULL WHERE key = 'gb-000000000002'"))
        with session_factory(engine)() as s:  # a row without it counts what its spec says
            assert gpus_in_flight(s, "vision") == (11, 8)
            assert gpus_in_flight_by(s, "vision", Settings())[("class", "spot")] == 3
        command.downgrade(alembic_config(db_url), "0011")
        with engine.connect() as conn:
            assert "gpus" not in conn.execute(text("SELECT * FROM jobs")).keys()
    finally:
        engine.dispose()
