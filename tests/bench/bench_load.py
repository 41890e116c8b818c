"""Load benchmark: concurrent clients submitting while another user's `status` is timed.

8 client processes (as the user alice, each with ``broker.client.Client``)
submit 1,000 jobs in all to a real daemon on the dev cluster, as fast as the
daemon answers; meanwhile a process as bob asks for his `status` every 20 ms.
It prints submissions per second, submit p50/p99, status p50/p99 and the load
average. The submitter's group has a semester budget and GPU quotas, as in a
lab, so each submission is admitted against them (``--no-lab``: none).
Targets (issue 17): >= 100 submissions/s, status p99 < 0.2 s. First,
as the floor, the same number of plain sbatch calls by as many processes as
the same user, timed in the same run (gbroker submits each job with sbatch, as
its user, so it cannot beat that rate).

The cluster stays sane: the partition the jobs go to is set DOWN for the run
(Slurm queues jobs there and starts none, so no node powers up), and every job
is cancelled and the partition set UP again at the end.

Run as root, the dev cluster up (or it is started):
    python tests/bench/bench_load.py [--jobs 1000] [--clients 8]
    python tests/bench/bench_load.py --queued 100,10000 [--jobs 1000]
        # the same submissions with 100 and then 10,000 of the group's jobs already queued
        # (stored as pending rows through the model, ticks off meanwhile): admission must
        # not cost more with the queue; both rates and their ratio are printed
    python tests/bench/bench_load.py --profile /tmp/daemon.txt
        # where the daemon's time goes while the clients submit: py-spy (pip install py-spy)
        # samples it, and the functions that take the most of it are printed
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from dev_daemon import daemon_env, dev_cluster_conf

REPO = Path(__file__).resolve().parents[2]
PARTITION = "spot"

WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from broker.client import Client
sock, n, start_at, workdir = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
client = Client(sock)
spec = {"group": "vision", "time_limit": "5m", "partition": sys.argv[6], "name": "load",
        "command": ["true"], "workdir": workdir}
while time.time() < start_at:
    time.sleep(0.001)
out = []
for _ in range(n):
    t = time.perf_counter()
    client.submit(spec)
    out.append(time.perf_counter() - t)
print(json.dumps({"lat": out, "end": time.time()}))
"""

SBATCH = r"""
import os, subprocess, sys, time
n, start_at, partition, workdir = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
argv = ["sbatch", "--parsable", "-p", partition, "-A", "vision", "-t", "5", "-J", "load-floor",
        "-o", "/dev/null", "-D", workdir]
while time.time() < start_at:
    time.sleep(0.001)
for _ in range(n):
    subprocess.run(argv, input="#!/bin/sh\ntrue\n", text=True, check=True, capture_output=True)
print(time.time())
"""
"""The floor: the same number of plain sbatch calls by the same number of processes as the same user
(what any broker that submits each job through sbatch, as its user, cannot beat on this machine)."""

QUEUE = r"""
import sys, uuid
from datetime import datetime, timezone
sys.path.insert(0, sys.argv[1])
from broker.db import store
from broker.db.engine import make_engine, session_factory
from broker.spec import spec_from_dict
from broker.states import JobState
from policies import Capacity
url, n, owner, uid, workdir, partition = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6], sys.argv[7]
spec = spec_from_dict({"group": "vision", "time_limit": "5m", "partition": partition, "name": "queued",
                       "command": ["true"], "workdir": workdir})
now = datetime.now(timezone.utc)
sessions = session_factory(make_engine(url))
with sessions() as s:
    for _ in range(n):
        store.insert_job(s, store.job_values(
            key="gb-" + uuid.uuid4().hex[:24], spec=spec, owner_uid=uid, owner_name=owner, now=now,
            state=JobState.PENDING, placement_policy="cheapest", capacity=Capacity.SPOT, partition=partition,
            estimate_micros=76_500, reserved_micros=76_500, reason="queued for the benchmark", log_path=None))
    s.commit()
"""
"""Stores n of the group's jobs as pending rows, each holding money and a GPU, as submissions
would have (the daemon's ticks are off meanwhile, so nothing acts on them)."""

STATUS = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from broker.client import Client
sock, start_at, stop_file = sys.argv[2], float(sys.argv[3]), sys.argv[4]
client = Client(sock)
while time.time() < start_at:
    time.sleep(0.001)
