"""Property: whatever happens — submit, start, reclaim, finish, price changes, Slurm outages,
crashes at any named point, restarts — every ended run is charged exactly once, at the
price book's prices, and never a run that did not happen.

Drives the real service layer (submit, reconcile, ledger tick) on a real SQLite
database with the in-memory Slurm of ledger_fakes. Expected costs are computed
independently, second by second, from the fake Slurm's own record of each run.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from broker.db.ledger_models import Charge, LedgerRun
from broker.db.migrate import upgrade_to_head
from broker.db.models import Job
from broker.errors import AdmissionRefused, SpecError
from ledger_fakes import ROOT, Crash, World, setup_lab

USERS = (("alice", "vision"), ("bob", "vision"), ("carol", "climate"))
PRICES = {"spot": (1_800_000, 3_600_000, 5_400_000), "ondemand": (7_200_000, 10_800_000)}
"""Micro-units per GPU-hour; all multiples of 3600, so a GPU-second costs a whole micro-unit."""
CRASH_POINTS = ("after_intent", "after_sbatch", "after_commit", "ledger_after_charge", "ledger_before_hold")

submit_op = st.tuples(st.just("submit"), st.integers(0, 2), st.integers(1, 4),
                      st.sampled_from(["5m", "10m", "1h"]), st.booleans())
start_op = st.tuples(st.just("start"), st.integers(0, 30))
reclaim_op = st.tuples(st.just("reclaim"), st.integers(0, 30))
finish_op = st.tuples(st.just("finish"), st.integers(0, 30), st.booleans())
advance_op = st.tuples(st.just("advance"), st.integers(1, 400))
tick_op = st.tuples(st.just("tick"))
price_op = st.tuples(st.just("price"), st.sampled_from(["spot", "ondemand"]), st.integers(0, 2),
                     st.integers(0, 300))
op = st.one_of(
    # The common moves are listed several times: most sequences then contain real runs.
    submit_op, submit_op, submit_op, start_op, start_op, start_op, advance_op, advance_op, advance_op,
    tick_op, tick_op, tick_op, reclaim_op, reclaim_op, finish_op, finish_op,
    st.tuples(st.just("crash"), st.sampled_from(CRASH_POINTS)),
    st.tuples(st.just("restart")),
    st.tuples(st.just("slurm_down")),
    price_op, price_op,
    st.tuples(st.just("budget"), st.sampled_from(["0.50", "2", "50"])),
)


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated database to copy for each example (migrating every time would dominate the run)."""
    path = tmp_path_factory.mktemp("tpl") / "gb.db"
    upgrade_to_head(f"sqlite:///{path}")
    return path


