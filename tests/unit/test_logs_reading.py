"""Reading a job's log (broker.joblog.open_log) and showing it (gbroker logs), on real files.

This process runs as root, as an admin's `gbroker logs` does; alice's files
are made as alice, so the child that opens them as alice meets the kernel's
real checks. The daemon's answers are a stand-in (tests/unit/test_arrays_cli.py
does the same); tests/integration/test_attacks_logs.py is the attack on the
real daemon and cluster.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from broker import joblog
from broker.cli import main as cli_main

ALICE = pwd.getpwnam("alice")


@pytest.fixture
def alices_dir() -> Iterator[Path]:
    """A directory of alice's that she can reach (pytest's tmp dirs are private to root)."""
    base = Path(tempfile.mkdtemp(prefix="gbroker-logs-", dir="/tmp"))
    os.chmod(base, 0o755)
    work = base / "alice"
    work.mkdir(mode=0o755)
    os.chown(work, ALICE.pw_uid, ALICE.pw_gid)
    yield work
    shutil.rmtree(base, ignore_errors=True)


def as_alice(*argv: str) -> None:
    subprocess.run(list(argv), check=True, user=ALICE.pw_uid, group=ALICE.pw_gid, extra_groups=[], cwd="/")


def test_root_opens_alices_log_as_alice_and_refuses_what_is_not_her_file(alices_dir: Path) -> None:
    log = alices_dir / "gbroker-t-Ab12Cd.out"
    as_alice("/bin/sh", "-c", 'umask 077; echo hers > "$0"', str(log))
    fd = joblog.open_log(str(log), "alice")
    assert fd is not None
    try:
        assert os.read(fd, 100) == b"hers\n"
    finally:
        os.close(fd)
    assert joblog.open_log(str(alices_dir / "missing.out"), "alice") is None

    cases = [(("/bin/ln", "-s", "/etc/shadow"), "symbolic link"), (("/usr/bin/mkfifo",), "is a FIFO"),
             (("/bin/ln", "-s", "/dev/zero"), "symbolic link"), (("/bin/mkdir",), "is a directory")]
    for i, (argv, why) in enumerate(cases):
        path = str(alices_dir / f"case-{i}.out")
        as_alice(*argv, path)
        t = time.monotonic()
        with pytest.raises(joblog.Unreadable, match=why):
            joblog.open_log(path, "alice")
        assert time.monotonic() - t < 5
    secret = alices_dir / "root-secret"
    secret.write_text("root's\n")
    os.chmod(secret, 0o600)
    with pytest.raises(joblog.Unreadable, match="Permission denied"):  # root may, alice may not
        joblog.open_log(str(secret), "alice")
    os.chmod(secret, 0o644)
    with pytest.raises(joblog.Unreadable, match="not to the job's owner alice"):  # readable, not hers
        joblog.open_log(str(secret), "alice")
    with pytest.raises(joblog.Unreadable, match="not a user"):
        joblog.open_log(str(log), "no-such-user-here")


def test_shown_escapes_controls_and_bytes_that_are_not_utf8() -> None:
    raw = "ok\tü\n\x1b]0;T\x07\x1b[2J\r\x00\x7f\x9b".encode() + b"\xff"
    assert joblog.shown(raw.decode("utf-8", "surrogateescape")) == \
        "ok\tü\n\\x1b]0;T\\x07\\x1b[2J\\x0d\\x00\\x7f\\u009b\\xff"
    assert joblog.shown("plain text\n") == "plain text\n"
    # Text that reads one way and is another ("Trojan Source"): the bidi controls show escaped.
    trojan = "rm -rf \u202e/ pmt/\u202c ok \u2066x\u2069 \u200f"
    assert joblog.shown(trojan) == "rm -rf \\u202e/ pmt/\\u202c ok \\u2066x\\u2069 \\u200f"
    assert joblog.shown("שלום, 日本語, é\n") == "שלום, 日本語, é\n"  # right-to-left letters themselves stay


def _job(log: str) -> dict[str, Any]:
    me = pwd.getpwuid(os.getuid())
    return {"id": 5, "name": "t", "kind": "other", "owner": me.pw_name, "owner_uid": me.pw_uid,
            "group": "vision", "state": "completed", "reason": "", "capacity": "spot", "partition": "spot",
            "policy": "simple", "reclaims": 0, "failures": 0, "attempts": [], "slurm_job_id": None,
            "deadline": None, "created_at": None, "finished_at": None, "age_s": 5, "log": log, "events": []}


def _logs(monkeypatch: pytest.MonkeyPatch, log: Path, *args: str) -> Any:
    import broker.cli.jobs  # noqa: F401  (registers the job commands)
    from broker.cli.main import cli

    monkeypatch.setattr(cli_main.Context, "call", lambda self, op, **kw: _job(str(log)))
    return CliRunner().invoke(cli, ["--socket", "/nonexistent.sock", "logs", "5", *args])


def test_logs_escapes_unless_raw_and_cuts_where_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = tmp_path / "j.out"
    log.write_bytes(b"a\x1b]0;TITLE\x07\x1b[2Jb\nno end")
    r = _logs(monkeypatch, log)
    assert r.exit_code == 0 and r.stdout == "a\\x1b]0;TITLE\\x07\\x1b[2Jb\nno end\n"
    assert _logs(monkeypatch, log, "--raw").stdout_bytes == b"a\x1b]0;TITLE\x07\x1b[2Jb\nno end\n"
    log.write_text("".join(f"{i}\n" for i in range(1000)))
    cut = _logs(monkeypatch, log, "--max-bytes", "20")
    assert cut.exit_code == 0 and cut.stdout.startswith("0\n1\n2\n") and len(cut.stdout) <= 21
    assert "stopped after 20 bytes" in cut.stderr and "3,890 bytes now" in cut.stderr
    assert "--max-bytes 0" in cut.stderr
    assert _logs(monkeypatch, log, "--max-bytes", "0").stdout.endswith("998\n999\n")
    # A line longer than a read is printed in pieces, whole.
    log.write_bytes(b"x" * (3 * 1024 * 1024 + 5) + b"\n")
    assert _logs(monkeypatch, log, "--max-bytes", "0").stdout == "x" * (3 * 1024 * 1024 + 5) + "\n"
