"""The ledger on both databases (SQLite and a real PostgreSQL): append-only, keyed once, charged from sacct.

Slurm is the in-memory fake (tests/unit/ledger_fakes.py); the real cluster is
in tests/integration/test_budgets.py.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from broker.db.engine import make_engine, session_factory
from broker.db.ledger_models import Charge, LedgerRun
from broker.db.migrate import upgrade_to_head
from broker.db.models import AppendOnlyError
from broker.errors import SpecError
from broker.money import ledger
from ledger_fakes import ROOT, World, setup_lab

T = datetime(2026, 10, 1, 8, 0, tzinfo=UTC)


def _charge(**kw: Any) -> Charge:
    base: dict[str, Any] = dict(
        line_key="run:1:0:1", slurm_job_id=1, run_index=0, job_id=None, attempt_id=None, account="vision",
        user_name="alice", kind="other", partition="spot", capacity="spot", node="", tag="useful",
        period_start=T, period_end=T + timedelta(seconds=60), seconds=60, gpus=1, price_micros=3_600_000,
        amount_micros=60_000, ondemand_micros=120_000, created_at=T,
    )
    base.update(kw)
    return Charge(**base)


@pytest.fixture
def sessions(db_url: str) -> Any:
    upgrade_to_head(db_url)
    engine = make_engine(db_url)
    yield session_factory(engine)
    engine.dispose()


def test_ledger_lines_are_append_only_in_the_database(sessions: Any) -> None:
    with sessions.begin() as s:
        s.add(_charge())
    for sql in ("UPDATE charges SET amount_micros = 1", "DELETE FROM charges"):
        with pytest.raises(DBAPIError, match="append-only"):
            with sessions.begin() as s:
                s.execute(text(sql))
    with pytest.raises(AppendOnlyError):
        with sessions.begin() as s:
            c = s.execute(select(Charge)).scalar_one()
            c.amount_micros = 0
    with sessions() as s:
        assert s.execute(select(Charge.amount_micros)).scalar_one() == 60_000


def test_a_line_cannot_land_twice(sessions: Any) -> None:
    with sessions.begin() as s:
        s.add(_charge())
    with pytest.raises(IntegrityError):  # same (slurm job, run, period start), another line key
        with sessions.begin() as s:
            s.add(_charge(line_key="other"))
    with pytest.raises(IntegrityError):  # same line key
        with sessions.begin() as s:
            s.add(_charge(slurm_job_id=2))


def test_reclaimed_job_is_charged_per_run_once_across_restarts(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc)
    r = w.submit()
    sid = r["slurm_job_id"]
    w.tick()
    assert w.slurm.start(sid)
    w.tick()
    w.advance(100)
    assert w.slurm.reclaim(sid)  # NODE_FAIL, requeued under the same id
    w.tick()
    w.restart()
    w.tick()
    assert w.slurm.start(sid, node="spot2")
    w.tick()
    w.advance(40)
    assert w.slurm.finish(sid)
    for _ in range(3):
        w.tick()
    w.restart()
    w.tick()
    lines = w.lines()
    assert [(ln["run_index"], ln["seconds"], ln["tag"], ln["amount_micros"]) for ln in lines] == [
        (0, 100, "lost", 100_000),  # $3.60 per GPU-hour = 1000 micro-units a second
        (1, 40, "useful", 40_000),
    ]
    st = w.status()
    assert (st["spent_micros"], st["reserved_micros"]) == (140_000, 0)
    with w.svc.sessions() as s:
        assert s.execute(select(LedgerRun.run_index).order_by(LedgerRun.run_index)).scalars().all() == [0, 1]


def _ran_twice_unseen(w: World, end_first_run: Callable[[int], None], second_node: str = "spot1") -> int:
    """A job submitted and queued; then, while the controller does not answer gbroker, run
    100 s, that run ended by ``end_first_run(slurm id)``, and run again 40 s to completion;
    then three ticks with the controller back. The job's Slurm id."""
    setup_lab(w.svc)
    sid = w.submit()["slurm_job_id"]
    w.tick()
    w.slurm.down = True
    w.tick()
    assert w.slurm.start(sid)
    w.advance(100)
    end_first_run(sid)
    assert w.slurm.start(sid, node=second_node)
    w.advance(40)
    assert w.slurm.finish(sid)
    w.slurm.down = False
    for _ in range(3):
        w.advance(30)
        w.tick()
    return sid


