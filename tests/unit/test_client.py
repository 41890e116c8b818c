"""The typed client: the daemon's real answers (real handlers and views, real database, fake Slurm,
a real UNIX socket) read into dataclasses, and malformed answers refused with a clear message."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.api import ApiServer
from broker.client import (
    ENDED, Attempt, Cancelled, Client, Event, Job, RemoteError, Report, SubmitResult, attempt_lines, attempt_of,
    new_key,
)
from broker.errors import DaemonUnavailable, SpecError
from broker.states import TERMINAL
from ledger_fakes import ROOT, World, job_spec, setup_lab


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[World, Client]]:
    from broker.jobs.handlers import handlers as job_handlers
    from broker.money.handlers import handlers as money_handlers

    world = World(f"sqlite:///{tmp_path / 'gb.db'}")
    setup_lab(world.svc)
    world.ops()["group_members"](ROOT, {"name": "vision", "add": ["root"], "remove": []})
    sock_dir = Path(tempfile.mkdtemp(prefix="gb-client-"))
    server = ApiServer(str(sock_dir / "s.sock"), {**job_handlers(world.svc), **money_handlers(world.svc)},
                       admin_group="gbroker-test-admins-none")
    server.serve_in_thread()
    try:
        yield world, Client(server.path)
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _spec(workdir: Path, **kw: Any) -> dict[str, Any]:
    """A job spec run in ``workdir`` (the client makes the job's log there, as it would in /tmp)."""
    return {**job_spec(**kw), "workdir": str(workdir)}


def test_an_empty_key_is_refused_not_replaced(daemon: tuple[World, Client], tmp_path: Path) -> None:
    """--key "$KEY" with KEY unset: a fresh key would make a second job on every retry."""
    world, client = daemon
    for empty in ("", "  "):
        with pytest.raises(SpecError, match="the idempotency key is empty"):
            client.submit(_spec(tmp_path, name="train"), key=empty)
    assert client.status() == [] and not list(tmp_path.glob("gbroker-*.out"))


def test_submit_status_show_cancel_through_the_socket(daemon: tuple[World, Client], tmp_path: Path) -> None:
    world, client = daemon
    key = new_key()
    result = client.submit(_spec(tmp_path, name="train"), key=key)
    assert isinstance(result, SubmitResult) and isinstance(result.job, Job)
    assert result.job.name == "train" and result.job.key == key and result.job.group == "vision"
    assert result.slurm_job_id is not None and result.slurm_job_id == result.job.slurm_job_id
    assert result.raw["id"] == result.id  # the daemon's own answer, for --json
    again = client.submit(_spec(tmp_path, name="train"), key=key)
    assert again.id == result.id and again.note and "already submitted" in again.note

    listed = client.status()
    assert [j.id for j in listed] == [result.id]
    assert listed[0].attempt_count == 1 and listed[0].attempts == () and listed[0].state == "pending"

    job = client.show(result.id)
    assert job.attempt_count == 1 and isinstance(job.attempts[0], Attempt)
    assert job.attempts[0].number == 1 and job.attempts[0].slurm_job_id == result.slurm_job_id
    assert job.events and all(isinstance(e, Event) for e in job.events)
    assert "intent" in [e.kind for e in job.events]
    assert job.log and job.log.startswith(f"{tmp_path}/gbroker-train-")
    assert sorted(p.name for p in tmp_path.glob("gbroker-*.out")) == [job.log.rsplit("/", 1)[1]]  # the retry's went
    assert not job.ended

    done = client.cancel(result.id)
    assert [(c.id, c.state) for c in done] == [(result.id, "cancelled")] and isinstance(done[0], Cancelled)
    assert client.show(result.id).ended
    assert client.status() == [] and [j.id for j in client.history()] == [result.id]


def test_a_refusal_keeps_the_daemons_message_and_exit_code(daemon: tuple[World, Client], tmp_path: Path) -> None:
    _, client = daemon
    with pytest.raises(RemoteError) as err:
        client.show(999)
    assert "no job 999" in err.value.message and err.value.exit_code == 3
    with pytest.raises(RemoteError) as err:
        client.submit(_spec(tmp_path, gpus=64))
    assert "at most 8" in err.value.message and err.value.exit_code == 2
    assert not list(tmp_path.glob("gbroker-*.out"))  # refused: the log the client made is gone again


def test_report_rows_are_exact_money(daemon: tuple[World, Client], tmp_path: Path) -> None:
    world, client = daemon
    out = client.submit(_spec(tmp_path))
    world.slurm.start(out.slurm_job_id)
    world.tick()
    world.advance(1800)
    world.slurm.finish(out.slurm_job_id)
    world.tick()
    report = client.report(by="user")
    assert isinstance(report, Report) and report.by == "user" and report.semester == "2026-fall"
    assert [r.key for r in report.rows] == ["root"]
    assert report.total.spend_micros == report.rows[0].spend_micros > 0
    assert isinstance(report.total.spend_micros, int) and report.total.spend == report.raw["total"]["spend"]
    assert report.visible == "all groups" and report.budgets


def test_logs_reads_the_log_as_the_caller(daemon: tuple[World, Client], tmp_path: Path) -> None:
    world, client = daemon
    out = client.submit(_spec(tmp_path))
    path = client.log_path(out.id)
    assert client.logs(out.id) == ""  # not written yet
    Path(path).write_text("=== gbroker: job 1 attempt 1 starts: x\none\n=== gbroker: job 1 attempt 2 starts: y\ntwo\n")
    try:
        assert client.logs(out.id).count("\n") == 4
        assert client.logs(out.id, attempt=2) == "=== gbroker: job 1 attempt 2 starts: y\ntwo\n"
        with pytest.raises(SpecError, match="not an array"):
            client.log_path(out.id, piece=3)
    finally:
        Path(path).unlink()


def test_job_from_a_summary_and_from_a_detail() -> None:
    summary = {"id": 7, "key": "gb-0123456789ab", "name": "n", "kind": "other", "owner": "alice", "owner_uid": 1001,
               "group": "vision", "state": "running", "reason": "", "capacity": "spot", "partition": "spot",
               "policy": "simple", "reclaims": 1, "failures": 0, "attempts": 2, "slurm_job_id": 12,
               "deadline": None, "created_at": "2026-10-01T08:00:00Z", "finished_at": None, "age_s": 60}
    job = Job.from_dict(summary)
    assert (job.id, job.attempt_count, job.slurm_job_id, job.reclaims, job.pieces) == (7, 2, 12, 1, None)
    detail = dict(summary, attempts=[{"number": 1, "state": "reclaimed", "slurm_job_id": 11, "lost_s": 30},
                                     {"number": 2, "state": "running", "slurm_job_id": 12}],
                  events=[{"at": "2026-10-01T08:00:00Z", "kind": "intent", "message": "m"}], log="/home/a/x.out")
    job = Job.from_dict(detail)
    assert job.attempt_count == 2 and job.attempts[0].lost_s == 30 and job.attempts[1].lost_s is None
    assert job.events[0].kind == "intent" and job.log == "/home/a/x.out"
    assert job.raw is detail


@pytest.mark.parametrize("bad", [None, [], {"name": "no id"}, {"id": "7"}, {"id": True}])
def test_a_malformed_job_is_refused(bad: Any) -> None:
    with pytest.raises(DaemonUnavailable, match="malformed"):
        Job.from_dict(bad)


def test_a_piece_log_names_the_pieces_there_are() -> None:
    job = Job.from_dict({"id": 3, "state": "running", "pieces": {"line": "x"},
                         "array": {"by_state": {"done": "1-2"}, "pieces": [{"piece": 1, "log": "/a/1.out"}]}})
    assert job.piece_log(1) == "/a/1.out"
    with pytest.raises(SpecError) as err:
        job.piece_log(9)
    assert "done 1-2" in (err.value.hint or "")


def test_attempt_lines_follow_the_start_lines() -> None:
    assert attempt_of("=== gbroker: job 7 attempt 12 starts: on spot1") == 12
    assert attempt_of("=== gbroker: job 7 attempt x starts") is None and attempt_of("attempt 2 starts") is None
    lines = ["before", "=== gbroker: job 7 attempt 1 starts: a", "a1", "=== gbroker: job 7 attempt 2 starts: b",
             "b1"]
    assert attempt_lines(lines, None, True) == (lines, True)
    assert attempt_lines(lines, 1, False) == (lines[1:3], False)
    assert attempt_lines(lines, 2, False) == (lines[3:], True)
    assert attempt_lines(["more"], 2, True) == (["more"], True)  # still inside attempt 2


def test_ended_is_the_terminal_states() -> None:
    assert ENDED == {s.value for s in TERMINAL}


def test_the_cli_goes_through_the_client_and_prints_the_daemons_json(daemon: tuple[World, Client],
                                                                    tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from click.testing import CliRunner

    import broker.cli.jobs  # noqa: F401  (registers the job commands, as main() does)
    from broker.cli.main import cli

    _, client = daemon

    def gb(*args: str) -> str:
        out = CliRunner().invoke(cli, ["--socket", client.socket_path, *args], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return out.output

    monkeypatch.chdir(tmp_path)  # the job's workdir: the CLI makes its log there, as the user
    submitted = json.loads(gb("submit", "--json", "--group", "vision", "--time", "10m", "--", "sleep", "5"))
    job = client.show(submitted["id"])
    log = Path(submitted["log"])
    assert log.parent == tmp_path and log.name.startswith("gbroker-sleep-") and log.stat().st_mode & 0o777 == 0o600
    assert json.loads(gb("show", "--json", str(job.id))) == client.show(job.id).raw
    assert [j["id"] for j in json.loads(gb("status", "--json"))] == [job.id]
    shown = gb("show", str(job.id))
    assert f"Job {job.id}" in shown and "ATTEMPT" in shown and job.attempts[0].state in shown
    assert gb("cancel", str(job.id)).strip() == f"Job {job.id}: cancelled"
    assert "No active jobs" in gb("status")


def test_records_are_read_only_and_compare_without_their_raw_answer() -> None:
    a = Cancelled(id=1, state="cancelled", raw={"id": 1})
    assert a == Cancelled(id=1, state="cancelled", raw={}) != Cancelled(id=2, state="cancelled", raw={})
    assert repr(a) == "Cancelled(id=1, state='cancelled')"
    with pytest.raises(AttributeError, match="read-only"):
        a.state = "running"  # type: ignore[misc]
    with pytest.raises(TypeError, match="no field colour"):
        Cancelled(id=1, state="x", raw={}, colour="red")
    with pytest.raises(TypeError, match="state is missing"):
        Cancelled(id=1, raw={})


def test_a_busy_answer_given_before_the_request_was_read_is_retried(tmp_path: Path) -> None:
    """A daemon over its limits answers "busy" and closes without reading, so the request's send can
    fail (broken pipe) with the answer already waiting: the client reads it and tries again."""
    import json
    import socket
    import threading

    from broker.client import call

    sock_dir = Path(tempfile.mkdtemp(prefix="gb-busy-"))
    path = str(sock_dir / "s.sock")
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)
    seen: list[str] = []

    def serve() -> None:
        first, _ = srv.accept()  # busy: answered and closed with nothing read
        first.sendall(b'{"ok": false, "error": {"type": "Busy", "message": "busy", "hint": "", "exit_code": 75}}\n')
        first.close()
        second, _ = srv.accept()
        with second, second.makefile("rb") as f:
            seen.append(json.loads(f.readline())["op"])
            second.sendall(b'{"ok": true, "result": {"uid": 7}}\n')

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        # Larger than the socket's buffer, so the send is still going when the daemon closes.
        assert call(path, "whoami", timeout=10, pad="x" * 1_500_000) == {"uid": 7}
        assert seen == ["whoami"]
    finally:
        t.join(10)
        srv.close()
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_a_client_that_finds_its_socket_in_the_settings_warns_of_a_gbroker_variable_nobody_reads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "gbroker.toml"
    path.write_text(f'socket = "{tmp_path}/s.sock"\n')
    monkeypatch.delenv("GBROKER_SOCKET", raising=False)
    monkeypatch.setenv("GBROKER_SOCKT", f"{tmp_path}/meant.sock")
    with pytest.warns(UserWarning, match=r"GBROKER_SOCKT is not a gbroker setting .*did you mean GBROKER_SOCKET"):
        assert Client(config_path=str(path)).socket_path == f"{tmp_path}/s.sock"
    monkeypatch.delenv("GBROKER_SOCKT")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Client(config_path=str(path)).socket_path == f"{tmp_path}/s.sock"


def test_submit_says_what_slurm_reads_otherwise_once_from_flags_and_from_a_job_file(
        daemon: tuple[World, Client], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--time 1:30 is 90 seconds, as sbatch reads it: the job is submitted as written and the user is told,
    whether the daemon parsed the request (flags) or the CLI did (a job file), and each once."""
    import json

    from click.testing import CliRunner

    import broker.cli.jobs  # noqa: F401  (registers the job commands, as main() does)
    from broker.cli.main import cli

    world, client = daemon
    monkeypatch.chdir(tmp_path)

    def gb(*args: str) -> str:
        out = CliRunner().invoke(cli, ["--socket", client.socket_path, *args], catch_exceptions=False)
        assert out.exit_code == 0, out.output
        return out.output

    time_said = 'time_limit "1:30" is 1m30s (minutes:seconds, as sbatch reads it); if you meant 1h30m'
    mem_said = 'mem "16" is 16 MB per node (a bare number is MB, as sbatch reads it)'
    out = gb("submit", "--group", "vision", "--time", "1:30", "--mem", "16", "--", "sleep", "5")
    notes = [line for line in out.splitlines() if line.startswith("  note: ")]
    assert len(notes) == 2 and time_said in notes[0] and mem_said in notes[1], out
    job = client.show(int(out.split()[2]))
    assert world.slurm.jobs_by_id[job.slurm_job_id].limit_s == 120  # taken as written: 90 s (Slurm's whole minutes)

    (tmp_path / "job.toml").write_text('group = "vision"\ntime_limit = "1:30"\nmem = 16\npieces = "40"\n'
                                       'command = ["sleep", "5"]\n')
    out = gb("submit", "job.toml")
    notes = [line for line in out.splitlines() if line.startswith("  note: ")]
    assert len(notes) == 3, out  # pieces stays "40" in what the CLI sends: the daemon says it too, shown once
    assert time_said in notes[0] and 'mem 16 is 16 MB per node' in notes[1] and 'pieces "40" is one piece' in notes[2]
    answer = json.loads(gb("submit", "--json", "job.toml"))
    assert len(answer["cautions"]) == 3 and time_said in answer["cautions"][0]

    result = client.submit(_spec(tmp_path, time="2:00"))
    assert result.cautions == ('time_limit "2:00" is 2m (minutes:seconds, as sbatch reads it); if you meant 2h, '
                               'write "2:00:00" or "2h"',)
    assert client.submit(_spec(tmp_path, time="2h")).cautions == ()


def test_a_dry_run_says_where_and_at_what_cost_and_stores_nothing(daemon: tuple[World, Client], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`plan` runs submit's checks (the same refusals) and answers with the placement and the money;
    no job row, no log, no reservation, no sbatch."""
    import json

    from click.testing import CliRunner

    import broker.cli.jobs  # noqa: F401  (registers the job commands, as main() does)
    from broker.cli.main import cli
    from broker.client import Plan

    world, client = daemon
    plan = client.plan(_spec(tmp_path, name="train", time="10m"))
    assert isinstance(plan, Plan) and plan.name == "train" and plan.partition == "spot" and plan.capacity == "spot"
    # $3.60 per GPU-hour on spot, $7.20 on on-demand: 1 GPU for 10 minutes.
    assert plan.estimate_micros == 600_000 and plan.estimates_micros == {"spot": 600_000, "ondemand": 1_200_000}
    assert plan.budget_left_after_micros == 99_400_000 and plan.slurm.startswith("accepted (sbatch --test-only")
    assert plan.placed_by.startswith(world.svc.policy.name + ": ") and plan.raw["dry_run"] is True
    assert plan.raw["estimate"] == "$0.60" and plan.raw["budget"]["left_after"] == "$99.40"
    assert client.plan(_spec(tmp_path, interruptible=False)).estimates_micros == {"ondemand": 1_200_000}
    array = client.plan({**_spec(tmp_path), "pieces": "1-40", "chunk": 4})  # 10 tasks, each may run 10 minutes
    assert (array.raw["tasks"], array.raw["pieces"], array.estimate_micros) == (10, 40, 6_000_000)
    assert world.slurm.calls.get("sbatch", 0) == 0 and client.history() == [] and not list(tmp_path.glob("gbroker-*"))

    # Refused as the submission would be, word for word, and nothing is left behind either way.
    too_big = _spec(tmp_path, gpus=8, time="10h")  # $288 on spot, against $100
    with pytest.raises(RemoteError) as planned:
        client.plan(too_big)
    with pytest.raises(RemoteError) as submitted:
        client.submit(too_big)
    assert str(planned.value) == str(submitted.value) and "left of $100.00 in 2026-fall" in str(planned.value)
    assert planned.value.hint == submitted.value.hint
    with pytest.raises(RemoteError, match="time_limit: 'forever' is not a duration"):
        client.plan(_spec(tmp_path, time="forever"))
    # A plan reserves nothing: after 50 of them a job that takes most of the budget still fits.
    for _ in range(50):
        client.plan(_spec(tmp_path, gpus=2, time="10h"))  # $72 each
    assert client.submit(_spec(tmp_path, gpus=2, time="10h")).job.state != "failed"
    assert world.slurm.calls["sbatch"] == 1 and len(client.history()) == 1

    monkeypatch.chdir(tmp_path)

    def gb(*args: str, code: int = 0) -> str:
        out = CliRunner().invoke(cli, ["--socket", client.socket_path, *args], catch_exceptions=False)
        assert out.exit_code == code, out.output
        return out.output

    out = gb("submit", "--dry-run", "--group", "vision", "--time", "1:30", "--", "sleep", "5")
    lines = out.splitlines()
    assert lines[0] == "Would submit sleep to spot [spot]: nothing stored or queued (--dry-run)", out
    assert lines[1] == f"  pool      spot; {plan.placed_by}", out
    assert lines[2] == ("  estimate  $0.12 on spot, $0.24 on on-demand (at most: 1 GPU(s) x 2m00s, Slurm's limit in "
                        "whole minutes)"), out
    assert lines[3] == "  budget    $27.88 of $100.00 in 2026-fall would be left, with this job's estimate reserved"
    assert lines[4].startswith("  Slurm     accepted") and 'time_limit "1:30" is 1m30s' in lines[5], out
    answer = json.loads(gb("submit", "--dry-run", "--json", "--group", "vision", "--time", "2h", "--", "sleep", "5"))
    assert answer["estimate_micros"] == 7_200_000 and answer["dry_run"] is True and "cautions" not in answer
    assert "--key names the job a submission makes" in gb("submit", "--dry-run", "--key", new_key(), "--group",
                                                          "vision", "--", "sleep", "5", code=2)
    assert len(client.history()) == 1 and len(list(tmp_path.glob("gbroker-*.out"))) == 1  # the submitted job's


def test_jobs_are_picked_by_name_state_group_and_partition_to_list_or_cancel(
        daemon: tuple[World, Client], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import broker.cli.jobs  # noqa: F401  (registers the job commands, as main() does)
    from broker.cli.main import cli
    from broker.client import JOB_STATES
    from broker.states import JobState

    assert JOB_STATES == tuple(s.value for s in JobState)
    world, client = daemon
    ids = {name: client.submit(_spec(tmp_path, name=name, **kw)).id
           for name, kw in (("sweep-1", {}), ("sweep-2", {}), ("train", {"partition": "ondemand"}),
                            ("sim", {"group": "climate"}))}
    monkeypatch.chdir(tmp_path)

    def gb(*args: str, code: int = 0) -> str:
        out = CliRunner().invoke(cli, ["--socket", client.socket_path, *args], catch_exceptions=False)
        assert out.exit_code == code, out.output
        return out.output

    def listed(*args: str) -> list[str]:
        import json

        return sorted(j["name"] for j in json.loads(gb(*args, "--json")))

    assert listed("status", "--name", "sweep-*") == ["sweep-1", "sweep-2"]
    assert listed("status", "--partition", "ondemand") == ["train"]
    assert listed("status", "--group", "climate") == ["sim"]
    assert listed("status", "--state", "pending", "--name", "*1") == ["sweep-1"]
    assert "No job matches." in gb("status", "--name", "nothing*")
    assert "Invalid value for '--state'" in gb("status", "--state", "sleeping", code=2)

    refused = gb("cancel", code=2)
    assert "name the jobs to cancel" in refused and "--all for every active job of yours" in refused
    assert "not both" in gb("cancel", str(ids["sim"]), "--name", "sweep-*", code=2)
    assert "have ended; there is nothing to cancel" in gb("cancel", "--state", "completed", code=2)
    out = gb("cancel", "--name", "sweep-*")
    assert sorted(out.splitlines()) == sorted(f"Job {ids[n]}: cancelled" for n in ("sweep-1", "sweep-2"))
    assert listed("status") == ["sim", "train"]
    assert listed("history", "--state", "cancelled") == ["sweep-1", "sweep-2"]
    assert gb("cancel", "--name", "sweep-*").strip() == "No active job matches; nothing cancelled."
    assert gb("cancel", "--all").splitlines() == [f"Job {ids['sim']}: cancelled", f"Job {ids['train']}: cancelled"]
    assert listed("status") == [] and len(listed("history")) == 4
    # The Python client: the daemon's filters, and cancel in requests of at most 1,000 jobs.
    assert [j.name for j in client.jobs(active=False, group="climate")] == ["sim"]
    assert [j.name for j in client.jobs(active=False, partitions=["ondemand"])] == ["train"]
    sent: list[int] = []
    monkeypatch.setattr(client, "call", lambda op, **kw: sent.append(len(kw["job_ids"])) or [])
    client.cancel(list(range(1, 2501)))
    assert sent == [1000, 1000, 500]


SPOOF = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); c.settimeout(3)
try:
    got = c.recv(65536)
except OSError:
    got = b""
print(len(got), flush=True)
c.sendall(b'{"ok": true, "result": {"user": "you", "uid": 0, "admin": true}}\\n')
"""


def test_a_socket_served_by_another_user_gets_nothing(tmp_path: Path) -> None:
    """Another user listens where the caller's client looks (``/tmp/gbroker-UID``, made first):
    the kernel names the server's uid, and the client sends nothing to it."""
    import os
    import subprocess

    from broker import client as client_mod

    if os.geteuid() != 0:
        pytest.fail("this test runs a server as nobody: run the unit tests as root, as CI does")
    d = Path(tempfile.mkdtemp(prefix="gb-spoof-"))
    d.chmod(0o777)
    path = d / "gbroker.sock"
    server = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                               "/usr/bin/python3", "-c", SPOOF, str(path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        with pytest.raises(DaemonUnavailable, match=r"served by uid \d+, neither root nor you"):
            client_mod.call(str(path), "ping", timeout=5)
        assert server.stdout.readline().strip() == "0"  # not a byte of the request
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(d, ignore_errors=True)
