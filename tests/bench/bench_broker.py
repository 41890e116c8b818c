"""Broker benchmarks, measured in one run so the ratios mean something.

1. CLI start-up: `gbroker status` against `python -c "import click"`.
   Submit latency: `gbroker submit` (a whole CLI process talking to a running
   daemon, which validates, stores the intent and queues the job: with sbatch
   as the user, or through libslurm in the daemon, one daemon of each)
   against plain `sbatch`, and against `python -c "import click"` followed by
   sbatch (the floor for any Python CLI in front of Slurm).
2. Reconcile tick time with 100 and with 10,000 tracked jobs, and the number
   of Slurm calls per tick (must not grow with the number of jobs). The
   squeue answer is a recorded real record repeated N times, fed through the
   real parser; the database is a real SQLite file.

Run (as root, dev cluster up for part 1):
    python tests/bench/bench_broker.py            # both parts
    python tests/bench/bench_broker.py --ticks-only
    python tests/bench/bench_broker.py --submit-only
    python tests/bench/bench_broker.py --submit-only --cli-python /opt/gbroker/cli/bin/python
        # the CLI side (gbroker and the click floor) from another environment, e.g. a regular
        # (not editable) install: an editable install's import hook costs every start of
        # its Python some 20 ms, the floor's and gbroker's alike, which flatters the ratio
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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
from dev_daemon import daemon_env, dev_cluster_conf  # noqa: E402

FS, RS = "\x1f", "\x1e"


# -- part 2: reconcile ticks ----------------------------------------------------
class RecordedSqueue:
    """A RunFn that answers squeue with N running jobs (format of a real 22.05 record)."""

    def __init__(self, n: int) -> None:
        self.counter = CallCounter()
        rows = []
        for i in range(1, n + 1):
            rows.append(FS.join([
                str(i), f"gb-{i:012x}-1", "alice", "vision", "spot", "RUNNING", "None", "spot1",
                "0", "2026-09-01T00:00:00", "2026-09-01T00:00:05", "1:00:00", f"gb-{i:012x}",
            ]) + RS)
        self.squeue = "\n".join(rows) + "\n"

    def run(self, argv, *, timeout_s=None, env=None, user=None, input=None):  # noqa: ANN001
        self.counter.record(argv)
        # Written with the bare separators; printed with the ones this listing asked for, as squeue does.
        out = parse.separators_of(argv, env).respell(self.squeue) if os.path.basename(argv[0]) == "squeue" else ""
        return CompletedRun(list(argv), out, "", 0, 0.0)


def seed(url: str, n: int, now: datetime) -> None:
    from sqlalchemy import insert

    from broker.db.engine import make_engine, session_factory
    from broker.db.migrate import upgrade_to_head
    from broker.db.models import Attempt, Job
    from broker.states import AttemptState, JobState
    from policies import Capacity

    upgrade_to_head(url)
    spec = (
        '{"checkpoint":{"style":"none"},"command":["sleep","3600"],"env":{},"gpus_per_node":1,'
        '"group":"vision","interruptible":true,"kind":"other","max_retries":2,"name":"bench",'
        '"nodes":1,"signal_lead_s":120,"time_limit":"3600s","workdir":"/tmp"}'
    )
    sessions = session_factory(make_engine(url))
    with sessions() as s:
        s.execute(insert(Job), [dict(
            id=i, key=f"gb-{i:012x}", owner_uid=1001, owner_name="alice", group_name="vision",
            name="bench", kind="other", spec_json=spec, state=JobState.RUNNING, placement_policy="simple",
            capacity=Capacity.SPOT, partition="spot", reclaims=0, failures=0, done_s=0,
            estimate_micros=0, reserved_micros=0, reason="running on spot1", created_at=now, updated_at=now,
        ) for i in range(1, n + 1)])
        s.execute(insert(Attempt), [dict(
            job_id=i, number=1, slurm_job_id=i, partition="spot", capacity=Capacity.SPOT,
            state=AttemptState.RUNNING, nodes="spot1", created_at=now, submitted_at=now,
            started_at=datetime(2026, 9, 1, 0, 0, 5, tzinfo=UTC), lost_s=0, slurm_restarts=0,
        ) for i in range(1, n + 1)])
        s.commit()


def bench_ticks(n: int) -> dict[str, float]:
    from broker.wiring import build_services
    from broker.jobs.reconcile import reconcile
    from broker.slurm.cli_backend import CliBackend

    now = datetime(2026, 9, 1, 1, 0, tzinfo=UTC)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        seed(url, n, now)
        runner = RecordedSqueue(n)
        svc = build_services(Settings(db_url=url), backend=CliBackend(runner), clock=FakeClock(now))
        times, calls = [], []
        for _ in range(5):
            runner.counter.reset()
            t0 = time.perf_counter()
            reconcile(svc)
            times.append(time.perf_counter() - t0)
            calls.append(runner.counter.total)
        return {"first_s": times[0], "steady_s": statistics.median(times[1:]), "calls": max(calls)}


# -- part 1: submit latency -----------------------------------------------------
# The command users run is the installed ``gbroker`` entry point next to the CLI's Python
# (``python -m broker`` adds runpy's start-up, about 9 ms), or ``-m broker`` where there is none.

def _median_walls(commands: dict[str, list[str]], env: dict[str, str], runs: int, cwd: str) -> dict[str, float]:
    """Median wall time of each command, run in turns (one of each per round, after one warm-up
    round), so a change in the machine's load falls on all of them alike."""
    walls: dict[str, list[float]] = {name: [] for name in commands}
    for round_ in range(runs + 1):
        for name, argv in commands.items():
            t0 = time.perf_counter()
            subprocess.run(argv, env=env, cwd=cwd, check=True, capture_output=True)
            if round_:
                walls[name].append(time.perf_counter() - t0)
    return {name: statistics.median(w) for name, w in walls.items()}


