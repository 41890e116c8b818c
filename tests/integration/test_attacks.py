"""A hostile user against the root daemon, on the real dev cluster.

Each test is written the way an attacker would try it: as the unprivileged
users alice, bob and carol, through the real CLI and straight through the
socket, against a real daemon running as root and real Slurm. Each shows one
hole is closed (docs/SECURITY.md lists them), and that during the attack
another user's `gbroker status` still answers within a second.
"""

from __future__ import annotations

import json
import os
import pwd
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from attack_tools import (
    StatusProbe,
    daemon_rss_mb,
    daemon_threads,
    mode_of,
    op,
    raw_request,
    run_as,
    user_kwargs,
)
from broker_fixtures import (  # noqa: F401  (fixture)
    BrokerDaemon,
    broker_daemon,
    clear_launch_failures,
    fail_launch,
    power_down_idle,
    public_dir,
    user_dir,
)

pytestmark = pytest.mark.slurm


def ok(r: Any) -> Any:
    assert r.code == 0, f"exit {r.code}\nstdout: {r.out}\nstderr: {r.err}"
    return r


def submit(d: BrokerDaemon, *args: str, user: str = "alice", cwd: Any = None) -> dict[str, Any]:
    return ok(d.cli("submit", "--json", *args, user=user, cwd=cwd)).json()


def slurm_state(cluster: Any, slurm_id: int | str) -> str:
    state = cluster.job_field(str(slurm_id), "JobState")
    if state:
        return state
    out = cluster.run(["sacct", "-n", "-X", "-P", "-j", str(slurm_id), "--format=State"], check=False).stdout
    return out.split("\n")[0].split()[0] if out.strip() else ""


def sbatch_as(cluster: Any, user: str, *args: str) -> int:
    out = cluster.as_user(user, ["sbatch", "--parsable", *args]).stdout.strip()
    return int(out.split(";")[0])


# -- 1. the environment a job names never reaches sbatch --------------------------------------
FAKE_SBATCH = """#!/bin/sh
# Whatever it is asked, print someone else's job id.
cat >/dev/null
echo {victim}
"""


def test_a_jobs_env_cannot_make_root_touch_another_users_job(broker_daemon, slurm_cluster):
    d = broker_daemon
    bob_dir = user_dir(public_dir("gbroker-bob-"), "bob")
    victim = sbatch_as(slurm_cluster, "bob", "-p", "spot", "-A", "vision", "-t", "10",
                       "-o", str(bob_dir / "victim.out"), "--wrap", "sleep 600")
    try:
        evil = user_dir(public_dir("gbroker-evil-"), "alice")
        fake = evil / "sbatch"
        fake.write_text(FAKE_SBATCH.format(victim=victim))
        fake.chmod(0o755)
        os.chown(fake, pwd.getpwnam("alice").pw_uid, -1)
        hostile_envs = [
            f"PATH={evil}:/usr/bin:/bin",
            f"LD_PRELOAD={evil}/x.so",
            f"LD_LIBRARY_PATH={evil}",
            f"BASH_ENV={evil}/rc",
            f"PYTHONPATH={evil}",
            "slurm_conf=/tmp/x",
        ]
        with StatusProbe(d) as probe:
            for env in hostile_envs:
                r = d.cli("submit", "--json", "--group", "vision", "--time", "5m", "--env", env,
                          "--", "sleep", "1", cwd=evil)
                name = env.split("=", 1)[0]
                if r.code == 0:
                    # Accepted: then it must be alice's own job, never the victim.
                    job = r.json()
                    assert job.get("slurm_job_id") != victim, f"{name}: bound to bob's job {victim}"
                    ok(d.cli("cancel", str(job["id"]), cwd=evil))
                else:
                    assert name.lower() in r.err.lower(), r.err
                    assert "Traceback" not in r.err, r.err
        probe.check()
        # A plain job of alice's, then her cancel: root's scancel reaches only her job.
        job = submit(d, "--group", "vision", "--time", "5m", "--", "sleep", "300", cwd=evil)
        ok(d.cli("cancel", str(job["id"]), cwd=evil))
        time.sleep(2)
        assert slurm_state(slurm_cluster, victim) in ("PENDING", "RUNNING", "CONFIGURING"), (
            f"bob's job {victim} is {slurm_state(slurm_cluster, victim)} after alice's actions"
        )
        assert not any(e["kind"] == "cancelled" and str(victim) in e["message"]
                       for e in d.show(job["id"])["events"])
    finally:
        slurm_cluster.run(["scancel", str(victim)], check=False)