class Harness:
    def __init__(self, db: Path) -> None:
        self.w = World(f"sqlite:///{db}")
        setup_lab(self.w.svc, vision_budget="50", climate_budget="50", spot="1.80", ondemand="7.20")
        self.prices: list[tuple[datetime, str, int]] = [
            (datetime.fromisoformat("2026-09-01T00:00:00+00:00"), "spot", 1_800_000),
            (datetime.fromisoformat("2026-09-01T00:00:00+00:00"), "ondemand", 7_200_000),
        ]

    # -- the world ---------------------------------------------------------------
    def job(self, i: int) -> int | None:
        ids = sorted(self.w.slurm.jobs_by_id)
        return ids[i % len(ids)] if ids else None

    def apply(self, o: tuple[Any, ...]) -> None:
        w = self.w
        kind = o[0]
        try:
            if kind == "submit":
                user, group = USERS[o[1]]
                try:
                    w.submit(user=user, group=group, gpus=o[2], time=o[3], interruptible=o[4])
                except AdmissionRefused:
                    return
                self.check_admitted(group)
            elif kind in ("start", "reclaim", "finish"):
                sid = self.job(o[1])
                if sid is not None:
                    if kind == "start":
                        w.slurm.start(sid, node="spot1" if w.slurm.jobs_by_id[sid].partition == "spot" else "od1")
                    elif kind == "reclaim":
                        w.slurm.reclaim(sid)
                    else:
                        w.slurm.finish(sid, ok=o[2])
            elif kind == "advance":
                w.advance(o[1])
            elif kind == "tick":
                w.tick()
            elif kind == "crash":
                w.crash.armed.add(o[1])
                w.tick()
                if o[1] in ("after_intent", "after_sbatch", "after_commit"):
                    w.submit()
            elif kind == "restart":
                self.restart()
            elif kind == "slurm_down":
                w.slurm.down = True
                try:
                    w.tick()
                finally:
                    w.slurm.down = False
            elif kind == "price":
                capacity, which, delay = o[1], o[2] % len(PRICES[o[1]]), o[3]
                price = PRICES[capacity][which]
                when = w.clock.now() + timedelta(seconds=delay)
                try:
                    w.ops()["price_set"](ROOT, {"partition": capacity, "capacity": capacity,
                                                "price": f"{price / 1_000_000:.6f}", "effective": f"+{delay}s"})
                except SpecError:
                    return  # another price at that very second: refused, the book is unchanged
                self.prices.append((when, capacity, price))
            elif kind == "budget":
                w.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": o[1]})
        except Crash:
            self.restart()  # the process died there; a new one starts on the same database
        except AdmissionRefused:
            pass

    def restart(self) -> None:
        """A new daemon process: like the real one, it reconciles at once on start."""
        self.w.crash.armed.clear()
        self.w.restart()
        self.w.tick()

    def drain(self) -> None:
        """Let everything end: Slurm cancels what is left; the daemon catches up over a few ticks."""
        w = self.w
        w.crash.armed.clear()
        w.ops()["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": "1000"})
        for round_ in range(3):
            w.tick()
            for sid in list(w.slurm.jobs_by_id):
                w.slurm.start(sid)
            w.advance(30)
            for sid in list(w.slurm.jobs_by_id):
                if round_ == 0 and sid % 2:
                    w.slurm.reclaim(sid)  # the first round loses some runs to reclaims
                else:
                    w.slurm.finish(sid)
        w.slurm.cancel([j.job_id for j in w.slurm.jobs_by_id.values() if not j.done])
        for _ in range(4):
            w.tick()

    # -- what must hold --------------------------------------------------------------
    def price_at(self, partition: str, t: datetime) -> int:
        best = None
        for when, part, price in self.prices:
            if part == partition and when <= t and (best is None or when >= best[0]):
                best = (when, price)
        assert best is not None
        return best[1]

    def expected(self, partition: str, start: datetime, seconds: int, gpus: int) -> int:
        """Independent of the ledger code: add up every second at the price of that second."""
        return sum(self.price_at(partition, start + timedelta(seconds=k)) // 3600 * gpus for k in range(seconds))

    def check_admitted(self, group: str) -> None:
        st_ = self.w.status(group)
        assert st_["spent_micros"] + st_["reserved_micros"] <= st_["amount_micros"], st_

    def check_ledger(self, complete: bool) -> None:
        with self.w.svc.sessions() as s:
            runs = s.execute(select(LedgerRun)).scalars().all()
            keys = [(r.job_id, r.slurm_job_id, r.run_index) for r in runs]
            assert len(keys) == len(set(keys)), "a run was charged twice"
            line_sums = dict(s.execute(
                select(Charge.slurm_job_id, func.sum(Charge.amount_micros)).group_by(Charge.slurm_job_id)).all())
            run_sums: dict[int, int] = {}
            for r in runs:
                run_sums[r.slurm_job_id] = run_sums.get(r.slurm_job_id, 0) + r.total_micros
            assert {k: v for k, v in run_sums.items() if v} == {k: v for k, v in line_sums.items() if v}
            known = set(s.execute(select(Job.key)).scalars())
        truth = {}
        for sid, idx, run, job in self.w.slurm.ended_runs():
            assert run.end is not None
            elapsed = int((run.end - run.start).total_seconds()) if run.start else 0
            truth[(sid, idx)] = (run, job, elapsed)
        for r in runs:
            assert (r.slurm_job_id, r.run_index) in truth, f"charged a run that never ended: {r.slurm_job_id}"
            run, job, elapsed = truth[(r.slurm_job_id, r.run_index)]
            assert r.elapsed_s == elapsed
            cost = self.expected(run.partition, run.start, elapsed, job.gpus) if run.start and elapsed else 0
            assert r.total_micros == cost, (r.slurm_job_id, r.run_index, r.total_micros, cost)
        if complete:
            charged = {(r.slurm_job_id, r.run_index) for r in runs}
            ours = {k for k, (_, job, _) in truth.items() if job.comment in known}
            assert ours == charged, f"lost: {sorted(ours - charged)}; extra: {sorted(charged - ours)}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(ops=st.lists(op, min_size=1, max_size=50))
# Found by this test: reclaimed, run again and completed while the controller did not answer.
@example(ops=[("submit", 0, 1, "5m", False), ("submit", 0, 1, "5m", False), ("start", 9), ("slurm_down",),
              ("reclaim", 23)])
def test_no_charge_is_counted_twice_or_lost(ops: list[tuple[Any, ...]], template: Path,
                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    db = tmp_path_factory.mktemp("prop") / "gb.db"
    shutil.copy(template, db)
    h = Harness(db)
    try:
        for o in ops:
            h.apply(o)
            h.check_ledger(complete=False)
        h.drain()
        h.check_ledger(complete=True)
    finally:
        h.w.svc.sessions.kw["bind"].dispose()
