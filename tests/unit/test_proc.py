"""The one process door: deadlines kill the whole session, output is bounded, users are users."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest

from broker import proc

ENV = {"PATH": proc.SAFE_PATH}


def test_output_and_exit_code() -> None:
    r = proc.run(["sh", "-c", "echo out; echo err >&2; exit 3"], env=ENV, timeout_s=5)
    assert (r.out, r.err, r.returncode, r.timed_out) == ("out\n", "err\n", 3, False)


def test_the_environment_is_exactly_what_the_caller_gives() -> None:
    r = proc.run(["sh", "-c", "env | grep -c ."], env={"PATH": proc.SAFE_PATH, "ONLY": "1"}, timeout_s=5)
    assert int(r.out) <= 4  # PATH, ONLY, and what sh itself sets (PWD, SHLVL)


def test_large_input_and_output_do_not_deadlock() -> None:
    r = proc.run(["cat"], env=ENV, timeout_s=10, input=b"x" * 3_000_000)
    assert len(r.stdout) == 3_000_000 and r.returncode == 0


def test_a_deadline_kills_the_child_and_what_it_started() -> None:
    marker = Path(tempfile.mkdtemp()) / "survived"
    t = time.monotonic()
    r = proc.run(["sh", "-c", f"(sleep 2; touch {marker}) & sleep 30"], env=ENV, timeout_s=0.5)
    assert r.timed_out and time.monotonic() - t < 3
    time.sleep(2.5)
    assert not marker.exists(), "a grandchild outlived the deadline"


def test_a_child_that_closes_its_output_but_runs_on_is_killed_at_its_deadline() -> None:
    t = time.monotonic()
    r = proc.run(["sh", "-c", "exec >&- 2>&-; sleep 30"], env=ENV, timeout_s=0.5)
    assert r.timed_out and time.monotonic() - t < 3


def test_a_child_sigkill_cannot_end_is_left_to_a_reaper(monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    # A process in uninterruptible sleep (a find on a hung NFS mount) outlives SIGKILL; here the
    # signal is simply not sent. The caller still gets its answer, REAP_WAIT_S past the deadline.
    monkeypatch.setattr(proc, "_kill_session", lambda p: None)
    monkeypatch.setattr(proc, "REAP_WAIT_S", 0.3)
    t = time.monotonic()
    try:
        r = proc.run(["sleep", "30.25"], env=ENV, timeout_s=0.3)
        assert r.timed_out and time.monotonic() - t < 2
        assert "left to a reaper thread" in caplog.text
    finally:
        os.system("pkill -x -f 'sleep 30.25'")


def test_output_past_the_cap_stops_the_child() -> None:
    t = time.monotonic()
    r = proc.run(["yes"], env=ENV, timeout_s=30, max_output=10_000)
    assert r.truncated and len(r.stdout) == 10_000 and time.monotonic() - t < 5


def test_a_missing_program_is_a_clear_error() -> None:
    with pytest.raises(proc.CommandNotRunnable) as err:
        proc.run(["/nonexistent/prog"], env=ENV, timeout_s=5)
    assert "not found" in err.value.message and not err.value.missing_cwd


def test_as_a_user_the_directory_is_entered_as_that_user() -> None:
    assert os.geteuid() == 0, "run the tests as root, as contrib/dev/test does"
    secret = Path(tempfile.mkdtemp())  # 0700, root's
    alice = proc.identity("alice")
    with pytest.raises(proc.CommandNotRunnable) as err:
        proc.run(["pwd"], env=ENV, timeout_s=5, user=alice, cwd=str(secret))
    assert err.value.missing_cwd and "Permission denied" in err.value.message
    r = proc.run(["sh", "-c", "id -u; pwd; umask"], env=ENV, timeout_s=5, user=alice, cwd="/tmp")
    uid, cwd, umask = r.out.split()
    assert (int(uid), cwd, umask) == (alice.uid, "/tmp", "0022")


def test_unknown_users_are_not_found() -> None:
    from broker.errors import NotFound

    with pytest.raises(NotFound):
        proc.identity("no-such-user-gbroker")
    with pytest.raises(NotFound) as err:
        proc.passwd_entry("no-such-user-gbroker")
    assert err.value.hint and "create the account" in err.value.hint
    assert proc.passwd_entry("alice").pw_uid == proc.identity("alice").uid
