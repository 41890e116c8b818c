"""alice against root's `gbroker logs` and against the notifications, on the real dev cluster.

An admin (root) reads alice's job log with the real CLI after alice has put
something else in its place (a symlink to /etc/shadow, a FIFO, a symlink to
/dev/zero, a hard link to a file of root's) or made her job print terminal
escape sequences: nothing secret is printed, nothing hangs, the escapes show
escaped (raw with --raw). alice renames her own Slurm job to a Slack
broadcast and a disguised link; the failure notice reaches a real HTTP
receiver on loopback with both shown as text.
"""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from attack_tools import run_as
from broker_fixtures import (  # noqa: F401  (fixture)
    BrokerDaemon,
    CliResult,
    broker_daemon,
    daemon_with_config,
    public_dir,
    user_dir,
)

pytestmark = pytest.mark.slurm

ESCAPES = "\033]0;PWNED-TITLE\007\033[2J"
SECRET = "root-only-secret-7f3a"
LOGS_LIMIT_S = 20.0
"""A refused read answers within this (a hang would be killed at the CLI timeout, far later)."""


def ok(r: CliResult) -> CliResult:
    assert r.code == 0, f"exit {r.code}\nstdout: {r.out}\nstderr: {r.err}"
    return r


def logs_as_root(d: BrokerDaemon, *args: str) -> tuple[CliResult, float]:
    t = time.monotonic()
    r = d.cli("logs", *args, user="root", timeout=60)
    return r, time.monotonic() - t


def replace_log(d: BrokerDaemon, path: str, *argv: str) -> None:
    """alice removes her job's log and puts ``argv``'s result in its place (as alice)."""
    p = run_as(d, "alice", ["/bin/rm", "-f", "--", path])
    assert p.returncode == 0, p.stderr
    p = run_as(d, "alice", list(argv))
    assert p.returncode == 0, p.stderr


def refused(d: BrokerDaemon, job_id: int, what: str, secret: str = SECRET) -> None:
    """root's `gbroker logs` and `logs -f` refuse the log, quickly, printing nothing of it."""
    for args in ((str(job_id),), (str(job_id), "-f", "--interval", "0.2")):
        r, took = logs_as_root(d, *args)
        assert r.code != 0, f"root's logs {args} printed {r.out[:300]!r}"
        assert what in r.err, r.err
        assert r.out == "" and secret not in r.err, (r.out[:300], r.err)
        assert took < LOGS_LIMIT_S, f"root's logs {args} took {took:.1f}s"


def test_root_reads_alices_log_as_alice_and_never_what_she_put_in_its_place(broker_daemon, slurm_cluster):
    d = broker_daemon
    work = user_dir(public_dir("gbroker-logs-"), "alice")
    r = ok(d.cli("submit", "--json", "--group", "vision", "--time", "5m", "--partition", "ondemand", "--",
                 "/usr/bin/printf", "before\\033]0;PWNED-TITLE\\007\\033[2Jafter\\n", cwd=work))
    job_id = r.json()["id"]
    done = d.wait_job(job_id, lambda j: j["state"] in ("completed", "failed"), timeout=240)
    assert done["state"] == "completed", done
    path = done["log"]

    # The job printed escape sequences: root's terminal gets them as text; --raw gives the bytes.
    out = ok(logs_as_root(d, str(job_id))[0]).out
    assert "before\\x1b]0;PWNED-TITLE\\x07\\x1b[2Jafter" in out and "\033" not in out and "\007" not in out
    assert "\\x1b[2J" in ok(logs_as_root(d, str(job_id), "-f")[0]).out
    assert f"before{ESCAPES}after" in ok(logs_as_root(d, str(job_id), "--raw")[0]).out
    # alice's own logs: the same, and fast.
    t = time.monotonic()
    mine = ok(d.cli("logs", str(job_id), cwd=work)).out
    mine_took = time.monotonic() - t
    assert "\\x1b]0;PWNED-TITLE" in mine and "\033" not in mine
    assert mine_took < 5, f"alice's own logs took {mine_took:.1f}s"

    # A symlink to /etc/shadow (root could read it; alice cannot).
    with open("/etc/shadow") as fh:
        shadow_line = fh.readline().strip()
    replace_log(d, path, "/bin/ln", "-s", "/etc/shadow", path)
    refused(d, job_id, "symbolic link", secret=shadow_line)

    # A FIFO: the old command waited for a writer forever.
    replace_log(d, path, "/usr/bin/mkfifo", "-m", "600", path)
    refused(d, job_id, "is a FIFO")

    # A symlink to /dev/zero: the old command read without end.
    replace_log(d, path, "/bin/ln", "-s", "/dev/zero", path)
    refused(d, job_id, "symbolic link")

    # A hard link to a file of root's that alice cannot read. The kernel does not let alice make
    # it here (fs.protected_hardlinks); with that off she could, so root makes it as she would.
    secret = Path(work) / "root-secret"
    secret.write_text(SECRET + "\n")
    os.chmod(secret, 0o600)
    run_as(d, "alice", ["/bin/rm", "-f", "--", path])
    tried = run_as(d, "alice", ["/bin/ln", "--", str(secret), path])
    if tried.returncode != 0:
        os.link(secret, path)
    refused(d, job_id, "Permission denied")  # opened as alice

    # A regular file of someone else's (root's own, readable): not the job's log.
    os.unlink(path)
    Path(path).write_text(SECRET + "\n")
    os.chmod(path, 0o644)
    refused(d, job_id, "not to the job's owner alice")

    # Back to a log of alice's: a long one is cut where asked, saying how to see the rest.
    os.unlink(path)
    replace_log(d, path, "/usr/bin/touch", "--", path)
    Path(path).write_text("".join(f"{i}\n" for i in range(1, 2001)))  # still alice's file
    r, _ = logs_as_root(d, str(job_id), "--max-bytes", "1000")
    assert r.code == 0, r.err
    assert len(r.out) <= 1001 and r.out.startswith("1\n2\n")
    assert "stopped after 1,000 bytes" in r.err and "--max-bytes 0" in r.err, r.err
    assert ok(logs_as_root(d, str(job_id), "--max-bytes", "0")[0]).out.endswith("1999\n2000\n")
    secret.unlink()