def _start_daemon(slurm_conf: str, submit_with: str) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    # Measure the program as installed: with its compiled modules (daemon_env).
    work, env = daemon_env("gbroker-bench-", slurm_conf)
    env["GBROKER_TICK_SECONDS"] = "5"
    env["GBROKER_SLURM_SUBMIT"] = submit_with
    sock = str(work / "sock")
    daemon = subprocess.Popen([sys.executable, "-m", "broker", "--socket", sock, "daemon", "--log-level", "WARNING"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for _ in range(100):
        if os.path.exists(sock) or daemon.poll() is not None:
            break
        time.sleep(0.1)
    if daemon.poll() is not None:
        raise SystemExit(f"the daemon ({submit_with}) did not start: {daemon.stderr.read().decode()}")  # type: ignore[union-attr]
    time.sleep(0.5)
    return daemon, sock, env


def bench_submit(runs: int, cli_python: str = sys.executable) -> dict[str, float]:
    """gbroker submit to a daemon queueing with sbatch and to one queueing through libslurm,
    in the same rounds as the floors; the CLI and the click floor run with ``cli_python``
    (the daemons with this Python)."""
    script = Path(cli_python).with_name("gbroker")
    gbroker = [str(script)] if script.exists() else [cli_python, "-m", "broker"]
    slurm_conf = dev_cluster_conf()
    daemons = {way: _start_daemon(slurm_conf, way) for way in ("sbatch", "libslurm")}
    env = daemons["sbatch"][2]
    try:
        hold = ["--hold"]  # held jobs: measure submission, not scheduling
        sbatch = ["sbatch", "--parsable", "-p", "spot", "-A", "vision", "-t", "5", *hold, "--wrap", "sleep 1"]
        click_then_sbatch = ["sh", "-c", f'"{cli_python}" -c "import click" && exec "$@"', "sh", *sbatch]
        commands = {
            "python -c 'import click'": [cli_python, "-c", "import click"],
            "gbroker status": [*gbroker, "--socket", daemons["libslurm"][1], "status"],
            "sbatch": sbatch,
            "python+click+sbatch": click_then_sbatch,
        }
        for way, (_, sock, _) in daemons.items():
            commands[f"gbroker submit ({way})"] = [*gbroker, "--socket", sock, "submit", "--group", "vision",
                                                   "--time", "5m", "--", "sleep", "1"]
        results = _median_walls(commands, env, runs, os.path.dirname(daemons["sbatch"][1]))
    finally:
        for daemon, _, _ in daemons.values():
            daemon.terminate()
            daemon.wait(30)
        subprocess.run(["scancel", "-u", "root", "--name", "wrap"], env=env)
        ids = subprocess.run(["squeue", "-h", "-u", "root", "-o", "%i %j"], env=env, capture_output=True,
                             text=True).stdout
        gb_ids = [line.split()[0] for line in ids.splitlines() if line.split()[1].startswith("gb-")]
        if gb_ids:
            subprocess.run(["scancel", *gb_ids], env=env)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--ticks-only", action="store_true")
    ap.add_argument("--submit-only", action="store_true", help="Part 1 only.")
    ap.add_argument("--cli-python", default=sys.executable, metavar="PYTHON",
                    help="The Python whose gbroker (and click, for the floor) is measured [default: this one].")
    args = ap.parse_args()
    if not args.ticks_only:
        sub = bench_submit(args.runs, args.cli_python)
        click_only = sub.pop("python -c 'import click'")
        status = sub.pop("gbroker status")
        print(f"CLI start-up, median of {args.runs}: python -c 'import click' {click_only * 1000:.1f} ms, "
              f"gbroker status (one daemon round trip) {status * 1000:.1f} ms, x{status / click_only:.2f}")
        base = sub["sbatch"]
        print(f"submit latency, median of {args.runs} (ratio to plain sbatch):")
        for name, wall in sub.items():
            print(f"  {name:<22} {wall * 1000:8.1f} ms   x{wall / base:5.2f}")
        for way in ("sbatch", "libslurm"):
            print(f"  gbroker submit ({way}) over python+click+sbatch: "
                  f"x{sub[f'gbroker submit ({way})'] / sub['python+click+sbatch']:.2f}")
        script = Path(args.cli_python).with_name("gbroker")
        shown = str(script) if script.exists() else f"{args.cli_python} -m broker"
        print(f"  (gbroker run as {shown}; the daemon queues with sbatch as the user, or through libslurm)")
        print(f"  load average {os.getloadavg()[0]:.2f} (1 min; {os.cpu_count()} CPUs)")
        if args.submit_only:
            return
    print("reconcile tick (SQLite, recorded squeue answer):")
    rows = {n: bench_ticks(n) for n in (100, 10_000)}
    for n, r in rows.items():
        print(f"  {n:>6} jobs: first tick {r['first_s'] * 1000:8.1f} ms, steady tick {r['steady_s'] * 1000:8.1f} ms, "
              f"Slurm calls per tick {r['calls']:.0f}")
    ratio = rows[10_000]["steady_s"] / rows[100]["steady_s"]
    print(f"  10,000 / 100 jobs steady tick time: x{ratio:.1f} (jobs x100); Slurm calls: "
          f"{rows[100]['calls']:.0f} -> {rows[10_000]['calls']:.0f}")


if __name__ == "__main__":
    main()