def test_the_job_env_reaches_the_job_through_its_script(broker_daemon, slurm_cluster):
    d = broker_daemon
    work = user_dir(public_dir("gbroker-env-"), "alice")
    job = submit(d, "--group", "vision", "--time", "5m", "--partition", "ondemand",
                 "--env", "GREETING=hello world; $(id)", "--env", "TMPDIR=/tmp",
                 "--", "/bin/sh", "-c", 'printf "%s|%s\\n" "$GREETING" "$TMPDIR" > env-seen.txt', cwd=work)
    d.wait_job(job["id"], lambda j: j["state"] == "completed", timeout=240)
    assert (work / "env-seen.txt").read_text() == "hello world; $(id)|/tmp\n"


# -- 2. a gbroker admin who is not root does not get root ----------------------------------
def test_alert_commands_never_run_as_root(broker_daemon, slurm_cluster):
    d = broker_daemon
    admins = "gbtest-admins"
    subprocess.run(["groupadd", "-f", admins], check=True)
    subprocess.run(["gpasswd", "-a", "bob", admins], check=True, capture_output=True)
    d.stop()
    d.start(GBROKER_ADMIN_GROUP=admins)
    out = public_dir("gbroker-alert-")
    out.chmod(0o777)
    marker = out / "alert-uid"
    try:
        today = datetime.now(UTC).date()
        bob = lambda *a: ok(d.cli(*a, user="bob"))  # noqa: E731  (bob is a gbroker admin, not root)
        bob("semester", "add", "alert-term", "--start", str(today - timedelta(days=1)),
            "--end", str(today + timedelta(days=30)))
        bob("group", "add", "vision", "--member", "alice", "--member", "bob")
        prices = public_dir("gbroker-prices-") / "p.csv"
        prices.write_text("partition,capacity,price_per_gpu_hour,effective_from\n"
                          f"ondemand,ondemand,7200,{today - timedelta(days=1)}\n"
                          f"spot,spot,7200,{today - timedelta(days=1)}\n")
        prices.chmod(0o644)
        bob("price", "import", str(prices))
        bob("budget", "set", "vision", "--semester", "alert-term", "--amount", "1000", "--thresholds", "1",
            "--alert-command", f"/bin/sh -c 'id -u > {marker}; touch /root/gbroker-alert-was-root'")
        work = user_dir(public_dir("gbroker-alert-job-"), "alice")
        job = submit(d, "--group", "vision", "--time", "2m", "--partition", "ondemand", "--",
                     "sleep", "8", cwd=work)
        d.wait_job(job["id"], lambda j: j["state"] == "completed", timeout=240)
        deadline = time.monotonic() + 90
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert marker.exists(), f"the alert command never ran\n{d.log_tail()}"
        time.sleep(1)
        assert marker.read_text().strip() == str(pwd.getpwnam("nobody").pw_uid), marker.read_text()
        assert not Path("/root/gbroker-alert-was-root").exists()
    finally:
        Path("/root/gbroker-alert-was-root").unlink(missing_ok=True)
        subprocess.run(["gpasswd", "-d", "bob", admins], check=False, capture_output=True)


# -- 3. the database is not readable by every user ------------------------------------------
@pytest.mark.fresh_db
def test_the_database_and_its_journals_are_private(broker_daemon, slurm_cluster):
    d = broker_daemon
    work = user_dir(public_dir("gbroker-db-"), "alice")
    submit(d, "--group", "vision", "--time", "5m", "--env", "API_TOKEN=s3cret", "--", "sleep", "1", cwd=work)
    db = d.db_url.removeprefix("sqlite:///")
    for path in (db, db + "-wal", db + "-shm"):
        if os.path.exists(path):
            assert mode_of(path) & 0o077 == 0, f"{path} is mode {oct(mode_of(path))}"
    p = run_as(d, "carol", ["/bin/cat", db])
    assert p.returncode != 0 and b"s3cret" not in p.stdout
    # A database someone made world-readable: the daemon refuses to start and says how to fix it.
    d.stop()
    os.chmod(db, 0o644)
    env = dict(d.env)
    r = subprocess.run([sys.executable, "-m", "broker", "--socket", d.socket, "daemon"], env=env,
                       capture_output=True, text=True, timeout=60, cwd=str(d.workdir))
    assert r.returncode != 0
    assert "chmod" in r.stderr and db in r.stderr, r.stderr
    os.chmod(db, 0o600)
    d.start()