# -- a job name in a notification ------------------------------------------------------------
HOSTILE_NAME = "gb-x <!channel> <https://evil.example/login|gbroker: sign in again>"


class Receiver:
    """A webhook receiver on loopback that keeps every body it is sent."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        got = self.got

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.srv = http.server.HTTPServer(("127.0.0.1", 0), H)
        self.port = int(self.srv.server_address[1])
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def notify_config(port: int) -> str:
    return f"""
[notify]
tick_seconds = 0.5
backoff_seconds = 0.5
backoff_max_seconds = 2
timeout_seconds = 2

[notify.targets.chat]
kind = "webhook"
url = "http://127.0.0.1:{port}/hook"

[[notify.subscriptions]]
target = "chat"
events = ["job.failed"]
users = ["alice"]
"""


def wait_until(what: str, fn: Any, timeout: float, d: BrokerDaemon) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout}s\n{d.log_tail()}")


def test_a_slurm_job_name_reaches_the_chat_webhook_as_text_not_markup(slurm_cluster):
    hook = Receiver()
    try:
        with daemon_with_config(slurm_cluster, notify_config(hook.port)) as d:
            work = user_dir(public_dir("gbroker-notify-"), "alice")
            job = ok(d.cli("submit", "--json", "--group", "vision", "--time", "5m", "--partition", "ondemand",
                           "--", "sleep", "300", cwd=work)).json()
            running = d.wait_job(job["id"], lambda j: j["state"] == "running" and j["slurm_job_id"], timeout=240)
            sid = str(running["slurm_job_id"])
            # alice renames her own Slurm job: gbroker no longer sees it as its job and fails it,
            # with a reason that quotes the name.
            slurm_cluster.as_user("alice", ["scontrol", "update", f"JobId={sid}", f"Name={HOSTILE_NAME}",
                                            "Comment=mine-now"])
            try:
                failed = d.wait_job(job["id"], lambda j: j["state"] == "failed", timeout=120)
                assert "<!channel>" in failed["reason"], failed["reason"]  # the name, quoted
                got = wait_until("the failure notice", lambda: [g for g in hook.got if g["event"] == "job.failed"],
                                 60, d)
            finally:
                slurm_cluster.run(["scancel", sid], check=False)
        text = got[0]["text"]
        assert "<!channel>" not in text and "<https://" not in text and "|gbroker: sign in again>" not in text, text
        assert "&lt;!channel&gt;" in text and "&lt;https://evil.example/login|gbroker: sign in again&gt;" in text
        assert "<!channel>" in got[0]["message"]  # the payload's own fields stay as they are, for programs
    finally:
        hook.close()

