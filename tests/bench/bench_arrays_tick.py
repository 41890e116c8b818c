"""Reconcile tick with 100 arrays of 1,000 tasks (100,000 tasks): tick time and Slurm calls.

The squeue answer is in the form of a recorded real 22.05 answer (squeue
without ``--array``: a row per started task, one row for each array's tasks
not started yet, ``17-1000%64``), fed through the real parser by the real
CLI backend, whose runner only answers instead of running Slurm and counts
the calls. The database is a real SQLite file holding the 100 array jobs and
their 100,000 pieces. Each array has 16 tasks running and 984 waiting.

Three ticks are measured:

* first: a daemon just started (nothing remembered): every array is compared
  piece by piece with the queue;
* steady: the queue shows every array as at the last tick: each is skipped
  after one pass over its rows (the usual tick);
* busy: one task of every array started since the last tick: all 100 arrays
  are compared again and write one piece each.

Run: python tests/bench/bench_arrays_tick.py [--arrays 100] [--tasks 1000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from broker.clock import FakeClock  # noqa: E402
from broker.config import Settings  # noqa: E402
from broker.slurm import parse  # noqa: E402
from broker.slurm.runner import CallCounter, CompletedRun  # noqa: E402

FS, RS = "\x1f", "\x1e"
RUNNING_PER_ARRAY = 16


class RecordedArrays:
    """A RunFn that answers squeue with every task of every array, as ``squeue --array`` prints them."""

    def __init__(self, arrays: int, tasks: int) -> None:
        self.counter = CallCounter()
        self.arrays, self.tasks = arrays, tasks
        self.running = RUNNING_PER_ARRAY
        self.render()

    def render(self) -> None:
        rows = []
        for a in range(1, self.arrays + 1):
            array_id = a * 10_000
            key = f"gb-{a:012x}"
            for t in range(1, self.running + 1):  # a started task: a row of its own
                rows.append(FS.join([
                    str(array_id + t), f"{key}-a1", "alice", "vision", "spot", "RUNNING", "None",
                    f"spot{t % 4 + 1}", "0", "2026-09-01T00:00:00", "2026-09-01T00:00:05", "1:00:00", key,
                    str(array_id), str(t),
                ]) + RS)
            # The tasks not started yet: one row (squeue without --array), as Slurm keeps them.
            rows.append(FS.join([
                str(array_id), f"{key}-a1", "alice", "vision", "spot", "PENDING", "JobArrayTaskLimit", "",
                "0", "2026-09-01T00:00:00", "N/A", "1:00:00", key, str(array_id),
                f"{self.running + 1}-{self.tasks}%{RUNNING_PER_ARRAY * 4}",
            ]) + RS)
        self.squeue = "\n".join(rows) + "\n"

    def run(self, argv, *, timeout_s=None, env=None, user=None, input=None):  # noqa: ANN001
        self.counter.record(argv)
        # Written with the bare separators; printed with the ones this listing asked for, as squeue does.
        out = parse.separators_of(argv, env).respell(self.squeue) if os.path.basename(argv[0]) == "squeue" else ""
        return CompletedRun(list(argv), out, "", 0, 0.0)


def seed(url: str, arrays: int, tasks: int, now: datetime) -> None:
    from sqlalchemy import insert

    from broker.db.array_models import ArrayBatch, ArrayPiece
    from broker.db.engine import make_engine, session_factory
    from broker.db.migrate import upgrade_to_head
    from broker.db.models import Job
    from broker.states import JobState, PieceState
    from policies import Capacity

    upgrade_to_head(url)
    spec = (
        '{"checkpoint":{"style":"pieces"},"command":["python3","render.py"],"env":{},"gpus_per_node":1,'
        '"group":"vision","interruptible":true,"kind":"render","max_retries":2,"name":"bench",'
        f'"nodes":1,"signal_lead_s":120,"time_limit":"3600s","workdir":"/tmp","pieces":"1-{tasks}"}}'
    )
    sessions = session_factory(make_engine(url))
    with sessions() as s:
        s.execute(insert(Job), [dict(
            id=a, key=f"gb-{a:012x}", owner_uid=1001, owner_name="alice", group_name="vision",
            name="bench", kind="render", spec_json=spec, state=JobState.PENDING, placement_policy="simple",
            capacity=Capacity.SPOT, partition="spot", reclaims=0, failures=0, done_s=0,
            estimate_micros=0, reserved_micros=0, reason="", created_at=now, updated_at=now,
        ) for a in range(1, arrays + 1)])
        s.execute(insert(ArrayBatch), [dict(
            job_id=a, number=1, indices=f"1-{tasks}", slurm_array_id=a * 10_000, partition="spot",
            capacity=Capacity.SPOT, created_at=now, submitted_at=now,
        ) for a in range(1, arrays + 1)])
        s.execute(insert(ArrayPiece), [dict(
            job_id=a, idx=t, last=t, state=PieceState.PENDING, batch=1, runs=0, failures=0, reclaims=0,
            nodes="", reason="", updated_at=now,
        ) for a in range(1, arrays + 1) for t in range(1, tasks + 1)])
        s.commit()


def bench(arrays: int, tasks: int, steady_runs: int) -> dict[str, float]:
    from broker.jobs.reconcile import reconcile
    from broker.slurm.cli_backend import CliBackend
    from broker.wiring import build_services

    now = datetime(2026, 9, 1, 1, 0, tzinfo=UTC)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        seed(url, arrays, tasks, now)
        runner = RecordedArrays(arrays, tasks)
        svc = build_services(Settings(db_url=url), backend=CliBackend(runner), clock=FakeClock(now))

        def tick() -> tuple[float, int]:
            runner.counter.reset()
            t0 = time.perf_counter()
            reconcile(svc)
            return time.perf_counter() - t0, runner.counter.total

        first, first_calls = tick()
        steady = [tick() for _ in range(steady_runs)]
        runner.running += 1  # one more task of every array starts
        runner.render()
        busy, busy_calls = tick()
        t0 = time.perf_counter()
        parse.parse_squeue(runner.squeue)
        parse_s = time.perf_counter() - t0
        return {
            "first_s": first, "first_calls": first_calls,
            "steady_s": statistics.median(t for t, _ in steady), "steady_calls": max(c for _, c in steady),
            "busy_s": busy, "busy_calls": busy_calls, "parse_s": parse_s,
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arrays", type=int, default=100)
    ap.add_argument("--tasks", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5, help="steady ticks to take the median of")
    args = ap.parse_args()
    r = bench(args.arrays, args.tasks, args.runs)
    n = args.arrays * args.tasks
    print(f"reconcile tick, {args.arrays} arrays x {args.tasks} tasks = {n:,} tasks (SQLite, recorded squeue):")
    print(f"  first tick (nothing remembered)   {r['first_s'] * 1000:8.1f} ms, Slurm calls {r['first_calls']:.0f}")
    print(f"  steady tick (median of {args.runs})        {r['steady_s'] * 1000:8.1f} ms, Slurm calls "
          f"{r['steady_calls']:.0f}")
    print(f"  busy tick (a task of every array started) {r['busy_s'] * 1000:8.1f} ms, Slurm calls "
          f"{r['busy_calls']:.0f}")
    print(f"  of which parsing the squeue answer: {r['parse_s'] * 1000:.1f} ms")


if __name__ == "__main__":
    main()