# -- 4. the root daemon never reads a path a user names ----------------------------------------
def _await_running(d: BrokerDaemon, job_id: int) -> dict[str, Any]:
    return d.wait_job(job_id, lambda j: j["state"] == "running" and j["attempts"][-1]["state"] == "running",
                      timeout=240)


def test_checkpoint_dirs_are_read_as_their_owner_and_cannot_block_the_daemon(broker_daemon, slurm_cluster):
    d = broker_daemon
    work = user_dir(public_dir("gbroker-ck-"), "alice")
    # A directory only root may read, holding a manifest that claims a save a second ago.
    secret = Path(public_dir("gbroker-rootonly-"))
    secret.chmod(0o700)
    # A directory of alice's whose manifest is a FIFO: opening it blocks forever.
    fifo_dir = user_dir(work / "fifo-ck", "alice")
    os.mkfifo(fifo_dir / "gbroker-checkpoint.json")
    os.chown(fifo_dir / "gbroker-checkpoint.json", pwd.getpwnam("alice").pw_uid, -1)
    # The CLI would refuse a directory alice cannot read; a job file goes straight through.
    job_file = work / "secret.toml"
    job_file.write_text(f'group = "vision"\ngpus_per_node = 4\ntime_limit = "10m"\ncommand = ["sleep", "300"]\n'
                        f'[checkpoint]\nstyle = "signal"\ndir = "{secret}"\n')
    a = submit(d, str(job_file), cwd=work)
    b = submit(d, "--group", "vision", "--gpus", "4", "--time", "10m", "--checkpoint-dir", str(fifo_dir),
               "--checkpoint-style", "signal", "--", "sleep", "300", cwd=work)
    ja, jb = _await_running(d, a["id"]), _await_running(d, b["id"])
    time.sleep(6)
    (secret / "gbroker-checkpoint.json").write_text(json.dumps({"file": "x", "seq": 1, "saved_at": time.time()}))
    with StatusProbe(d) as probe:
        slurm_cluster.reclaim(ja["attempts"][-1]["nodes"])
        slurm_cluster.reclaim(jb["attempts"][-1]["nodes"])
        # Another user's submission goes through while the daemon settles both reclaims.
        carol = user_dir(public_dir("gbroker-carol-"), "carol")
        t = time.monotonic()
        submit(d, "--group", "climate", "--time", "5m", "--", "sleep", "1", user="carol", cwd=carol)
        assert time.monotonic() - t < 10
        for job in (a, b):
            d.wait_job(job["id"], lambda j: len(j["attempts"]) >= 2 and j["attempts"][0]["state"] == "reclaimed",
                       timeout=120)
    probe.check()
    first = d.show(a["id"])["attempts"][0]
    run = (datetime.fromisoformat(first["ended_at"]) - datetime.fromisoformat(first["started_at"])).total_seconds()
    # Root's view of the secret manifest would say "saved a moment before the reclaim".
    assert first["lost_s"] >= run - 2, f"lost {first['lost_s']}s of a {run:.0f}s run: root read the manifest"
    for job in (a, b):
        ok(d.cli("cancel", str(job["id"]), cwd=work))


