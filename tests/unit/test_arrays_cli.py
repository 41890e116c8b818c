"""The CLI's side of arrays: progress in status and show, watch, show --follow, logs (read as the
caller, by attempt and piece), and the submit flags; against a stand-in for the daemon's answers."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from broker.cli import main as cli_main

ME = pwd.getpwuid(os.getuid())


def job(state: str, done: int, log: str, pieces_log: str) -> dict[str, Any]:
    counts = {"done": done, "running": 4 - done} if done < 4 else {"done": 4}
    line = f"{done}/4 done" + (f", {4 - done} running" if done < 4 else "")
    return {
        # The logs are this test's files: the job is its user's (logs reads a log as the job's owner).
        "id": 5, "name": "frames", "kind": "render", "owner": ME.pw_name, "owner_uid": ME.pw_uid, "group": "vision",
        "state": state, "reason": line, "capacity": "spot", "partition": "spot", "policy": "simple",
        "reclaims": 0, "failures": 0, "attempts": [], "slurm_job_id": None, "deadline": None, "created_at": None,
        "finished_at": None, "age_s": 5, "log": log, "events": [],
        "pieces": {"total": 4, "counts": counts, "line": line},
        "array": {"by_state": {"done": "1-2", "running": "3-4"}, "batches": [],
                  "pieces": [{"piece": i, "state": "done", "log": pieces_log.replace("N", str(i)), "reason": ""}
                             for i in range(1, 5)]},
    }


@pytest.fixture
def daemon(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[dict[str, Any]]:
    """Answers "show" from a list (the last answer repeats) and "list" with the first."""
    answers: list[dict[str, Any]] = []

    def call(self: Any, op: str, *, repeatable: bool = False, **args: Any) -> Any:
        if op == "list":
            return [{**answers[0], "attempts": 0}]
        return answers.pop(0) if len(answers) > 1 else answers[0]

    monkeypatch.setattr(cli_main.Context, "call", call)
    return answers


def run(*args: str) -> Any:
    import broker.cli.jobs  # noqa: F401  (registers the job commands, as main() does)
    from broker.cli.main import cli

    return CliRunner().invoke(cli, ["--socket", "/nonexistent.sock", *args], catch_exceptions=False)


def run_failing(*args: str) -> Any:
    import broker.cli.jobs  # noqa: F401
    from broker.cli.main import cli

    return CliRunner().invoke(cli, ["--socket", "/nonexistent.sock", *args])


def test_status_show_and_watch_give_the_progress(daemon: list[dict[str, Any]], tmp_path: Path) -> None:
    log = str(tmp_path / "x.out")
    daemon.extend([job("running", 2, log, ""), job("running", 3, log, ""), job("completed", 4, log, "")])
    out = run("status").output
    assert "job 5 pieces: 2/4 done, 2 running" in out
    shown = run("show", "5").output
    assert "pieces     2/4 done, 2 running" in shown and "done       1-2" in shown
    watched = run("watch", "5", "--interval", "0").output.splitlines()
    assert watched[0].startswith("job 5 [") and "75%" in watched[0] and "3/4 done" in watched[0]
    assert watched[-1] == "job 5 completed: 4/4 done"


def test_show_follow_shows_then_watches(daemon: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setattr(time, "sleep", lambda s: None)
    daemon.extend([job("running", 3, "", ""), job("running", 3, "", ""), job("completed", 4, "", "")])
    out = run("show", "5", "--follow").output
    assert "pieces     3/4 done, 1 running" in out and out.rstrip().endswith("job 5 completed: 4/4 done")


def test_logs_by_attempt_and_by_piece_read_the_file_named(daemon: list[dict[str, Any]], tmp_path: Path) -> None:
    log = tmp_path / "gbroker-frames-Ab12Cd.out"
    log.write_text("=== gbroker: job 5 attempt 1 starts: Slurm job 9 ===\nfirst run\n"
                   "=== gbroker: job 5 attempt 2 starts: Slurm job 9 ===\nsecond run\nunfinished")
    (tmp_path / "gbroker-frames-Ab12Cd.piece-3.out").write_text("piece three\n")
    daemon.append(job("completed", 4, str(log), str(tmp_path / "gbroker-frames-Ab12Cd.piece-N.out")))
    assert run("logs", "5").output.endswith("second run\nunfinished\n")
    only = run("logs", "5", "--attempt", "2").output
    assert "second run" in only and "first run" not in only and "attempt 2 starts" in only
    assert run("logs", "5", "--piece", "3").output == "piece three\n"
    missing = run_failing("logs", "5", "--piece", "9")
    assert missing.exit_code != 0 and "has no piece 9" in missing.output


def test_logs_follow_reads_what_comes_until_the_job_ends(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = tmp_path / "j.out"
    log.write_text("one\n")
    looks = {"n": 0}

    def call(self: Any, op: str, *, repeatable: bool = False, **args: Any) -> Any:
        # The job writes a line between two looks, and has ended by the fourth.
        looks["n"] += 1
        if looks["n"] < 4:
            with open(log, "a") as fh:
                fh.write(f"line {looks['n']}\n")
        return job("completed" if looks["n"] >= 4 else "running", 3, str(log), "")

    monkeypatch.setattr(cli_main.Context, "call", call)
    out = run("logs", "5", "-f", "--interval", "0").output
    assert out.startswith("one\nline 1\nline 2\n") and "line 3" in out


def test_submit_flags_make_an_array_a_sweep_and_a_chain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    def call(self: Any, op: str, *, repeatable: bool = False, **args: Any) -> Any:
        sent.append(args["spec"])
        return {"id": 9, "name": "x", "partition": "spot", "capacity": "spot", "slurm_job_id": 77}

    monkeypatch.setattr(cli_main.Context, "call", call)
    monkeypatch.chdir(tmp_path)
    base = ["submit", "--group", "vision", "--time", "5m"]
    assert run(*base, "--array", "1-400%16", "--chunk", "10", "--after", "3,4", "--", "python3", "r.py").exit_code == 0
    assert (sent[-1]["pieces"], sent[-1]["chunk"], sent[-1]["after"]) == ("1-400%16", 10, [3, 4])
    (tmp_path / "points.txt").write_text("--a 1\n--a 2\n")
    assert run(*base, "--sweep", "points.txt", "--", "python3", "sim.py").exit_code == 0
    assert sent[-1]["sweep"] == ["--a 1", "--a 2"] and "pieces" not in sent[-1]
    bad = run_failing(*base, "--after", "3,x", "--", "true")
    assert bad.exit_code != 0 and "after: 'x' is not a job number" in bad.output