def test_a_job_slurm_ran_again_unseen_is_settled_run_by_run_and_not_run_a_third_time(db_url: str) -> None:
    """Started, reclaimed, requeued, run again and completed, all while the controller did not
    answer gbroker: each run is its own attempt and is charged; the job is done, not resubmitted."""
    from broker.db.models import Attempt, Job

    w = World(db_url)

    def reclaim(sid: int) -> None:
        assert w.slurm.reclaim(sid)

    sid = _ran_twice_unseen(w, reclaim, second_node="spot2")
    with w.svc.sessions() as s:
        job = s.execute(select(Job)).scalar_one()
        attempts = s.execute(select(Attempt).order_by(Attempt.number)).scalars().all()
        assert job.state.value == "completed", (job.state, job.reason)
        assert [(a.slurm_job_id, a.slurm_restarts, a.state.value) for a in attempts] == [
            (sid, 0, "reclaimed"), (sid, 1, "completed")]
        assert job.reclaims == 1
    assert sorted(w.slurm.jobs_by_id) == [sid], "no new submission for a job that already completed"
    assert [(ln["run_index"], ln["seconds"], ln["tag"]) for ln in w.lines()] == [(0, 100, "lost"), (1, 40, "useful")]


def test_runs_slurm_made_unseen_past_the_continuation_limit_are_settled_and_do_not_fail_the_job(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that requeued itself and ran to the end while the controller did not answer:
    the limit on continuations stops a loop still going, not runs that already happened
    (each is settled and charged, and the job ends as its last run did)."""
    from broker.db.models import Attempt, Event, Job
    from broker.jobs import lifecycle

    monkeypatch.setattr(lifecycle, "MAX_CONTINUATIONS", 0)
    w = World(db_url)

    def requeue_itself(sid: int) -> None:
        w.slurm.down = False  # scontrol requeue from inside the job reaches Slurm; gbroker does not tick
        w.slurm.requeue([sid])
        w.slurm.down = True

    sid = _ran_twice_unseen(w, requeue_itself)
    with w.svc.sessions() as s:
        job = s.execute(select(Job)).scalar_one()
        attempts = s.execute(select(Attempt).order_by(Attempt.number)).scalars().all()
        events = s.execute(select(Event.message).where(Event.job_id == job.id)).scalars().all()
        assert job.state.value == "completed", (job.state, job.reason)
        assert [(a.slurm_restarts, a.state.value) for a in attempts] == [(0, "continued"), (1, "completed")]
        assert not [e for e in events if "stopped after" in e], events
    assert sorted(w.slurm.jobs_by_id) == [sid]
    assert [(ln["run_index"], ln["seconds"]) for ln in w.lines()] == [(0, 100), (1, 40)]


def test_price_change_in_the_middle_of_a_running_job_is_charged_in_two_parts(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc)
    sid = w.submit()["slurm_job_id"]
    w.tick()
    w.slurm.start(sid)
    w.tick()
    w.advance(30)
    w.ops()["price_set"](ROOT, {"partition": "spot", "capacity": "spot", "price": "7.20", "effective": "+30s"})
    w.advance(90)
    w.slurm.finish(sid)
    w.tick()
    lines = w.lines()
    assert [(ln["seconds"], ln["price_micros"], ln["amount_micros"]) for ln in lines] == [
        (60, 3_600_000, 60_000), (60, 7_200_000, 120_000)
    ]
    assert lines[1]["period_start"] == "2026-10-01T08:01:00Z"


def test_a_price_cannot_take_effect_over_time_already_charged(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc)
    sid = w.submit()["slurm_job_id"]
    w.tick()
    w.slurm.start(sid)
    w.advance(60)
    w.slurm.finish(sid)
    w.tick()
    with pytest.raises(SpecError, match="already made at the old price") as refused:
        w.ops()["price_set"](ROOT, {"partition": "spot", "capacity": "spot", "price": "9", "effective": "2026-09-15"})
    assert refused.value.hint.startswith("give --from 2026-10-01T08:01:00Z or later, e.g. now"), refused.value.hint
    w.ops()["price_set"](ROOT, {"partition": "spot", "capacity": "spot", "price": "9", "effective": "now"})


def test_a_refused_price_time_never_suggests_a_time_that_is_refused_too(db_url: str) -> None:
    """Charged time can run past now (billing rounds a run up): the hint names the first time that works."""
    w = World(db_url)
    setup_lab(w.svc)
    sid = w.submit()["slurm_job_id"]
    w.tick()
    w.slurm.start(sid)
    w.advance(60)
    w.slurm.finish(sid)
    w.tick()
    with w.svc.tx() as s:
        line = s.execute(select(Charge)).scalars().first()
        assert line is not None
        ahead = {c.key: getattr(line, c.key) for c in Charge.__table__.columns if c.key != "id"}
        end = w.svc.clock.now() + timedelta(minutes=59)
        ahead.update(line_key=line.line_key + "-ahead", period_start=line.period_end, period_end=end)
        s.add(Charge(**ahead))
    with pytest.raises(SpecError, match="already made at the old price") as refused:
        w.ops()["price_set"](ROOT, {"partition": "spot", "capacity": "spot", "price": "9", "effective": "now"})
    hint = refused.value.hint
    assert "e.g. now" not in hint and hint.startswith(f"give --from {end:%Y-%m-%dT%H:%M:%SZ} or later"), hint
    w.ops()["price_set"](ROOT, {"partition": "spot", "capacity": "spot", "price": "9",
                                "effective": f"{end:%Y-%m-%dT%H:%M:%SZ}"})


def test_many_ended_jobs_cost_one_sacct_call(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc)
    ids = [w.submit()["slurm_job_id"] for _ in range(6)]
    w.tick()
    for sid in ids:
        w.slurm.start(sid)
    w.tick()
    w.advance(20)
    for sid in ids:
        w.slurm.finish(sid)
    from broker.jobs.reconcile import reconcile

    reconcile(w.svc)
    before = w.slurm.calls.get("sacct", 0)
    assert ledger.charge_ended_runs(w.svc, w.clock.now()) == 6
    assert w.slurm.calls["sacct"] - before == 1
    assert ledger.charge_ended_runs(w.svc, w.clock.now()) == 0
    assert w.slurm.calls["sacct"] - before == 1  # nothing left to ask about
    assert sum(ln["amount_micros"] for ln in w.lines()) == 6 * 20_000


def test_run_without_a_price_waits_and_is_charged_once_a_price_exists(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc, vision_budget=None)
    sid = w.submit()["slurm_job_id"]
    w.tick()
    w.slurm.jobs_by_id[sid].partition = "backfill"  # a partition the price book does not know
    w.slurm.start(sid)
    w.advance(10)
    w.slurm.finish(sid)
    w.tick()
    assert w.lines() == []
    w.ops()["price_set"](ROOT, {"partition": "*", "capacity": "spot", "price": "3.60", "effective": "2026-09-01"})
    w.tick()
    assert [ln["amount_micros"] for ln in w.lines()] == [10_000]


def test_idle_node_time_is_its_own_line(db_url: str) -> None:
    w = World(db_url)
    setup_lab(w.svc)
    with w.svc.tx() as s:
        total = ledger.charge_idle_time(s, w.svc, node="spot3", partition="spot", capacity="spot", start=T,
                                        end=T + timedelta(seconds=300), gpus=4, now=T)
        again = ledger.charge_idle_time(s, w.svc, node="spot3", partition="spot", capacity="spot", start=T,
                                        end=T + timedelta(seconds=300), gpus=4, now=T)
    assert (total, again) == (1_200_000, 0)
    rep = w.ops()["report"](ROOT, {"by": "group"})
    assert [(r["key"], r["spend_micros"]) for r in rep["rows"]] == [("(idle nodes)", 1_200_000)]


def test_ledger_tick_charges_the_node_managers_idle_stretches_once(db_url: str) -> None:
    from broker.amount import cost_micros, parse_money
    from broker.nodes import sessions as ns

    w = World(db_url)
    setup_lab(w.svc)
    with w.svc.tx() as s:
        sess, _ = ns.open_session(s, w.svc.settings, node="spot2", partition="spot", capacity="spot", gpus=4,
                                  provider="", source="slurm", key="open-spot2-1", at=T)
        ns.set_usage(s, sess, "busy", T + timedelta(seconds=120))      # idle 120 s while booting empty
        ns.set_usage(s, sess, "idle", T + timedelta(seconds=420))      # the job ran 300 s
        ns.close_session(s, sess, T + timedelta(seconds=600), "released")  # idle 180 s more
    now = T + timedelta(seconds=700)
    first = ledger.charge_idle_stretches(w.svc, now)
    again = ledger.charge_idle_stretches(w.svc, now)
    # (120 + 180) s x 4 GPUs at the book's spot price, and nothing the second time.
    assert first == cost_micros(parse_money("3.60"), 120, 4) + cost_micros(parse_money("3.60"), 180, 4)
    assert again == 0
    idle_lines = [ln for ln in w.lines() if ln["kind"] == "idle"]
    assert sum(ln["seconds"] for ln in idle_lines) == 300
    assert sum(ln["amount_micros"] for ln in idle_lines) == first


def test_node_report_and_spend_report_give_the_same_idle_cost(db_url: str) -> None:
    """`gbroker node report` and `gbroker report` price the same idle node time alike, to the
    micro-unit: on a partition priced by the book (GPU-hour price x GPUs) and on one whose
    nodes have a price per node-hour of their own."""
    from dataclasses import replace

    from broker.config import NodePartition
    from broker.amount import cost_micros, parse_money
    from broker.nodes import sessions as ns
    from broker.nodes.handlers import report as node_report

    w = World(db_url)
    w.svc.settings = replace(w.svc.settings, node_partitions=(
        NodePartition("spot", capacity="spot"),  # the book's $3.60 per GPU-hour x 4 GPUs
        NodePartition("ondemand", capacity="ondemand", price_per_node_hour="2.45"),  # not the book's $7.20 x 8
    ))
    setup_lab(w.svc)
    with w.svc.tx() as s:
        spot, _ = ns.open_session(s, w.svc.settings, node="spot2", partition="spot", capacity="spot", gpus=4,
                                  provider="", source="slurm", key="open-spot2-1", at=T)
        ns.set_usage(s, spot, "busy", T + timedelta(seconds=120))
        ns.set_usage(s, spot, "idle", T + timedelta(seconds=420))
        ns.close_session(s, spot, T + timedelta(seconds=600), "released")  # idle 120 s + 180 s
        od, _ = ns.open_session(s, w.svc.settings, node="od1", partition="ondemand", capacity="ondemand", gpus=8,
                                provider="", source="slurm", key="open-od1-1", at=T)
        ns.set_usage(s, od, "busy", T + timedelta(seconds=93))
        ns.set_usage(s, od, "idle", T + timedelta(seconds=393))
        ns.close_session(s, od, T + timedelta(seconds=486), "released")  # idle 93 s + 93 s
    w.advance(700)
    w.tick()  # the ledger charges the ended idle stretches
    by_node_report = {r["partition"]: r["idle_cost_micros"] for r in node_report(w.svc, None, None)["partitions"]}
    by_ledger: dict[str, int] = {}
    for ln in w.lines():
        if ln["tag"] == "idle":
            by_ledger[ln["partition"]] = by_ledger.get(ln["partition"], 0) + ln["amount_micros"]
    rep = w.ops()["report"](ROOT, {"by": "partition"})
    (idle_row,) = [r for r in rep["rows"] if r["key"] == "(idle nodes)"]
    print(f"idle cost: gbroker node report {by_node_report}, ledger {by_ledger}, "
          f"gbroker report {idle_row['spend_micros']}")
    assert by_node_report == by_ledger
    assert idle_row["spend_micros"] == sum(by_node_report.values())
    # Each stretch is rounded once, as each ledger line is (rounding the 186 s once would give 126_583).
    assert by_ledger["ondemand"] == 2 * cost_micros(parse_money("2.45"), 93) == 126_584
    assert by_ledger["spot"] == cost_micros(parse_money("3.60"), 300, 4) == 1_200_000


def test_idle_time_of_a_node_resumed_before_its_price_existed_is_charged_once_there_is_one(db_url: str) -> None:
    from dataclasses import replace

    from broker.config import NodePartition
    from broker.db.models import Event
    from broker.nodes import sessions as ns
    from broker.nodes.handlers import report as node_report

    w = World(db_url)
    w.svc.settings = replace(w.svc.settings, node_partitions=(
        NodePartition("spot", capacity="spot"), NodePartition("ondemand"), NodePartition("a100", capacity="ondemand"),
    ))
    setup_lab(w.svc)  # prices for spot and ondemand only
    with w.svc.tx() as s:
        sess, _ = ns.open_session(s, w.svc.settings, node="big1", partition="a100", capacity="ondemand", gpus=2,
                                  provider="", source="slurm", key="open-big1-1", at=T)
        assert not sess.price_known
        ns.close_session(s, sess, T + timedelta(seconds=90), "released")
    w.advance(100)
    w.tick()

    def a100() -> dict[str, Any]:
        (row,) = [r for r in node_report(w.svc, None, None)["partitions"] if r["partition"] == "a100"]
        return row

    assert [ln for ln in w.lines() if ln["tag"] == "idle"] == []
    assert (a100()["unpriced_s"], a100()["idle_cost_micros"]) == (90, 0)
    w.ops()["price_set"](ROOT, {"partition": "a100", "capacity": "ondemand", "price": "1.80",
                                "effective": "2026-09-01"})
    w.tick()
    w.tick()
    idle = [(ln["seconds"], ln["price_micros"], ln["amount_micros"]) for ln in w.lines() if ln["tag"] == "idle"]
    assert idle == [(90, 3_600_000, 90_000)]  # $1.80 x 2 GPUs per node-hour, fixed as of the resume
    assert (a100()["unpriced_s"], a100()["idle_cost_micros"]) == (0, 90_000)
    with w.svc.sessions() as s:
        priced = s.execute(select(Event.data_json).where(Event.kind == "node_priced")).scalars().all()
    assert len(priced) == 1 and '"idle_cost_micros": 90000' in priced[0]


def test_a_reused_slurm_id_is_charged_only_for_its_owners_runs() -> None:
    """Slurm reuses ids once its state is reset; anyone may name a job ``<key>-1``. Rows of
    another user under this job's id are not this job's runs, whatever their name."""
    from broker.slurm.backend import SacctRow
    from broker.states import AttemptState

    def row(user: str, name: str, hour: int) -> SacctRow:
        at = datetime(2026, 10, 1, hour, tzinfo=UTC)
        return SacctRow(job_id=7, name=name, user=user, account="vision", partition="spot", state_raw="COMPLETED",
                        state=AttemptState.COMPLETED, nodelist=["spot1"], submit=at, start=at,
                        end=at + timedelta(hours=1), elapsed_s=3600, alloc_gpus=4, exit_code=0, exit_signal=0,
                        comment="")

    rows = [row("bob", "gb-k1-1", 8), row("alice", "gb-k1-1", 10), row("alice", "gb-other-1", 12)]
    (mine,) = ledger.runs_of_job(rows, "gb-k1", "alice")
    assert (mine.user, mine.start, mine.restarts) == ("alice", rows[1].start, 0)


def test_a_job_moved_to_another_account_in_slurm_is_charged_to_the_group_that_admitted_it(db_url: str) -> None:
    """An owner may move her waiting job to another account of hers (scontrol update
    Account=...), past that account's admission: the run is charged where it was admitted."""
    from sqlalchemy import select as sel

    from broker.db.models import Event

    w = World(db_url)
    setup_lab(w.svc)
    sid = w.submit()["slurm_job_id"]  # vision's
    w.tick()
    w.slurm.jobs_by_id[sid].account = "climate"
    w.slurm.start(sid)
    w.advance(20)
    w.slurm.finish(sid)
    w.tick()
    assert [(ln["account"], ln["amount_micros"]) for ln in w.lines()] == [("vision", 20_000)]
    with w.svc.sessions() as s:
        said = [e.message for e in s.execute(sel(Event).where(Event.kind == "charged")).scalars()]
    assert any("under account climate (changed after submission)" in m for m in said), said
