"""A small in-memory Slurm for unit and property tests of the ledger and budgets (our logic only).

It keeps the facts the real one reports: one job id across requeues, one
accounting row per run (``sacct --duplicates``), NODE_FAIL on a reclaim,
admin holds, time limits rounded up to whole minutes. Integration tests use
the real dev cluster instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from broker.caller import Caller
from broker.userfiles import SaveFacts, UserFiles
from broker.clock import FakeClock
from broker.config import Settings
from broker.errors import SlurmError, SlurmUnavailable
from broker.state import Services
from broker.wiring import build_services
from broker.slurm.backend import Backend, NodeInfo, SacctRow, SlurmJob, SubmitRequest
from broker.slurm.cli_backend import time_limit_minutes
from broker.slurm.statemap import job_state


class Crash(BaseException):
    """The process died here (the test's stand-in for SIGKILL)."""


class RaisingCrashPoints:
    def __init__(self) -> None:
        self.armed: set[str] = set()

    def reach(self, name: str) -> None:
        if name in self.armed:
            self.armed.discard(name)
            raise Crash(name)


@dataclass
class FakeRun:
    submit: datetime
    start: datetime | None = None
    end: datetime | None = None
    state_raw: str = "PENDING"
    partition: str = "spot"
    node: str = ""
    exit_code: int = 0


@dataclass
class FakeJob:
    job_id: int
    name: str
    comment: str
    user: str
    account: str
    partition: str
    gpus: int
    limit_s: int
    runs: list[FakeRun] = field(default_factory=list)
    held: bool = False
    done: bool = False
    requeue: bool = True
    reason: str | None = None
    """A pending reason of Slurm's own (e.g. after a launch failure); None: the usual ones."""
    forgotten: bool = False
    """The controller lost the job (accounting still says it runs)."""

    @property
    def current(self) -> FakeRun:
        return self.runs[-1]


class FakeSlurm(Backend):
    name = "fake"

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.jobs_by_id: dict[int, FakeJob] = {}
        self.next_id = 100
        self.down = False
        self.calls: dict[str, int] = {}

    def _count(self, what: str) -> None:
        self.calls[what] = self.calls.get(what, 0) + 1
        if self.down:
            raise SlurmUnavailable("fake controller down", argv=[what])

    # -- Backend ---------------------------------------------------------------
    def submit(self, req: SubmitRequest) -> int:
        self._count("sbatch")
        self.next_id += 1
        now = self.clock.now()
        job = FakeJob(self.next_id, req.job_name, req.comment, req.user or "root", req.account or "",
                      req.partition, req.nodes * req.gpus_per_node, time_limit_minutes(req.time_limit_s) * 60,
                      runs=[FakeRun(submit=now, partition=req.partition)], held=req.hold, requeue=req.requeue)
        self.jobs_by_id[job.job_id] = job
        return job.job_id

    def jobs(self, job_ids: Iterable[int] | None = None, name_prefix: str | None = None) -> list[SlurmJob]:
        self._count("squeue")
        out = []
        for j in self.jobs_by_id.values():
            if j.done or j.forgotten:
                continue
            run = j.current
            raw = run.state_raw
            usual = "JobHeldAdmin" if j.held else ("None" if raw == "RUNNING" else "Priority")
            out.append(SlurmJob(
                job_id=j.job_id, name=j.name, user=j.user, account=j.account, partition=j.partition,
                state_raw=raw, state=job_state(raw), reason=j.reason or usual,
                nodes=[run.node] if run.node else [], restarts=len(j.runs) - 1, comment=j.comment,
                submit_time=run.submit, start_time=run.start, time_limit_s=j.limit_s,
            ))
        if job_ids is not None:
            wanted = set(job_ids)
            out = [j for j in out if j.job_id in wanted]
        if name_prefix is not None:
            out = [j for j in out if j.name.startswith(name_prefix)]
        return out

    def history(self, job_ids: Iterable[int] | None = None, since: datetime | None = None) -> list[SacctRow]:
        self._count("sacct")
        ids = set(job_ids) if job_ids is not None else set(self.jobs_by_id)
        rows = []
        for jid in sorted(ids):
            j = self.jobs_by_id.get(jid)
            if j is None:
                continue
            for idx, run in enumerate(j.runs):
                if since is not None and job_ids is None and (run.end or self.clock.now()) < since:
                    continue
                elapsed = int(((run.end or self.clock.now()) - run.start).total_seconds()) if run.start else 0
                rows.append(SacctRow(
                    job_id=j.job_id, name=j.name, user=j.user, account=j.account, partition=run.partition,
                    state_raw=run.state_raw, state=job_state(run.state_raw), nodelist=[run.node] if run.node else [],
                    submit=run.submit, start=run.start, end=run.end, elapsed_s=elapsed,
                    alloc_gpus=j.gpus if run.start else 0, exit_code=run.exit_code, exit_signal=0, comment=j.comment,
                    restarts=idx,
                ))
        return rows

    def cancel(self, job_ids: Iterable[int]) -> None:
        self._count("scancel")
        now = self.clock.now()
        for jid in job_ids:
            j = self.jobs_by_id.get(jid)
            if j is None or j.done:
                continue
            run = j.current
            run.end = now
            run.state_raw = "CANCELLED by 0"
            j.done = True

    def hold(self, job_ids: Iterable[int]) -> None:
        self._count("hold")
        bad = []
        for jid in job_ids:
            j = self.jobs_by_id.get(jid)
            if j is None or j.done or j.current.state_raw != "PENDING":
                bad.append(jid)
            else:
                j.held = True
        if bad:
            raise SlurmError("hold refused", argv=["scontrol", "hold"], returncode=1,
                             stderr=f"Job is no longer pending execution for job {bad[0]}")

    def release(self, job_ids: Iterable[int]) -> None:
        self._count("release")
        for jid in job_ids:
            j = self.jobs_by_id.get(jid)
            if j is not None:
                j.held = False
                j.reason = None

    def requeue(self, job_ids: Iterable[int]) -> None:
        """scontrol requeue: the running run ends REQUEUED, the same id waits again."""
        self._count("requeue")
        for jid in job_ids:
            j = self.jobs_by_id.get(jid)
            if j is None or j.done or j.current.state_raw != "RUNNING":
                raise SlurmError("Job is not running", argv=["scontrol", "requeue", str(jid)], returncode=1,
                                 stderr="Job is not running")
            now = self.clock.now()
            j.current.end, j.current.state_raw = now, "REQUEUED"
            j.runs.append(FakeRun(submit=now, partition=j.partition))

    def start_now(self, job_ids: Iterable[int]) -> None:
        self._count("start_now")

    def update(self, job_id: int, **fields: object) -> None:
        self._count("update")
        j = self.jobs_by_id[job_id]
        if "partition" in fields:
            j.partition = str(fields["partition"])
            if j.current.state_raw == "PENDING":
                j.current.partition = j.partition

    def nodes(self) -> list[NodeInfo]:
        return []

    def power_down(self, names: Iterable[str], force: bool = False) -> None:
        pass

    def power_up(self, names: Iterable[str]) -> None:
        pass

    def ping(self) -> bool:
        return not self.down

    # -- what the world does -------------------------------------------------------
    def start(self, jid: int, node: str = "spot1") -> bool:
        j = self.jobs_by_id[jid]
        run = j.current
        if j.done or j.held or run.state_raw != "PENDING":
            return False
        run.start, run.state_raw, run.node, run.partition = self.clock.now(), "RUNNING", node, j.partition
        return True

    def finish(self, jid: int, ok: bool = True, exit_code: int | None = None) -> bool:
        j = self.jobs_by_id[jid]
        run = j.current
        if j.done or run.state_raw != "RUNNING":
            return False
        if exit_code is not None:
            ok = exit_code == 0
        run.end, run.state_raw, j.done = self.clock.now(), "COMPLETED" if ok else "FAILED", True
        run.exit_code = 0 if ok else (exit_code if exit_code is not None else 1)
        return True

    def reclaim(self, jid: int) -> bool:
        """The spot node vanished: NODE_FAIL for this run, the job is requeued under the same id."""
        j = self.jobs_by_id[jid]
        run = j.current
        if j.done or run.state_raw != "RUNNING":
            return False
        now = self.clock.now()
        run.end, run.state_raw = now, "NODE_FAIL"
        if j.requeue:
            j.runs.append(FakeRun(submit=now, partition=j.partition))
        else:
            j.done = True  # --no-requeue: the job ends with its node
        return True

    def lose_launch(self, jid: int) -> bool:
        """The controller restarted as the run started: Slurm requeues the job held
        ("launch failed requeued held") and accounting keeps 0 s for the run."""
        j = self.jobs_by_id[jid]
        run = j.current
        if j.done or run.state_raw != "RUNNING":
            return False
        now = self.clock.now()
        run.start, run.end, run.state_raw = now, now, "REQUEUED"
        j.runs.append(FakeRun(submit=now, partition=j.partition))
        j.held, j.reason = True, "launch failed requeued held"
        return True

    def forget(self, jid: int) -> bool:
        """The controller restarted and forgot the running job; accounting never closes its run."""
        j = self.jobs_by_id[jid]
        if j.done or j.current.state_raw != "RUNNING":
            return False
        j.forgotten = True
        return True

    def expire(self) -> None:
        """Runs past their (whole-minute) time limit end as TIMEOUT at the limit."""
        now = self.clock.now()
        for j in self.jobs_by_id.values():
            run = j.current
            if not j.done and run.state_raw == "RUNNING" and run.start is not None:
                if (now - run.start).total_seconds() >= j.limit_s:
                    run.end = run.start + timedelta(seconds=j.limit_s)
                    run.state_raw, j.done = "TIMEOUT", True

    def ended_runs(self) -> list[tuple[int, int, FakeRun, FakeJob]]:
        return [(j.job_id, i, r, j) for j in self.jobs_by_id.values() for i, r in enumerate(j.runs)
                if r.end is not None]


class FakeUserFiles(UserFiles):
    """Users' files without users: logs get a made-up path, checkpoint saves are what a test sets."""

    def __init__(self) -> None:
        self.saved_at: dict[str, float] = {}
        self.logs: list[str] = []

    def create_log(self, owner: str, workdir: str, name: str) -> str:
        path = f"{workdir.rstrip('/')}/gbroker-{name}-{len(self.logs):06d}.out"
        self.logs.append(path)
        return path

    def remove(self, owner: str, path: str) -> None:
        if path in self.logs:
            self.logs.remove(path)

    def probe(self, owner: str, dirs: list[str], timeout_s: float = 0) -> dict[str, SaveFacts] | None:
        return {d: SaveFacts(manifest_at=self.saved_at.get(d)) for d in dirs}


# -- services ----------------------------------------------------------------------------
START = datetime.fromisoformat("2026-10-01T08:00:00+00:00")


def make_services(db_url: str, clock: FakeClock, slurm: FakeSlurm, crash: Any = None, migrate: bool = True) -> Services:
    settings = Settings(db_url=db_url, socket="/nonexistent.sock", tick_seconds=1.0, policy="simple",
                        max_spot_reclaims=2)
    svc = build_services(settings, backend=slurm, clock=clock, crash=crash or RaisingCrashPoints(),
                         files=FakeUserFiles())
    if migrate:
        svc.migrate()
    return svc


def caller(name: str = "alice", admin: bool = False) -> Caller:
    return Caller(uid=os.geteuid(), gid=os.getegid(), pid=1, name=name, is_admin=admin)


ROOT = caller("root", admin=True)


def job_spec(group: str = "vision", gpus: int = 1, time: str = "10m", interruptible: bool = True,
             name: str = "t", partition: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, "kind": "other", "group": group, "time_limit": time,
                            "gpus_per_node": gpus, "nodes": 1, "interruptible": interruptible,
                            "command": ["sleep", "5"], "workdir": "/tmp"}
    if partition:
        spec["partition"] = partition
    return spec


def setup_lab(svc: Services, *, vision_budget: str | None = "100", climate_budget: str | None = "100",
              spot: str = "3.60", ondemand: str = "7.20") -> None:
    """Semester 2026-fall, groups vision (alice, bob) and climate (carol), prices, budgets."""
    from broker.money.handlers import handlers

    ops = handlers(svc)
    ops["semester_add"](ROOT, {"name": "2026-fall", "start": "2026-09-01", "end": "2027-01-31"})
    ops["group_add"](ROOT, {"name": "vision", "members": ["alice", "bob"]})
    ops["group_add"](ROOT, {"name": "climate", "members": ["carol"]})
    ops["price_set"](ROOT, {"partition": "spot", "capacity": "spot", "price": spot, "effective": "2026-09-01"})
    ops["price_set"](ROOT, {"partition": "ondemand", "capacity": "ondemand", "price": ondemand,
                            "effective": "2026-09-01"})
    if vision_budget is not None:
        ops["budget_set"](ROOT, {"group": "vision", "semester": "2026-fall", "amount": vision_budget})
    if climate_budget is not None:
        ops["budget_set"](ROOT, {"group": "climate", "semester": "2026-fall", "amount": climate_budget})


class World:
    """Services on a real database, the fake Slurm and a fake clock, with the daemon's two ticks."""

    def __init__(self, db_url: str, start: datetime = START) -> None:
        self.db_url = db_url
        self.clock = FakeClock(start)
        self.slurm = FakeSlurm(self.clock)
        self.crash = RaisingCrashPoints()
        self.svc = make_services(db_url, self.clock, self.slurm, self.crash)

    def restart(self) -> None:
        """A new daemon process on the same database and cluster (nothing in memory survives)."""
        self.svc.sessions.kw["bind"].dispose()
        self.svc = make_services(self.db_url, self.clock, self.slurm, self.crash, migrate=False)

    def ops(self) -> dict[str, Any]:
        from broker.money.handlers import handlers

        return handlers(self.svc)

    def submit(self, user: str = "alice", deadline_in_s: int | None = None, **kw: Any) -> dict[str, Any]:
        from broker.jobs.submit import submit

        spec = job_spec(**kw)
        if deadline_in_s is not None:
            spec["deadline"] = (self.clock.now() + timedelta(seconds=deadline_in_s)).isoformat()
        return submit(self.svc, caller(user), spec)

    def tick(self) -> None:
        from broker.money.ledger import ledger_tick
        from broker.jobs.reconcile import reconcile

        self.slurm.expire()
        reconcile(self.svc)
        ledger_tick(self.svc)

    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self.slurm.expire()

    def status(self, group: str = "vision") -> dict[str, Any]:
        out = self.ops()["budget_list"](ROOT, {})
        return next(b for b in out["budgets"] if b["group"] == group)

    def lines(self, **kw: Any) -> list[dict[str, Any]]:
        return self.ops()["ledger"](ROOT, kw)
