"""The parsers and the state table on output recorded from Slurm 24.11 and 26.05.

Each release's set (tests/unit/data/slurm/<version>/) was recorded from that
release's real daemons (`contrib/slurm/devcluster up --slurm VERSION`) by
record_release.py, which makes the same situations one after another: a job
on a booting cloud node, a requeue, a preemption, a reclaim, a drained node.
The 22.05 set (the directory itself) is read by test_slurm_parse.py.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.slurm import parse
from broker.slurm.cli_backend import CliBackend
from broker.slurm.runner import CallCounter, CompletedRun
from broker.states import AttemptState as A
from broker.states import NodeState as N
from test_slurm_parse import as_recorded, before_arrays  # the squeue command the recordings ran (before the array fields)

DATA = Path(__file__).parent / "data" / "slurm"
RELEASES = ["24.11", "26.05"]
SCENARIOS = ["configuring", "requeued", "preempted", "reclaimed"]
NODES = {"own1", "own2", "spot1", "spot2", "spot3", "spot4", "spotb1", "spotb2", "od1", "od2"}


def rec(version: str, name: str) -> str:
    return (DATA / version / name).read_text()


def by_name(jobs: list, name: str) -> list:  # type: ignore[type-arg]
    return [j for j in jobs if j.name == name]


def test_every_release_has_its_whole_set() -> None:
    for version in RELEASES:
        names = {p.name for p in (DATA / version).iterdir()}
        for scenario in SCENARIOS:
            for command in ("squeue", "sacct", "sinfo"):
                assert f"{scenario}.{command}.txt" in names, (version, scenario, command)
        assert "drained.sinfo.txt" in names


@pytest.mark.parametrize("version", RELEASES)
def test_every_state_string_is_known(version: str, caplog: pytest.LogCaptureFixture) -> None:
    """No job or node state of the release falls through to UNKNOWN, and nothing is skipped."""
    with caplog.at_level(logging.WARNING):
        for path in sorted((DATA / version).glob("*.txt")):
            text = path.read_text()
            if ".squeue." in path.name:
                assert all(j.state is not A.UNKNOWN for j in parse.parse_squeue(text)), path.name
            elif ".sacct." in path.name:
                assert all(r.state is not A.UNKNOWN for r in parse.parse_sacct(text)), path.name
            elif ".sinfo." in path.name:
                nodes = parse.parse_sinfo(text)
                assert {n.name for n in nodes} == NODES, path.name
                assert all(n.state is not N.UNKNOWN and n.gpus == 4 for n in nodes), path.name
    assert caplog.records == [], [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("version", RELEASES)
def test_booting_cloud_job_held_job_failed_and_other_users_job(version: str) -> None:
    jobs = parse.parse_squeue(rec(version, "configuring.squeue.txt"))
    (run,) = by_name(jobs, "gbrec-run")
    assert run.state_raw == "CONFIGURING" and run.state is A.RUNNING
    assert run.nodes == ["spot1"] and run.partition == "spot" and run.comment == "gbk:rec1:0"
    assert run.time_limit_s == 300 and run.reason == "" and run.restarts == 0
    (held,) = by_name(jobs, "gbrec-held")
    assert held.state is A.PENDING and held.reason == "JobHeldUser" and held.start_time is None
    (mine,) = by_name(jobs, "gbrec-alice|a b")
    assert (mine.user, mine.account, mine.state) == ("alice", "vision", A.COMPLETED)
    rows = parse.parse_sacct(rec(version, "configuring.sacct.txt"))
    (failed,) = by_name(rows, "gbrec-fail")
    assert failed.state is A.FAILED and failed.exit_code == 3


@pytest.mark.parametrize("version", RELEASES)
def test_a_cloud_node_given_a_job_before_its_resume_is_taken_not_free(version: str) -> None:
    """24.11/26.05 print mixed+cloud+powered_down here (22.05: mixed+cloud): ALLOCATED, never off."""
    nodes = {n.name: n for n in parse.parse_sinfo(rec(version, "configuring.sinfo.txt"))}
    assert nodes["spot1"].state_raw.lower() in ("mixed+cloud+powered_down", "mixed+cloud")
    assert nodes["spot1"].state is N.ALLOCATED
    assert nodes["spot2"].state is N.POWERED_DOWN and nodes["own1"].state is N.IDLE


@pytest.mark.parametrize("version", RELEASES)
def test_requeue_has_restart_count_begin_time_and_a_requeued_row(version: str) -> None:
    (job,) = by_name(parse.parse_squeue(rec(version, "requeued.squeue.txt")), "gbrec-run")
    assert job.state is A.PENDING and job.reason == "BeginTime" and job.restarts == 1
    assert job.nodes == [] and job.start_time and job.submit_time
    assert (job.start_time - job.submit_time).total_seconds() >= 100  # the ~2-minute requeue delay
    rows = by_name(parse.parse_sacct(rec(version, "requeued.sacct.txt")), "gbrec-run")
    assert [r.state_raw.split()[0] for r in rows] == ["REQUEUED"]
    assert rows[0].state is A.PREEMPTED and rows[0].alloc_gpus == 1


@pytest.mark.parametrize("version", RELEASES)
def test_preemption_is_one_row_per_attempt(version: str) -> None:
    rows = by_name(parse.parse_sacct(rec(version, "preempted.sacct.txt")), "gbrec-run")
    assert [r.state for r in rows] == [A.PREEMPTED, A.PREEMPTED]
    assert [r.state_raw for r in rows] == ["REQUEUED", "PREEMPTED"]
    assert [r.restarts for r in parse.number_attempts(rows)] == [0, 1]
    (urgent,) = by_name(parse.parse_sacct(rec(version, "preempted.sacct.txt")), "gbrec-urgent")
    assert urgent.partition == "urgent" and urgent.alloc_gpus == 4
    (job,) = by_name(parse.parse_squeue(rec(version, "preempted.squeue.txt")), "gbrec-run")
    assert job.state is A.PENDING and job.restarts == 2


@pytest.mark.parametrize("version", RELEASES)
def test_reclaim_is_node_fail_and_the_node_is_down_with_its_reason(version: str) -> None:
    rows = by_name(parse.parse_sacct(rec(version, "reclaimed.sacct.txt")), "gbrec-run")
    assert rows[-1].state_raw == "NODE_FAIL" and rows[-1].state is A.RECLAIMED
    assert rows[-1].nodelist == ["spot1"] and len(rows) == 3
    nodes = {n.name: n for n in parse.parse_sinfo(rec(version, "reclaimed.sinfo.txt"))}
    assert nodes["spot1"].state is N.DOWN and nodes["spot1"].reason == "reclaimed"
    (job,) = by_name(parse.parse_squeue(rec(version, "reclaimed.squeue.txt")), "gbrec-run")
    assert job.state is A.PENDING and job.restarts == 3


@pytest.mark.parametrize("version", RELEASES)
def test_a_drained_powered_down_node_is_down_with_its_reason(version: str) -> None:
    nodes = {n.name: n for n in parse.parse_sinfo(rec(version, "drained.sinfo.txt"))}
    assert nodes["od2"].state is N.DOWN and nodes["od2"].reason == "gbrec maintenance"
    assert nodes["od1"].state is N.POWERED_DOWN


class ReplayRunner:
    """Answers each command with the recorded output of the same argv."""

    def __init__(self, version: str, scenario: str) -> None:
        self.base = DATA / version / scenario
        self.counter = CallCounter()

    def run(self, argv, *, timeout_s=None, env=None, user=None, input=None, cwd=None):  # type: ignore[no-untyped-def]
        self.counter.record(argv)
        sep, argv = parse.separators_of(argv, env), as_recorded(argv, env)
        stem = f"{self.base}.{argv[0]}"
        recorded = Path(f"{stem}.argv").read_text().split("\n")[:-1]
        if argv[0] == "sacct":  # the window start differs per run
            argv = [a for a in argv if not a.startswith("--starttime=")]
            recorded = [a for a in recorded if not a.startswith("--starttime=")]
        assert argv == recorded or (argv[0] == "squeue" and before_arrays(argv) == recorded), \
            f"{stem}: the backend no longer runs the recorded command"
        return CompletedRun(argv, sep.respell(Path(f"{stem}.txt").read_text()), "", 0, 0.01)


@pytest.mark.parametrize("version", RELEASES)
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_backend_replays_the_release_recording(version: str, scenario: str) -> None:
    backend = CliBackend(ReplayRunner(version, scenario))
    assert backend.jobs()
    assert backend.history(since=datetime(2026, 11, 28, tzinfo=UTC))
    assert {n.name for n in backend.nodes()} == NODES
    assert backend.calls.snapshot() == {"squeue": 1, "sacct": 1, "sinfo": 1}
