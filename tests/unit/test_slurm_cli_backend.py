"""The CLI backend's commands: what it runs, as whom, with which environment, how batched."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timezone
from pathlib import Path

import pytest

from broker.errors import ConfigError, SlurmError, SpecError
from broker.slurm import available_backends, make_backend, parse
from broker.slurm.backend import SubmitRequest
from broker.slurm.cli_backend import CliBackend, time_limit_minutes
from broker.proc import SAFE_PATH
from broker.slurm.runner import CallCounter, CompletedRun
from broker.slurm.script import render_batch_script

DATA = Path(__file__).parent / "data" / "slurm"


class FakeRunner:
    """Records calls; answers with canned stdout (or raises) per command name."""

    def __init__(self, answers: Mapping[str, str | Exception] | None = None) -> None:
        self.counter = CallCounter()
        self.calls: list[dict] = []
        self.answers = dict(answers or {})

    def run(self, argv, *, timeout_s=None, env=None, user=None, input=None, cwd=None):  # type: ignore[no-untyped-def]
        self.counter.record(argv)
        self.calls.append({"argv": argv, "env": env, "user": user, "input": input, "cwd": cwd})
        answer = self.answers.get(argv[0], "")
        if isinstance(answer, Exception):
            raise answer
        # Canned output is written with the bare separators; Slurm would use the ones asked for.
        return CompletedRun(argv, parse.separators_of(argv, env).respell(answer), "", 0, 0.001)


DAEMON_ENV = {
    "PATH": "/usr/bin:/bin",
    "SLURM_CONF": "/etc/lab/slurm.conf",
    "GBROKER_DB_PASSWORD": "secret",
    "SQUEUE_FORMAT": "%i",
    "SBATCH_RESERVATION": "evil",
    "TZ": "Europe/Paris",
    "HOME": "/root",
}


def request(**kw: object) -> SubmitRequest:
    base: dict = {
        "script": "#!/bin/bash\ntrue\n", "partition": "spot", "job_name": "gb-j1-0",
        "comment": "gbk:j1:0", "account": "vision", "user": "alice", "workdir": "/home/alice/w",
        "nodes": 2, "gpus_per_node": 4, "time_limit_s": 3601, "output": "/home/alice/w/%j.out",
        "signal": "B:USR1@120", "constraint": "spot",
    }  # fmt: skip
    base.update(kw)
    return SubmitRequest(**base)


def backend(**answers: str | Exception) -> tuple[CliBackend, FakeRunner]:
    fake = FakeRunner(answers)
    return CliBackend(fake, environ=DAEMON_ENV), fake


def test_submit_passes_every_option_on_the_command_line_and_script_on_stdin() -> None:
    b, fake = backend(sbatch="4242\n")
    assert b.submit(request()) == 4242
    (call,) = fake.calls
    assert call["argv"] == [
        "sbatch", "--parsable", "--partition=spot", "--job-name=gb-j1-0", "--comment=gbk:j1:0",
        "--chdir=/home/alice/w", "--nodes=2", "--ntasks-per-node=1", "--time=61", "--requeue", "--export=ALL",
        "--open-mode=append", "--account=vision", "--gres=gpu:4", "--output=/home/alice/w/%j.out",
        "--constraint=spot", "--signal=B:USR1@120",
    ]  # fmt: skip
    assert call["input"] == "#!/bin/bash\ntrue\n"
    assert call["user"] == "alice"
    assert call["cwd"] == "/home/alice/w"  # sbatch runs where the job does: SLURM_SUBMIT_DIR is right


def test_submit_environment_never_carries_daemon_secrets() -> None:
    b, fake = backend(sbatch="1\n")
    b.submit(request())
    env = fake.calls[0]["env"]
    # Fixed basics and the cluster's SLURM_CONF: not the daemon's PATH or secrets, and no
    # job environment at all (that reaches the job through its batch script).
    assert env == {
        "PATH": SAFE_PATH,
        "LANG": "C.UTF-8",
        "SLURM_CONF": "/etc/lab/slurm.conf",
    }


@pytest.mark.parametrize("name", ["SBATCH_PARTITION", "SLURM_ACCOUNT", "slurm_conf", "PATH", "LD_PRELOAD",
                                  "BASH_ENV", "PYTHONPATH", "A-B", "1X", "A B", ""])
def test_env_names_that_could_steer_slurm_or_loaders_never_reach_a_script(name: str) -> None:
    with pytest.raises(SpecError):
        render_batch_script(job_id=1, attempt=1, checkpoint_dir="/ck", command=["true"], env=[(name, "x")])


def test_submit_flags_for_hold_no_requeue_and_no_gpus() -> None:
    b, fake = backend(sbatch="7;lab\n")
    assert b.submit(request(hold=True, requeue=False, gpus_per_node=0, account=None,
                            output=None, signal=None, constraint=None)) == 7  # fmt: skip
    argv = fake.calls[0]["argv"]
    assert "--hold" in argv and "--no-requeue" in argv
    assert not any(
        a.startswith(("--gres", "--account", "--output", "--signal", "--constraint")) for a in argv
    )


@pytest.mark.parametrize(
    "kw",
    [
        {"job_name": "a\nb"},
        {"comment": "x\0"},
        {"nodes": 0},
        {"gpus_per_node": -1},
        {"time_limit_s": 0},
    ],
)
def test_submit_refuses_bad_requests(kw: dict) -> None:
    b, fake = backend(sbatch="1\n")
    with pytest.raises(SpecError):
        b.submit(request(**kw))
    assert fake.calls == []


def test_submit_without_job_id_is_a_slurm_error() -> None:
    b, _ = backend(sbatch="\n")
    with pytest.raises(SlurmError):
        b.submit(request())


def test_time_limits_round_up_to_whole_minutes() -> None:
    assert [time_limit_minutes(s) for s in (1, 60, 61, 3600)] == [1, 1, 2, 60]


def test_an_array_id_selects_every_row_of_its_tasks() -> None:
    b, _ = backend(squeue=(DATA / "arrays.squeue.txt").read_text())  # array 91: tasks under their own ids
    assert sorted(j.job_id for j in b.jobs(job_ids=[91])) == [91, 92, 94, 95, 96, 97]
    assert [j.job_id for j in b.jobs(job_ids=[95])] == [95]


def test_queries_run_in_utc_with_standard_times_and_no_format_overrides() -> None:
    b, fake = backend()
    b.jobs()
    env = fake.calls[0]["env"]
    assert env["TZ"] == "UTC" and env["SLURM_TIME_FORMAT"] == "standard"
    assert "SQUEUE_FORMAT" not in env and "SBATCH_RESERVATION" not in env
    assert env["SLURM_CONF"] == "/etc/lab/slurm.conf"
    assert fake.calls[0]["user"] is None


def test_jobs_is_one_call_filtered_in_python() -> None:
    b, fake = backend(squeue=(DATA / "busy.squeue.txt").read_text())
    assert [j.job_id for j in b.jobs(job_ids=[16, 9, 12345])] == [16, 9]
    assert [j.job_id for j in b.jobs(name_prefix="gb-cb3e")] == [17, 19]
    assert b.calls.total == 2
    assert all(c["argv"][0] == "squeue" and "--states=all" in c["argv"] for c in fake.calls)


def test_history_is_one_sacct_call_for_all_users_with_duplicates() -> None:
    b, fake = backend(sacct=(DATA / "preempted.sacct.txt").read_text())
    rows = b.history(job_ids=[1, 4], since=datetime(2026, 11, 29, 15, 0, tzinfo=UTC))
    assert len(rows) == 12  # sacct itself filters by --jobs; the recording holds all jobs
    argv = fake.calls[0]["argv"]
    for flag in ("--allusers", "--allocations", "--duplicates", "--parsable2", "--noheader"):
        assert flag in argv
    assert "--jobs=1,4" in argv
    assert "--starttime=2026-11-29T15:00:00" in argv


def test_history_converts_aware_times_to_utc_wall_time() -> None:
    from datetime import timedelta

    b, fake = backend()
    b.history(since=datetime(2026, 11, 29, 16, 0, tzinfo=timezone(timedelta(hours=1))))
    assert "--starttime=2026-11-29T15:00:00" in fake.calls[0]["argv"]


def test_history_of_no_jobs_costs_nothing() -> None:
    b, fake = backend()
    assert b.history(job_ids=[]) == []
    assert fake.calls == []


def test_job_control_is_batched_into_one_call_each() -> None:
    b, fake = backend()
    b.cancel([5, 6, 7])
    b.hold([5, 6])
    b.release([5, 6])
    b.requeue([8, 9])
    b.start_now([8, 9])
    assert [c["argv"] for c in fake.calls] == [
        ["scancel", "5", "6", "7"],
        ["scontrol", "hold", "5,6"],
        ["scontrol", "release", "5,6"],
        ["scontrol", "requeue", "8,9"],
        ["scontrol", "update", "JobId=8,9", "StartTime=now"],
    ]


def test_empty_lists_cost_no_call() -> None:
    b, fake = backend()
    b.cancel([])
    b.hold([])
    b.start_now([])
    b.power_down([])
    assert fake.calls == []


@pytest.mark.parametrize("bad", [0, -1, "5", True, 1.5])
def test_job_ids_must_be_positive_ints(bad: object) -> None:
    b, _ = backend()
    with pytest.raises(ValueError):
        b.cancel([bad])  # type: ignore[list-item]


def test_update_maps_fields_to_slurm_keys() -> None:
    b, fake = backend()
    b.update(12, partition="ondemand", time_limit_s=7200, gpus_per_node=2)
    assert fake.calls[0]["argv"] == ["scontrol", "update", "JobId=12", "Partition=ondemand",
                                     "TimeLimit=120", "Gres=gpu:2"]  # fmt: skip


def test_update_refuses_unknown_fields_and_names_the_valid_ones() -> None:
    b, fake = backend()
    with pytest.raises(ValueError, match="partition"):
        b.update(12, priority=5)
    with pytest.raises(SpecError):
        b.update(12, comment="two\nlines")
    assert fake.calls == []


def test_power_actions() -> None:
    b, fake = backend()
    b.power_down(["spot1", "spot2"])
    b.power_down(["spot3"], force=True)
    b.power_up(["od1"])
    assert [c["argv"] for c in fake.calls] == [
        ["scontrol", "update", "NodeName=spot[1-2]", "State=POWER_DOWN"],
        ["scontrol", "update", "NodeName=spot3", "State=POWER_DOWN_FORCE"],
        ["scontrol", "update", "NodeName=od1", "State=POWER_UP"],
    ]


def test_ping() -> None:
    assert backend(scontrol="Slurmctld(primary) at vm is UP\n")[0].ping() is True
    assert backend(scontrol=SlurmError("down", argv=["scontrol"]))[0].ping() is False


def test_cancel_tolerates_jobs_that_are_already_gone() -> None:
    gone = SlurmError(
        "scancel failed",
        argv=["scancel", "5"],
        returncode=1,
        stderr="scancel: error: Kill job error on job id 5: Job/step already completing or completed\n",
    )
    b, _ = backend(scancel=gone)
    b.cancel([5])  # no error
    other = SlurmError(
        "x", argv=["scancel"], returncode=1, stderr="scancel: error: Access/permission denied\n"
    )
    with pytest.raises(SlurmError):
        backend(scancel=other)[0].cancel([5])


def test_factory() -> None:
    assert available_backends() == ["cli"]  # pyslurm does not match Slurm 22.05/24.11 here
    assert isinstance(make_backend(), CliBackend)
    assert isinstance(make_backend("cli"), CliBackend)
    with pytest.raises(ConfigError):
        make_backend("pyslurm")
    with pytest.raises(ConfigError, match="auto, cli, pyslurm"):
        make_backend("slurmrestd")
