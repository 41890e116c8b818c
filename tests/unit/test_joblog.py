"""Job log names: made as the caller with O_EXCL and mode 0600; the daemon takes only such names."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from broker import joblog
from broker.client import NAME_CHARS, _own_log
from broker.errors import SpecError
from broker.spec import NAME_RE


def test_a_made_log_is_new_private_and_named_as_the_daemon_checks(tmp_path: Path) -> None:
    paths = {joblog.create_own(str(tmp_path), "train") for _ in range(50)}
    assert len(paths) == 50
    for p in paths:
        st = os.lstat(p)
        assert stat.S_ISREG(st.st_mode) and st.st_mode & 0o777 == 0o600 and st.st_size == 0
        assert joblog.is_log_name(p, str(tmp_path), "train")
        assert joblog.is_log_name(p, str(tmp_path) + "/", "train")  # a workdir written with its slash
        assert not joblog.is_log_name(p, str(tmp_path), "other")
        assert not joblog.is_log_name(p, "/elsewhere", "train")


@pytest.mark.parametrize("path", [
    "{d}/gbroker-train-abcdef.txt",        # another suffix
    "{d}/gbroker-train-abcde.out",         # too short
    "{d}/gbroker-train-abc/ef.out",        # a directory in the random part
    "{d}/gbroker-train-../../x.out",       # out of the workdir
    "{d}/sub/gbroker-train-abcdef.out",    # below the workdir
    "{d}/gbroker-train-abcde\n.out",       # a newline
    "{d}/gbroker-train-abc%jf.out",        # a Slurm pattern
    "/etc/passwd",
])
def test_names_the_daemon_refuses(tmp_path: Path, path: str) -> None:
    assert not joblog.is_log_name(path.format(d=tmp_path), str(tmp_path), "train")


def test_a_planted_file_or_symlink_is_never_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    draws = iter([b"\x00" * 6, b"\x00" * 6, b"\x01" * 6])  # the first two names are taken
    monkeypatch.setattr(os, "urandom", lambda n: next(draws))
    taken = joblog.prefix(str(tmp_path), "t") + "aaaaaa" + joblog.SUFFIX
    os.symlink(victim, taken)
    path = joblog.create_own(str(tmp_path), "t")
    assert path == joblog.prefix(str(tmp_path), "t") + "bbbbbb" + joblog.SUFFIX
    assert victim.read_text() == "keep\n" and os.path.islink(taken)


def test_the_client_says_when_it_cannot_make_the_log_and_leaves_odd_specs_to_the_daemon(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot create the job's log"):
        _own_log({"name": "t", "workdir": str(tmp_path / "missing")})
    assert _own_log({"name": "a name", "workdir": str(tmp_path)}) is None
    assert _own_log({"workdir": str(tmp_path)}) is None
    assert _own_log({"name": "t", "workdir": "relative"}) is None
    assert _own_log({"name": "-t", "workdir": str(tmp_path)}) is None


def test_the_clients_name_letters_are_the_specs() -> None:
    letters = [chr(c) for c in range(32, 127)]
    assert {c for c in letters if NAME_RE.fullmatch(c)} == set(NAME_CHARS)


def test_the_daemon_takes_a_clients_log_and_refuses_one_made_for_another_job(tmp_path: Path) -> None:
    from broker.clock import FakeClock
    from broker.jobs.submit import submit
    from ledger_fakes import START, FakeSlurm, caller, job_spec, make_services

    clock = FakeClock(START)
    svc = make_services(f"sqlite:///{tmp_path}/db.sqlite", clock, FakeSlurm(clock))
    spec = job_spec(name="t")  # workdir /tmp
    with pytest.raises(SpecError, match="not a log made for job t"):
        submit(svc, caller(), dict(spec), log="/tmp/gbroker-other-abcdef.out")
    with svc.read() as s:
        from sqlalchemy import func, select

        from broker.db.models import Job
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 0
    answer = submit(svc, caller(), dict(spec), log="/tmp/gbroker-t-abcdef.out")
    assert answer["log"] == "/tmp/gbroker-t-abcdef.out" and svc.files.logs == []  # none made by the daemon
    answer = submit(svc, caller(), dict(spec))
    assert answer["log"] == svc.files.logs[0]
