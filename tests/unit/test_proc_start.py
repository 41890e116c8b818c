"""proc.start: a child that starts now and gets its input later; children as a user through setpriv."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from broker import proc

ENV = {"PATH": proc.SAFE_PATH}


def test_a_started_child_waits_for_its_input() -> None:
    started = proc.start(["cat"], env=ENV, timeout_s=5)
    time.sleep(0.05)
    assert started.proc.poll() is None  # still waiting for stdin
    r = started.finish(b"the script\n")
    assert (r.returncode, r.out) == (0, "the script\n")
    started.abort()  # after finish: nothing
    with pytest.raises(RuntimeError):
        started.finish(b"again")


def test_an_aborted_child_gets_no_input_and_is_reaped(tmp_path: Path) -> None:
    out = tmp_path / "got"
    started = proc.start(["sh", "-c", f"cat > {out}.tmp && mv {out}.tmp {out}"], env=ENV, timeout_s=5)
    started.abort()
    assert started.proc.returncode is not None and started.proc.returncode < 0  # killed, and waited for
    assert not out.exists()


def test_the_deadline_counts_from_finish() -> None:
    started = proc.start(["cat"], env=ENV, timeout_s=0.5)
    time.sleep(0.7)  # longer than the timeout, before the input
    r = started.finish(b"x")
    assert not r.timed_out and r.out == "x"


def test_a_child_as_a_user_has_every_id_of_the_user_and_no_capability() -> None:
    alice = proc.identity("alice")
    r = proc.run(["grep", "-E", "^(Uid|Gid|CapPrm|CapEff|CapAmb):", "/proc/self/status"], env=ENV,
                 timeout_s=5, user=alice)
    lines = dict(line.split(":", 1) for line in r.out.splitlines())
    assert lines["Uid"].split() == [str(alice.uid)] * 4 and lines["Gid"].split() == [str(alice.gid)] * 4
    assert {lines[c].strip() for c in ("CapPrm", "CapEff", "CapAmb")} == {"0000000000000000"}
    assert r.argv[0] == "grep"  # the identity switch is not part of what the caller ran


def test_a_missing_program_as_a_user_is_not_runnable() -> None:
    with pytest.raises(proc.CommandNotRunnable) as err:
        proc.run(["/nonexistent/prog"], env=ENV, timeout_s=5, user=proc.identity("alice"))
    assert "not found" in err.value.message and not err.value.denied