# -- 5. letter case does not get around budgets and quotas ------------------------------------
def test_group_spelling_cannot_bypass_budget_or_quota(broker_daemon, slurm_cluster):
    d = broker_daemon
    today = datetime.now(UTC).date()
    root = lambda *a: ok(d.cli(*a, user="root"))  # noqa: E731
    root("semester", "add", "case-term", "--start", str(today - timedelta(days=1)), "--end", str(today + timedelta(days=30)))
    root("group", "add", "vision", "--member", "alice", "--member", "bob")
    root("price", "set", "spot", "--capacity", "spot", "--price", "3.60", "--from", str(today - timedelta(days=1)))
    root("price", "set", "ondemand", "--capacity", "ondemand", "--price", "7.20", "--from", str(today - timedelta(days=1)))
    root("budget", "set", "vision", "--semester", "case-term", "--amount", "0.01")
    root("quota", "set", "vision", "--gpus", "1")
    work = user_dir(public_dir("gbroker-case-"), "alice")
    for spelling in ("VISION", "Vision", "vIsIoN"):
        r = d.cli("submit", "--group", spelling, "--gpus", "2", "--time", "10m", "--", "sleep", "1", cwd=work)
        assert r.code != 0, f"--group {spelling} was admitted past vision's budget and quota: {r.out}"
        assert "vision" in r.err.lower() and ("quota" in r.err or "budget" in r.err or "left" in r.err), r.err
    assert ok(d.cli("history", "--json", cwd=work)).json() == []
    # Admin commands name the group in any spelling too, and never make a second one.
    r = d.cli("group", "add", "VISION", "--member", "carol", user="root")
    assert r.code != 0 and "exists" in r.err, r.err


# -- 6. a job's log never follows a symlink another user planted -----------------------------
def test_default_job_log_never_follows_a_planted_symlink(broker_daemon, slurm_cluster):
    d = broker_daemon
    shared = public_dir("gbroker-shared-")
    shared.chmod(0o1777)  # like /tmp: everyone may create files, nobody may remove another's
    victim = Path(pwd.getpwnam("alice").pw_dir) / "precious.txt"
    victim.write_text("alice's thesis\n")
    os.chown(victim, pwd.getpwnam("alice").pw_uid, -1)
    for i in range(1, 6):  # bob guesses the next job numbers' log names
        run_as(d, "bob", ["/bin/ln", "-s", str(victim), str(shared / f"gbroker-{i}.out")])
    try:
        job = submit(d, "--group", "vision", "--time", "5m", "--partition", "ondemand",
                     "--", "echo", "pwned", cwd=shared)
        done = d.wait_job(job["id"], lambda j: j["state"] in ("completed", "failed"), timeout=240)
        assert done["state"] == "completed", done
        assert victim.read_text() == "alice's thesis\n"
        log_path = Path(done["log"])
        assert log_path.parent == shared and not log_path.is_symlink()
        assert log_path.stat().st_uid == pwd.getpwnam("alice").pw_uid
        assert "pwned" in log_path.read_text()
    finally:
        victim.unlink(missing_ok=True)


# -- 7. a refused submission leaves no row; a bad row never stops the tick -------------------
def test_refused_submissions_leave_nothing_and_a_bad_row_never_stops_the_tick(broker_daemon, slurm_cluster):
    d = broker_daemon
    work = user_dir(public_dir("gbroker-refused-"), "alice")
    for env in ("SRUN_CPU_BIND=none", "SALLOC_PARTITION=ondemand", "Slurm_Conf=/tmp/x"):
        r = d.cli("submit", "--group", "vision", "--time", "5m", "--env", env, "--", "sleep", "1", cwd=work)
        assert r.code != 0 and "env" in r.err.lower(), r.err
    assert ok(d.cli("history", "--json", cwd=work)).json() == []
    # A row the daemon cannot read back (as after a bug or a bad manual edit), of a job whose end
    # (a failure, to be retried) the tick must read its spec for ...
    bad = submit(d, "--group", "vision", "--time", "5m", "--partition", "ondemand", "--",
                 "/bin/sh", "-c", "sleep 5; exit 1", cwd=work)
    db = sqlite3.connect(d.db_url.removeprefix("sqlite:///"))
    with db:
        db.execute("UPDATE jobs SET spec_json = '{not json' WHERE id = ?", (bad["id"],))
    db.close()
    # ... does not stop the tick: carol's job still runs to completion.
    carol = user_dir(public_dir("gbroker-carol-"), "carol")
    good = submit(d, "--group", "climate", "--time", "5m", "--partition", "ondemand", "--", "sleep", "1",
                  user="carol", cwd=carol)
    d.wait_job(good["id"], lambda j: j["state"] == "completed", timeout=240, user="carol")
    d.wait_job(bad["id"], lambda j: "could not process" in j["reason"], timeout=120)
    time.sleep(3)  # more ticks: the error stays said once
    log = d.log_path.read_text()
    assert log.count(f"job {bad['id']}: gbroker could not process") == 1, "the bad row's error is logged at every tick"
    slurm_cluster.run(["scancel", "-u", "alice"], check=False)


