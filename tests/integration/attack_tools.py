"""What an attacker on the dev cluster has: a Unix account, the CLI, the socket, Python.

Helpers to act as an unprivileged user (alice, bob, carol) against a real
daemon: run a command or a Python snippet as the user, talk to the socket
directly, and time another user's `gbroker status` while an attack runs.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from broker_fixtures import BrokerDaemon

STATUS_LIMIT_S = 1.0
"""The daemon answers another user's status request within this during every attack
(a request stuck behind one of them would wait for its timeout, 2 s or more)."""

RAW_CLIENT = r"""
import json, socket, sys, time
path, timeout = sys.argv[1], float(sys.argv[2])
data = sys.stdin.buffer.read()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(timeout)
t = time.monotonic()
s.connect(path)
out = {}
try:
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
except OSError as e:
    out["send_error"] = f"{type(e).__name__}: {e}"
buf = b""
try:
    while True:
        c = s.recv(65536)
        if not c:
            break
        buf += c
except OSError as e:
    out["recv_error"] = f"{type(e).__name__}: {e}"
out["answer"] = buf.decode(errors="replace")
out["seconds"] = time.monotonic() - t
print(json.dumps(out))
"""


def user_kwargs(user: str) -> dict[str, Any]:
    pw = pwd.getpwnam(user)
    return {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}


def user_env(d: BrokerDaemon, user: str) -> dict[str, str]:
    pw = pwd.getpwnam(user)
    return dict(d.env, HOME=pw.pw_dir, USER=user, LOGNAME=user)


def run_as(d: BrokerDaemon, user: str, argv: list[str], *, input: bytes | None = None,
           timeout: float = 120, cwd: str = "/tmp") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(argv, input=input, capture_output=True, timeout=timeout, cwd=cwd,
                          env=user_env(d, user), **user_kwargs(user))


def raw_request(d: BrokerDaemon, user: str, payload: bytes, timeout: float = 60) -> dict[str, Any]:
    """Send bytes straight to the daemon's socket as `user`; what came back, and how fast."""
    p = run_as(d, user, [sys.executable, "-c", RAW_CLIENT, d.socket, str(timeout)], input=payload,
               timeout=timeout + 30)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    out = json.loads(p.stdout)
    try:
        out["json"] = json.loads(out["answer"]) if out["answer"].strip() else None
    except ValueError:
        out["json"] = None
    return out


def op(d: BrokerDaemon, user: str, name: str, **args: Any) -> dict[str, Any]:
    """One well-formed request to the socket, as `user` (bypassing the CLI's own checks)."""
    return raw_request(d, user, (json.dumps({"op": name, "args": args}) + "\n").encode())


def timed_status(d: BrokerDaemon, user: str = "bob") -> float:
    """Seconds `gbroker status` took for `user`; fails if it did not answer cleanly."""
    t = time.monotonic()
    r = d.cli("status", user=user, timeout=30)
    took = time.monotonic() - t
    assert r.code == 0, f"{user}'s status failed during the attack: {r.err}"
    return took


PROBE_LOOP = r"""
import json, select, socket, sys, time
path = sys.argv[1]
request = (json.dumps({"op": "list", "args": {"active": True}}) + "\n").encode()
while not select.select([sys.stdin], [], [], 0.3)[0]:
    t = time.monotonic()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(30)
        s.connect(path)
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := s.recv(65536):
            buf += chunk
        s.close()
        answer = json.loads(buf)
        out = {"seconds": time.monotonic() - t} if answer.get("ok") else {"error": str(answer)[:300]}
    except (OSError, ValueError) as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(out), flush=True)
"""


@dataclass
class StatusProbe:
    """Times another user's status requests again and again while an attack runs.

    The time that matters is the daemon's: a long-lived process of the user's
    sends the same request as `gbroker status` and times its answer, so a
    busy machine's process start-up (which the attack does not cause) is not
    counted; a daemon stuck behind the attack is.
    """

    d: BrokerDaemon
    user: str = "bob"
    times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _proc: subprocess.Popen[str] | None = None
    _thread: threading.Thread | None = None
    _before: int = 0

    def __enter__(self) -> StatusProbe:
        assert self.d.cli("status", user=self.user, timeout=30).code == 0  # the CLI itself answers
        self._proc = subprocess.Popen(
            [sys.executable, "-c", PROBE_LOOP, self.d.socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, cwd="/tmp", env=user_env(self.d, self.user), **user_kwargs(self.user))

        def read() -> None:
            assert self._proc is not None and self._proc.stdout is not None
            for line in self._proc.stdout:
                out = json.loads(line)
                if "seconds" in out:
                    self.times.append(out["seconds"])
                else:
                    self.errors.append(out["error"])

        self._thread = threading.Thread(target=read, daemon=True)
        self._thread.start()
        # The probe answers once before the attack starts (a fast attack could otherwise be over
        # before the probe's first request), and once more after it (see __exit__).
        self._wait_for_answers(1)
        self._before = len(self.times) + len(self.errors)
        return self

    def _wait_for_answers(self, n: int, timeout_s: float = 30.0) -> None:
        end = time.monotonic() + timeout_s
        while len(self.times) + len(self.errors) < n and time.monotonic() < end:
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None and self._proc.stdin is not None and self._thread is not None
        self._wait_for_answers(self._before + 1)
        self._proc.stdin.close()
        self._proc.wait(60)
        self._thread.join(60)

    def check(self) -> None:
        assert not self.errors, f"{self.user}'s status failed during the attack: {self.errors[:3]}"
        assert self.times, f"{self.user}'s status was never answered during the attack"
        worst = max(self.times)
        assert worst < STATUS_LIMIT_S, (
            f"{self.user}'s status took {worst:.2f}s in the daemon during the attack (limit {STATUS_LIMIT_S}s); "
            f"all: {[round(t, 2) for t in self.times]}"
        )


def daemon_threads(d: BrokerDaemon) -> int:
    assert d.proc is not None
    with open(f"/proc/{d.proc.pid}/status") as fh:
        for line in fh:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("no thread count")


def daemon_rss_mb(d: BrokerDaemon) -> float:
    assert d.proc is not None
    with open(f"/proc/{d.proc.pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RSS")


def mode_of(path: str) -> int:
    return os.stat(path).st_mode & 0o777