out = []
while not os.path.exists(stop_file):
    t = time.perf_counter()
    client.status()
    out.append(time.perf_counter() - t)
    time.sleep(0.02)
print(json.dumps({"lat": out}))
"""


def cpu_s(pid: int, children: bool = True) -> float:
    """CPU seconds (user + system) a process used, with the children it waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15 if children else 13]) / os.sysconf("SC_CLK_TCK")


def slurmctld_pid(slurm_conf: str) -> int | None:
    """slurmctld's pid, from the dev cluster's state directory (next to its slurm.conf)."""
    try:
        return int((Path(slurm_conf).parent / "run" / "slurmctld.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sbatch_floor(args: argparse.Namespace, env: dict[str, str], sub: pwd.struct_passwd, workdir: str) -> float:
    """Submissions per second of plain sbatch, as many jobs by as many processes; they are cancelled after."""
    start_at = time.time() + 1.0
    per = [args.jobs // args.clients + (1 if i < args.jobs % args.clients else 0) for i in range(args.clients)]
    procs = [subprocess.Popen([sys.executable, "-c", SBATCH, str(n), str(start_at), PARTITION, workdir], env=env,
                              stdout=subprocess.PIPE, text=True, cwd="/", user=sub.pw_uid, group=sub.pw_gid,
                              extra_groups=[])
             for n in per]
    ends = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"plain sbatch failed (exit {p.returncode})")
        ends.append(float(out))
    subprocess.run(["scancel", "-u", args.submitter, "-p", PARTITION, "-n", "load-floor"], env=env)
    return float(args.jobs / (max(ends) - start_at))


def set_up_lab(args: argparse.Namespace, env: dict[str, str], sock: str) -> str:
    """What a lab runs with: the submitter's group has a semester budget and GPU quotas, so
    every submission is admitted against them (money held by the queued jobs, GPUs in flight)."""
    year = time.gmtime().tm_year
    room = (args.jobs * (1 + len(args.queued)) + max(args.queued, default=0)) * 2
    admin = [sys.executable, "-m", "broker", "--socket", sock]
    for argv in (
        ["semester", "add", "bench", "--start", f"{year - 1}-01-01", "--end", f"{year + 1}-12-31"],
        ["group", "add", "vision", "--account", "vision", "--member", args.submitter],
        ["price", "set", PARTITION, "--capacity", "spot", "--price", "0.918", "--from", f"{year - 1}-01-01"],
        ["budget", "set", "vision", "--semester", "bench", "--amount", "1000000"],
        ["quota", "set", "vision", "--gpus", str(room), "--class-gpus", f"spot={room}"],
    ):
        done = subprocess.run([*admin, *argv], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"gbroker {' '.join(argv)}: {done.stderr.strip()}")
    return f"group vision with a budget and quotas ({room} GPUs), checked at each submission"


def print_profile(path: str, top: int = 25) -> None:
    """Where the daemon held the GIL (py-spy's collapsed stacks, sampled with --gil): inclusive share."""
    total, inclusive, own = 0, dict[str, int](), dict[str, int]()
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1]
                  for f in stack.split(";")[1:]]
        total += n
        for f in set(frames):
            inclusive[f] = inclusive.get(f, 0) + n
        if frames:
            own[frames[-1]] = own.get(frames[-1], 0) + n
    if not total:
        print(f"  profile: no samples in {path}")
        return
    print(f"  profile ({total} samples of the daemon; inclusive %, own %):")
    for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {100 * n / total:5.1f} {100 * own.get(f, 0) / total:5.1f}  {f}")