# -- 8. one request cannot stall everyone --------------------------------------------------------
def test_a_huge_cancel_is_refused_at_once_and_stalls_nobody(broker_daemon, slurm_cluster):
    d = broker_daemon
    work = user_dir(public_dir("gbroker-cancel-"), "alice")
    mine = submit(d, "--group", "vision", "--time", "5m", "--", "sleep", "60", cwd=work)
    with StatusProbe(d) as probe:
        # Her own job, named 100,000 times: each name used to cost a lookup under the daemon's lock.
        out = op(d, "alice", "cancel", job_ids=[mine["id"]] * 100_000)
        time.sleep(1.0)
    probe.check()
    assert out["json"] is not None and out["json"]["ok"] is False, out
    assert out["seconds"] < 2, f"the cancel took {out['seconds']:.1f}s"
    assert "at most" in out["json"]["error"]["message"], out["json"]
    ok(d.cli("cancel", str(mine["id"]), cwd=work))


# -- 9. connections are bounded ----------------------------------------------------------------
FLOOD = r"""
import socket, sys, time
path, idle, half = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(idle):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        break
    socks.append(s)
big = b'{"op": "submit", "args": {"spec": "' + b"x" * (8 * 1024 * 1024 - 100)
for _ in range(half):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(path)
        s.send(big)
    except OSError:
        pass
    socks.append(s)
print(len(socks), flush=True)
time.sleep(float(sys.argv[4]))
"""


def test_idle_and_half_sent_connections_are_bounded(broker_daemon, slurm_cluster):
    d = broker_daemon
    threads0, rss0 = daemon_threads(d), daemon_rss_mb(d)
    p = subprocess.Popen([sys.executable, "-c", FLOOD, d.socket, "900", "40", "15"], stdout=subprocess.PIPE,
                         text=True, env=d.env, **user_kwargs("alice"))
    try:
        assert p.stdout is not None
        opened = int(p.stdout.readline())
        assert opened >= 100
        time.sleep(1)
        with StatusProbe(d) as probe:
            time.sleep(4)
            threads, rss = daemon_threads(d), daemon_rss_mb(d)
        probe.check()
        assert threads - threads0 < 40, f"{threads - threads0} more threads for one user's idle connections"
        assert rss - rss0 < 100, f"RSS grew {rss - rss0:.0f} MB from half-sent requests"
    finally:
        p.kill()
        p.wait()


# -- 10. a job Slurm holds after its own launch failure is released ---------------------------
def test_a_job_slurm_held_after_its_own_launch_failure_is_released(broker_daemon, slurm_cluster):
    d = broker_daemon
    work = user_dir(public_dir("gbroker-f10-"), "alice")
    power_down_idle(slurm_cluster, "spot")  # the job waits for a node to boot
    try:
        job = submit(d, "--group", "vision", "--time", "10m", "--partition", "spot", "--", "sleep", "5", cwd=work)
        booting = d.wait_job(job["id"], lambda j: bool(j["attempts"][-1]["nodes"]), timeout=120, interval=0.2)
        # The job's start on the booting node fails, as on a node broken at boot or a launch the
        # controller lost: Slurm requeues the job *held* ("launch failed requeued held") and
        # drains the node. Nobody asked for that hold.
        fail_launch(slurm_cluster, booting["attempts"][-1]["nodes"])
        with StatusProbe(d, user="carol") as probe:
            done = d.wait_job(job["id"], lambda j: j["state"] in ("completed", "failed", "cancelled"), timeout=300)
        probe.check()
        events = "\n".join(f"{e['at']} {e['kind']}: {e['message']}" for e in done["events"])
        assert done["state"] == "completed", events
        assert "launch failed requeued held" in events and "released" in [e["kind"] for e in done["events"]], events
        assert [a["state"] for a in done["attempts"]] == ["lost", "completed"], done["attempts"]
        assert done["reclaims"] == 0 and done["failures"] == 0
        rows = slurm_cluster.sacct_attempts(str(done["attempts"][0]["slurm_job_id"]), "JobID,State")
        assert [r["State"] for r in rows] == ["REQUEUED", "COMPLETED"], rows
    finally:
        clear_launch_failures(slurm_cluster)