def measure(args: argparse.Namespace, env: dict[str, str], sock: str, work: Path, daemon: subprocess.Popen[bytes],
            floor_rate: float, lab: str, procs: list[subprocess.Popen[str]]) -> tuple[float, float]:
    """The clients submit while bob asks for his status; prints the figures, returns (submissions/s, status p99 s)."""
    slurm_conf = dev_cluster_conf()
    jobs_dir = work / "jobs"
    sub = pwd.getpwnam(args.submitter)
    reader = pwd.getpwnam(args.reader)
    time.sleep(1.0)
    load_before = os.getloadavg()
    ctld = slurmctld_pid(slurm_conf)
    cpu_before = (cpu_s(daemon.pid), cpu_s(ctld) if ctld else 0.0, os.times(), cpu_s(daemon.pid, children=False))
    start_at = time.time() + 1.5
    per = [args.jobs // args.clients + (1 if i < args.jobs % args.clients else 0) for i in range(args.clients)]
    stop_file = str(work / f"stop-{start_at}")
    as_user = {"user": sub.pw_uid, "group": sub.pw_gid, "extra_groups": []}
    clients = [subprocess.Popen(  # type: ignore[call-overload]
        [sys.executable, "-c", WORKER, str(REPO), sock, str(n), str(start_at), str(jobs_dir), PARTITION],
        env=env, stdout=subprocess.PIPE, text=True, cwd="/", **as_user)
        for n in per]
    procs.extend(clients)  # killed at the end if still running
    status_proc = subprocess.Popen(
        [sys.executable, "-c", STATUS, str(REPO), sock, str(start_at), stop_file],
        env=env, stdout=subprocess.PIPE, text=True, cwd="/",
        user=reader.pw_uid, group=reader.pw_gid, extra_groups=[])
    spy = None
    if args.profile:
        spy_bin = shutil.which("py-spy", path=os.path.dirname(sys.executable) + ":" + os.environ["PATH"])
        assert spy_bin is not None
        spy = subprocess.Popen([spy_bin, "record", "--pid", str(daemon.pid), "--format", "raw", "--rate", "250", "--gil",
                                "--nonblocking", "--output", args.profile], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    results = []
    for p in clients:
        out, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"a client failed (exit {p.returncode}); see {work}/daemon.log")
        results.append(json.loads(out))
    Path(stop_file).touch()
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
    status_out, _ = status_proc.communicate(timeout=60)
    load_after = os.getloadavg()
    after = os.times()
    daemon_cpu = cpu_s(daemon.pid) - cpu_before[0]
    daemon_own = cpu_s(daemon.pid, children=False) - cpu_before[3]
    ctld_cpu = (cpu_s(ctld) if ctld else 0.0) - cpu_before[1]
    clients_cpu = (after.children_user + after.children_system
                   - cpu_before[2].children_user - cpu_before[2].children_system)
    lat = [x for r in results for x in r["lat"]]
    wall = max(r["end"] for r in results) - start_at
    status_lat = json.loads(status_out)["lat"]
    print(f"{len(lat)} submissions by {args.clients} clients ({args.submitter}) in {wall:.2f} s: "
          f"{len(lat) / wall:.1f} submissions/s ({lab})")
    print(f"  floor: {args.jobs} plain sbatch calls by {args.clients} processes ({args.submitter}), same "
          f"partition: {floor_rate:.1f} /s; gbroker {len(lat) / wall / floor_rate:.2f} of it")
    print(f"  submit  p50 {statistics.median(lat) * 1000:7.1f} ms   p99 {pct(lat, 0.99) * 1000:7.1f} ms   "
          f"max {max(lat) * 1000:7.1f} ms")
    print(f"  status ({args.reader}, {len(status_lat)} calls)  p50 {statistics.median(status_lat) * 1000:7.1f} ms"
          f"   p99 {pct(status_lat, 0.99) * 1000:7.1f} ms   max {max(status_lat) * 1000:7.1f} ms")
    print(f"  load average before {load_before[0]:.2f}, after {load_after[0]:.2f} "
          f"(1 min; {os.cpu_count()} CPUs)")
    n = max(1, len(lat))
    print(f"  CPU per submission: daemon {daemon_cpu / n * 1000:.1f} ms (its own {daemon_own / n * 1000:.1f} ms, "
          f"its children the rest), slurmctld {ctld_cpu / n * 1000:.1f} ms, clients {clients_cpu / n * 1000:.1f} ms; "
          f"{(daemon_cpu + ctld_cpu + clients_cpu) / wall:.2f} CPUs busy with it")
    queued = subprocess.run(["squeue", "-h", "-u", args.submitter, "-p", PARTITION, "-o", "%j"], env=env,
                            capture_output=True, text=True).stdout.split()
    print(f"  Slurm queue: {sum(1 for j in queued if j.startswith('gb-'))} gbroker jobs of {args.submitter}")
    if args.profile:
        print_profile(args.profile)
    return len(lat) / wall, pct(status_lat, 0.99)


def measure_all(args: argparse.Namespace, env: dict[str, str], sock: str, work: Path, daemon: subprocess.Popen[bytes],
                floor_rate: float, lab: str, procs: list[subprocess.Popen[str]]) -> None:
    """One measurement, or (``--queued``) one per queue length, more rows stored before each."""
    if not args.queued:
        measure(args, env, sock, work, daemon, floor_rate, lab, procs)
        return
    sub = pwd.getpwnam(args.submitter)
    rates: dict[int, tuple[float, float]] = {}
    stored = 0
    for level in args.queued:
        more = max(0, level - stored - len(rates) * args.jobs)  # the submissions of earlier levels are queued too
        subprocess.run([sys.executable, "-c", QUEUE, str(REPO), env["GBROKER_DB_URL"], str(more), sub.pw_name,
                        str(sub.pw_uid), str(work / "jobs"), PARTITION], env=env, check=True)
        stored += more
        print(f"-- with {stored + len(rates) * args.jobs} of the group's jobs already queued:")
        rates[level] = measure(args, env, sock, work, daemon, floor_rate, f"{lab}; {level} queued", procs)
    first, last = args.queued[0], args.queued[-1]
    print(f"submissions/s with {last} queued / with {first} queued: {rates[last][0] / rates[first][0]:.2f} "
          f"(target >= 0.9); of the sbatch floor: {rates[first][0] / floor_rate:.2f} and "
          f"{rates[last][0] / floor_rate:.2f} (target >= 0.6); status p99 {rates[first][1] * 1000:.0f} ms and "
          f"{rates[last][1] * 1000:.0f} ms (target < 200 ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--submitter", default="alice")
    ap.add_argument("--reader", default="bob")
    ap.add_argument("--keep", action="store_true", help="Keep the work directory (the daemon's log, at INFO).")
    ap.add_argument("--no-lab", action="store_true",
                    help="No group, budget or quota (by default the submitter's group has all three).")
    ap.add_argument("--queued", type=lambda v: [int(x) for x in v.split(",")], default=[], metavar="N,M",
                    help="Measure with N, then M, of the group's jobs already queued (stored as pending rows; "
                         "the daemon's ticks are off meanwhile).")
    ap.add_argument("--profile", metavar="FILE",
                    help="Sample the daemon with py-spy while the clients submit; its stacks go to FILE "
                         "(collapsed, one per line) and the costliest functions are printed.")
    args = ap.parse_args()
    if args.profile and not shutil.which("py-spy", path=os.path.dirname(sys.executable) + ":" + os.environ["PATH"]):
        sys.exit("--profile needs py-spy: pip install py-spy")
    if os.geteuid() != 0:
        sys.exit("run as root (the daemon submits as the users)")
    slurm_conf = dev_cluster_conf()
    work, env = daemon_env("gbroker-load-", slurm_conf)
    if args.queued:
        env["GBROKER_TICK_SECONDS"] = "3600"  # the stored queue is not in Slurm: no tick may act on it
    jobs_dir = work / "jobs"
    jobs_dir.mkdir()
    sub = pwd.getpwnam(args.submitter)
    os.chown(jobs_dir, sub.pw_uid, sub.pw_gid)
    sock = str(work / "sock")
    scontrol = ["scontrol", "update", f"PartitionName={PARTITION}"]
    subprocess.run([*scontrol, "State=DOWN"], env=env, check=True)
    daemon = subprocess.Popen([sys.executable, "-m", "broker", "--socket", sock, "daemon", "--log-level",
                               "INFO" if args.keep else "WARNING"],
                              env=env, stdout=subprocess.DEVNULL, stderr=open(work / "daemon.log", "w"))
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(200):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        time.sleep(0.5)
        lab = "no group, budget or quota" if args.no_lab else set_up_lab(args, env, sock)
        floor_rate = sbatch_floor(args, env, sub, str(jobs_dir))
        measure_all(args, env, sock, work, daemon, floor_rate, lab, procs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        daemon.terminate()
        daemon.wait(30)
        subprocess.run(["scancel", "-u", args.submitter, "-p", PARTITION], env=env)
        subprocess.run([*scontrol, "State=UP"], env=env)
        if args.keep:
            print(f"  kept {work} (daemon.log)")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