# -- 11. a client that lost its answer retries and gets the same job ------------------------
def test_a_lost_answer_is_retried_and_never_makes_a_second_job(broker_daemon, slurm_cluster):
    d = broker_daemon
    work = user_dir(public_dir("gbroker-retry-"), "alice")
    d.stop()
    # It dies with the intent stored and before sbatch: the restarted daemon submits it,
    # and the client's retry must find that job (the crash after sbatch is test_broker_core's).
    d.start(GBROKER_CRASH_AT="after_intent")
    cli = d.cli_background("submit", "--json", "--group", "vision", "--time", "5m", "--partition", "ondemand",
                           "--", "sleep", "1", cwd=work)
    assert d.proc is not None
    d.proc.wait(60)  # it died before answering
    d.proc = None
    time.sleep(1)
    d.start()
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 0, f"the client gave up: {err}"
    job = json.loads(out)
    jobs = ok(d.cli("history", "--json", cwd=work)).json()
    assert [j["id"] for j in jobs] == [job["id"]], jobs
    # The restarted daemon queues the stored intent on its first ticks: wait for it (at most 60 s),
    # then Slurm must hold exactly one job of that key.
    deadline = time.monotonic() + 60
    while True:
        names = slurm_cluster.run(["squeue", "-h", "-u", "alice", "-o", "%j"]).stdout.split()
        sacct = slurm_cluster.run(["sacct", "-n", "-X", "-u", "alice", "-S", "now-10minutes", "-o", "JobName%40"],
                                  check=False).stdout.split()
        ours = [n for n in names + sacct if n.startswith(job["key"])]
        if ours or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(set(ours)) == 1, (names, sacct)


# -- 12. small things: bad numbers, nesting, sizes, unreadable files ----------------------------
def test_malformed_requests_get_clear_answers(broker_daemon, slurm_cluster):
    d = broker_daemon
    with StatusProbe(d) as probe:
        for name, args, fragment in [
            ("show", {"job_id": 2**70}, "no job"),
            ("show", {"job_id": -1}, "no job"),
            ("list", {"limit": "abc"}, "limit"),
            ("list", {"limit": 10**30}, "limit"),
            ("list", {"bogus": 1}, "bogus"),
            ("cancel", {"job_ids": "1,2"}, "job_ids"),
        ]:
            out = op(d, "alice", name, **args)
            assert out["json"] is not None, out
            err = out["json"]["error"]
            assert "internal error" not in err["message"], (name, args, err)
            assert fragment in err["message"].lower(), (name, args, err)
        nested = raw_request(d, "alice", b'{"op": "list", "args": ' + b"[" * 200_000 + b"]" * 200_000 + b"}\n")
        assert nested["json"] is not None and "malformed" in nested["json"]["error"]["message"], nested
        big = raw_request(d, "alice", b'{"op": "list", "args": {"x": "' + b"y" * (9 * 1024 * 1024) + b'"}}\n')
        assert "send_error" not in big, big
        assert big["json"] is not None and "too large" in big["json"]["error"]["message"], big
    probe.check()
    work = user_dir(public_dir("gbroker-small-"), "alice")
    deep = work / "deep.toml"
    deep.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    r = d.cli("submit", str(deep), cwd=work)
    assert r.code != 0 and "Traceback" not in r.err and "deep.toml" in r.err, r.err
    r = d.cli("submit", "--group", "vision", "--time", "5m", "--script", "/etc/shadow", cwd=work)
    assert r.code != 0 and "cannot read" in r.err and "/etc/shadow" in r.err and "Usage" not in r.err, r.err
    t = time.monotonic()
    r = d.cli("node", "resume", "n[1-2000000]", user="root", cwd=work)
    assert r.code != 0 and "too many" in r.err, r.err
    assert time.monotonic() - t < 5
