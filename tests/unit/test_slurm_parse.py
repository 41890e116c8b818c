"""Parsers fed with output recorded from the real dev cluster (Slurm 22.05.8).

Recordings live in tests/unit/data/slurm (``<scenario>.<command>.txt``),
made with tests/unit/data/slurm/record.py; each ``.argv`` file holds the
exact command that produced it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from broker.slurm import parse
from broker.slurm.cli_backend import CliBackend
from broker.slurm.runner import CallCounter, CompletedRun
from broker.states import AttemptState as A
from broker.states import NodeState as N

DATA = Path(__file__).parent / "data" / "slurm"


def rec(name: str) -> str:
    return (DATA / name).read_text()


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# ------------------------------------------------------------------ squeue


def test_squeue_configuring_and_held() -> None:
    jobs = {j.job_id: j for j in parse.parse_squeue(rec("configuring.squeue.txt"))}
    run, held = jobs[4], jobs[5]
    assert run.state_raw == "CONFIGURING" and run.state is A.RUNNING
    assert run.nodes == ["spot1"]
    assert run.name == "gbrec-run" and run.user == "root" and run.account == "root"
    assert run.partition == "spot"
    assert run.comment == "gbk:rec1:0"
    assert run.submit_time == utc("2026-11-29T14:51:02")
    assert run.time_limit_s == 300
    assert run.reason == ""  # Slurm prints "None"
    assert held.state is A.PENDING and held.reason == "JobHeldUser"
    assert held.nodes == [] and held.start_time is None  # "N/A"


def test_squeue_after_requeue_has_restart_count_and_begin_time() -> None:
    (job,) = [j for j in parse.parse_squeue(rec("requeued.squeue.txt")) if j.job_id == 4]
    assert job.state is A.PENDING
    assert job.reason == "BeginTime"
    assert job.restarts == 1
    assert job.nodes == []
    assert job.start_time == utc("2026-11-29T14:53:49")  # the 2-minute requeue delay


def test_squeue_preempted_job_back_in_queue_and_finished_jobs() -> None:
    jobs = {j.job_id: j for j in parse.parse_squeue(rec("preempted.squeue.txt"))}
    assert jobs[9].state is A.PENDING and jobs[9].restarts == 1
    assert jobs[8].state is A.TIMEOUT and jobs[8].reason == "TimeLimit"
    assert jobs[8].time_limit_s == 60
    assert jobs[10].partition == "urgent" and jobs[10].state is A.RUNNING


def test_squeue_other_users_failures_and_nulls() -> None:
    jobs = {j.job_id: j for j in parse.parse_squeue(rec("busy.squeue.txt"))}
    assert jobs[16].user == "alice" and jobs[16].account == "vision"
    assert jobs[17].account == "climate"
    assert jobs[16].state is A.FAILED and jobs[16].reason == "JobLaunchFailure"
    assert jobs[22].comment == ""  # "(null)"
    assert jobs[22].time_limit_s is None  # UNLIMITED
    assert jobs[20].state is A.COMPLETED


def test_squeue_record_with_wrong_field_count_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    good = rec("configuring.squeue.txt")
    bad = "123" + parse.FS + "only-two" + parse.RS + "\n"
    with caplog.at_level(logging.WARNING):
        jobs = parse.parse_squeue(bad + good)
    assert [j.job_id for j in jobs] == [4, 5]
    assert "skipping a squeue record" in caplog.text


def test_squeue_name_with_pipes_spaces_and_newline_survives() -> None:
    fields = ["77", "my|odd job\nname", "bob", "vision", "spot", "RUNNING", "None", "spot[1-2]", "0",
              "2026-11-29T14:51:02", "2026-11-29T14:51:03", "1-00:00:00", "key|with|pipes"]  # fmt: skip
    text = parse.FS.join(fields) + parse.RS + "\n"
    (job,) = parse.parse_squeue(text)
    assert job.name == "my|odd job\nname"
    assert job.nodes == ["spot1", "spot2"]
    assert job.comment == "key|with|pipes"
    assert job.time_limit_s == 86400


# ------------------------------------------------------------------- sacct


def test_sacct_every_attempt_with_its_own_row() -> None:
    rows = parse.parse_sacct(rec("preempted.sacct.txt"))
    by_job: dict[int, list] = {}
    for r in rows:
        by_job.setdefault(r.job_id, []).append(r)

    # Job 1: reclaimed on spot1 (NODE_FAIL), then cancelled on spot2.
    first, second = by_job[1]
    assert (first.state, first.nodelist, first.restarts) == (A.RECLAIMED, ["spot1"], 0)
    assert (second.state_raw, second.state, second.restarts) == ("CANCELLED by 0", A.CANCELLED, 1)
    assert first.alloc_gpus == 2 and first.elapsed_s == 21
    assert first.start == utc("2026-11-29T14:48:58") and first.end == utc("2026-11-29T14:49:19")
    assert first.comment == "hello"

    # Job 4: requeued by an admin, then completed.
    requeued, done = by_job[4]
    assert requeued.state is A.PREEMPTED and requeued.state_raw == "REQUEUED"
    assert done.state is A.COMPLETED and done.restarts == 1
    assert done.exit_code == 0

    # Job 2: preempted, then cancelled while pending (no nodes, no start).
    pre, cancelled = by_job[2]
    assert pre.state is A.PREEMPTED and pre.alloc_gpus == 4
    assert cancelled.nodelist == [] and cancelled.start is None and cancelled.alloc_gpus == 0

    assert by_job[7][0].state is A.FAILED and by_job[7][0].exit_code == 3
    assert by_job[8][0].state is A.TIMEOUT and by_job[8][0].elapsed_s == 60
    assert by_job[9][0].state is A.PREEMPTED and by_job[9][0].nodelist == ["spot3"]
    running = by_job[10][0]
    assert running.state is A.RUNNING and running.end is None  # "Unknown"
    assert running.comment == ""  # slurmdbd gets the comment when the job ends


def test_sacct_output_that_does_not_line_up_is_read_as_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Rows are counted by separators (a name may hold newlines): a row short of fields shifts
    every row after it, so nothing is guessed; reconcile reads it again next tick."""
    with caplog.at_level(logging.ERROR):
        rows = parse.parse_sacct("1" + parse.FS + "x\n" + rec("requeued.sacct.txt"))
    assert rows == [] and "not a whole number of 14-field rows" in caplog.text


# ------------------------------------------- names and comments that print separators
class Printer:
    """Prints jobs as squeue -O and sacct -P do: each field whole, then the suffix or delimiter
    the command asked for; nothing escaped (Slurm keeps names and comments byte for byte)."""

    def __init__(self, squeue: list[dict[str, str]], sacct: list[dict[str, str]]) -> None:
        self.squeue, self.sacct = squeue, sacct
        self.counter = CallCounter()
        self.commands: list[tuple[list[str], dict[str, str]]] = []

    def run(self, argv, *, timeout_s=None, env=None, user=None, input=None):  # type: ignore[no-untyped-def]
        self.counter.record(argv)
        self.commands.append((list(argv), dict(env or {})))
        if argv[0] == "squeue":
            spec = next((a.removeprefix("--Format=") for a in argv if a.startswith("--Format=")), None)
            spec = spec if spec is not None else env[parse.SQUEUE_FORMAT_ENV]
            items = [item.split(":0", 1) for item in spec.split(",")]
            out = "".join("".join(job[f] + suffix for f, suffix in items) + "\n" for job in self.squeue)
        else:
            delim = next(a.removeprefix("--delimiter=") for a in argv if a.startswith("--delimiter="))
            fields = next(a.removeprefix("--format=") for a in argv if a.startswith("--format=")).split(",")
            out = "".join(delim.join(row[f] for f in fields) + "\n" for row in self.sacct)
        return CompletedRun(argv, out, "", 0, 0.001)


def queued(jid: str, name: str, user: str, comment: str) -> dict[str, str]:
    return {"JobID": jid, "Name": name, "UserName": user, "Account": "lab", "Partition": "spot",
            "State": "RUNNING", "Reason": "None", "NodeList": "spot1", "RestartCnt": "0",
            "SubmitTime": "2026-12-01T10:00:00", "StartTime": "2026-12-01T10:00:05", "TimeLimit": "1:00:00",
            "Comment": comment, "ArrayJobID": jid, "ArrayTaskID": "N/A"}


def accounted(jid: str, name: str, user: str, comment: str, elapsed: str = "3600") -> dict[str, str]:
    return {"JobIDRaw": jid, "JobName": name, "User": user, "Account": "lab", "Partition": "spot",
            "State": "COMPLETED", "NodeList": "spot1", "Submit": "2026-12-01T10:00:00",
            "Start": "2026-12-01T10:00:05", "End": "2026-12-01T11:00:05", "ElapsedRaw": elapsed,
            "AllocTRES": "cpu=1,gres/gpu=4", "ExitCode": "0:0", "Comment": comment, "JobID": jid}


def forged_squeue_record(jid: str, user: str, comment: str) -> str:
    """One squeue record, written with the bare separators anyone can type into a job name."""
    f = queued(jid, "gb-" + comment + "-1", user, comment)
    return parse.FS.join(f[k] for k in parse.SQUEUE_FIELDS) + parse.RS + "\n"


def test_a_name_cannot_print_a_queue_record_for_someone_elses_job() -> None:
    # mallory names her own job so that, printed raw, it reads as bob's job 7 (bob's key is in
    # the queue for all to see): were it believed, the daemon would act on bob's job as root.
    evil = "x" + parse.RS + "\n" + forged_squeue_record("7", "bob", "gbk:bob:1") + "y"
    printer = Printer([queued("5", evil, "mallory", "c" + parse.FS + "d\ne"), queued("6", "gb-ok-1", "bob", "k")], [])
    jobs = CliBackend(printer).jobs()
    assert [(j.job_id, j.user) for j in jobs] == [(5, "mallory"), (6, "bob")]
    assert jobs[0].name == evil and jobs[0].comment == "c" + parse.FS + "d\ne"  # hers, whole


def test_a_name_cannot_print_an_accounting_row_nor_hide_its_own_hours() -> None:
    # The ledger charges from sacct: a forged row could bill bob, or make mallory's run free.
    forged = accounted("7", "gb-gbk:bob:1-1", "bob", "gbk:bob:1", elapsed="999999")
    evil = "x\n" + parse.FS.join(forged[k] for k in parse.SACCT_FIELDS) + "\ny"
    printer = Printer([], [accounted("5", evil, "mallory", "gbk:m:1\nand more"), accounted("6", "gb-b-1", "bob", "")])
    rows = CliBackend(printer).history(job_ids=[5, 6, 7])
    assert [(r.job_id, r.user, r.elapsed_s) for r in rows] == [(5, "mallory", 3600), (6, "bob", 3600)]
    assert rows[0].name == evil and rows[0].comment == "gbk:m:1\nand more"


def test_array_rows_are_read_the_same_way() -> None:
    forged = {**accounted("7", "gb-gbk:bob:1-1", "bob", "gbk:bob:1"), "JobID": "3_1"}
    evil = "x\n" + parse.FS.join(forged[k] for k in (*parse.SACCT_FIELDS, "JobID")) + "\ny"
    printer = Printer([], [{**accounted("5", evil, "mallory", "c\n"), "JobID": "4_2"}])
    (row,) = CliBackend(printer).array_history([3, 4])
    assert (row.array_id, row.task, row.row.job_id, row.row.user, row.row.comment) == (4, 2, 5, "mallory", "c\n")


def test_every_listing_draws_its_own_separators_and_squeue_keeps_them_off_its_command_line() -> None:
    printer = Printer([queued("6", "gb-ok-1", "bob", "k")], [accounted("6", "gb-ok-1", "bob", "k")])
    backend = CliBackend(printer)
    backend.jobs(), backend.jobs(), backend.history(job_ids=[6]), backend.history(job_ids=[6])
    seps = [parse.separators_of(argv, env) for argv, env in printer.commands]
    assert len({s.fs for s in seps}) == 4 and all(len(s.fs) == 17 for s in seps)
    for argv, env in printer.commands[:2]:
        assert not any(parse.separators_of([], env).fs[1:] in a for a in argv)  # /proc/PID/cmdline is public


# ------------------------------------------------------------------- sinfo


def test_sinfo_merges_partitions_and_reads_power_states() -> None:
    nodes = {n.name: n for n in parse.parse_sinfo(rec("running.sinfo.txt"))}
    assert sorted(nodes) == ["od1", "od2", "spot1", "spot2", "spot3", "spot4"]
    assert sorted(nodes["spot1"].partitions) == ["spot", "urgent"]
    assert nodes["od1"].partitions == ["ondemand"]
    assert all(n.gpus == 4 for n in nodes.values())
    assert nodes["od1"].powered_down and nodes["od1"].state is N.POWERED_DOWN
    assert nodes["spot1"].state is N.POWERING_DOWN
    assert nodes["spot2"].state is N.ALLOCATED
    assert nodes["spot3"].features == ["spot"]
    assert nodes["spot2"].reason == ""


def test_sinfo_drained_node_is_down_with_reason() -> None:
    nodes = {n.name: n for n in parse.parse_sinfo(rec("drained.sinfo.txt"))}
    assert nodes["od2"].state is N.DOWN
    assert nodes["od2"].reason == "gbroker parser test"
    assert "DRAIN" in nodes["od2"].flags
    assert nodes["spot2"].idle and nodes["spot2"].state is N.IDLE


def test_sinfo_not_responding_powered_down_node() -> None:
    nodes = {n.name: n for n in parse.parse_sinfo(rec("busy.sinfo.txt"))}
    assert nodes["od2"].state is N.POWERED_DOWN
    assert "NOT_RESPONDING" in nodes["od2"].flags


# ------------------------------------------------------------ small fields


@pytest.mark.parametrize(
    ("text", "want"),
    [("5:00", 300), ("1:00:00", 3600), ("1-00:00:00", 86400), ("2-03", 183600), ("90", 5400),
     ("1-02:03", 93780), ("UNLIMITED", None), ("NOT_SET", None), ("INVALID", None), ("N/A", None)],
)  # fmt: skip
def test_durations(text: str, want: int | None) -> None:
    assert parse.parse_duration_s(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [("billing=1,cpu=1,gres/gpu=2,node=1", 2), ("cpu=4,mem=1G", 0), ("", 0),
     ("gres/gpu:a100=2,gres/gpu=2", 2), ("gres/gpu:a100=2,gres/gpu:v100=1", 3)],
)  # fmt: skip
def test_tres_gpus(text: str, want: int) -> None:
    assert parse.parse_tres_gpus(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [("gpu:4", 4), ("gpu:a100:4(S:0-1)", 4), ("(null)", 0), ("gpu:2,mps:100", 2),
     ("gpu:a100:2,gpu:v100:1", 3)],
)  # fmt: skip
def test_gres_gpus(text: str, want: int) -> None:
    assert parse.parse_gres_gpus(text) == want


@pytest.mark.parametrize(
    ("text", "want"),
    [("2026-11-29T14:51:02", utc("2026-11-29T14:51:02")), ("Unknown", None), ("None", None),
     ("N/A", None), ("", None), ("1970-01-01T00:00:00", None)],
)  # fmt: skip
def test_times(text: str, want: datetime | None) -> None:
    assert parse.parse_time(text) == want


def test_exit_codes() -> None:
    assert parse.parse_exit_code("3:0") == (3, 0)
    assert parse.parse_exit_code("0:9") == (0, 9)


@pytest.mark.parametrize(("text", "want"), [("42\n", 42), ("42;lab\n", 42)])
def test_sbatch_parsable(text: str, want: int) -> None:
    assert parse.parse_sbatch_parsable(text) == want


def test_sbatch_without_an_id_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse.parse_sbatch_parsable("Submitted batch job\n")


# ------------------------------------------- the recordings match today's commands


def as_recorded(argv: list[str], env: Mapping[str, str] | None) -> list[str]:
    """A command as the recordings hold it: the bare separators (the backend draws a token per
    command), squeue's format on the command line (the backend passes it in the environment)."""
    sep = parse.separators_of(argv, env)
    out = [a.replace(sep.fs, parse.FS).replace(sep.rs, parse.RS) for a in argv]
    spec = (env or {}).get(parse.SQUEUE_FORMAT_ENV)
    if spec is not None:
        out.append("--Format=" + spec.replace(sep.fs, parse.FS).replace(sep.rs, parse.RS))
    return out


class ReplayRunner:
    """Answers each command with the recorded output of the same argv, written with its separators."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.counter = CallCounter()

    def run(self, argv, *, timeout_s=None, env=None, user=None, input=None):  # type: ignore[no-untyped-def]
        self.counter.record(argv)
        sep, argv = parse.separators_of(argv, env), as_recorded(argv, env)
        name = f"{self.scenario}.{argv[0]}"
        # not splitlines(): it treats \x1e as a line break
        recorded = (DATA / f"{name}.argv").read_text().split("\n")[:-1]
        if argv[0] == "sacct":  # the window start differs per run
            argv = [a for a in argv if not a.startswith("--starttime=")]
            recorded = [a for a in recorded if not a.startswith("--starttime=")]
        assert argv == recorded or (argv[0] == "squeue" and before_arrays(argv) == recorded), \
            f"{name}: the backend no longer runs the recorded command"
        return CompletedRun(argv, sep.respell((DATA / f"{name}.txt").read_text()), "", 0, 0.01)


def before_arrays(argv: list[str]) -> list[str]:
    """The squeue command as it was before the array fields (the older recordings ran it):
    ``--array`` and no ArrayJobID/ArrayTaskID; today's parser reads its output as plain jobs."""
    fields = tuple(f for f in parse.SQUEUE_FIELDS if f not in parse.ARRAY_FIELDS)
    out = [a for a in argv if not a.startswith("--Format=")]
    return [*out[:2], "--array", *out[2:], f"--Format={parse.long_format(fields)}"]


@pytest.mark.parametrize("scenario", ["configuring", "requeued", "running", "preempted"])
def test_backend_replays_recorded_scenario(scenario: str) -> None:
    backend = CliBackend(ReplayRunner(scenario))
    assert backend.jobs()
    assert backend.history(since=datetime(2026, 11, 28, tzinfo=UTC))
    assert len(backend.nodes()) == 6
    assert backend.calls.snapshot() == {"squeue": 1, "sacct": 1, "sinfo": 1}


# ------------------------------------------- job arrays (the "arrays" recording)
def test_backend_replays_the_recorded_arrays() -> None:
    backend = CliBackend(ReplayRunner("arrays"))
    assert any(j.array_tasks for j in backend.jobs())
    assert backend.history(since=datetime(2026, 12, 1, tzinfo=UTC))
    assert CliBackend(ReplayRunner("arrays-tasks")).array_history([91])
    assert backend.calls.snapshot() == {"squeue": 1, "sacct": 1}


def test_squeue_lists_started_tasks_alone_and_the_waiting_ones_in_one_row() -> None:
    """Array 91 (1-9%3): 1 done, 3 failed, 4-6 started, 2 requeued after its node was reclaimed:
    squeue (without --array) lists it with the tasks not started yet, in one row, RestartCnt 0."""
    jobs = parse.parse_squeue(rec("arrays.squeue.txt"))
    tasks = {j.array_task: j for j in jobs if j.array_task is not None}
    assert sorted(tasks) == [1, 3, 4, 5, 6] and all(j.array_job_id == 91 for j in jobs)
    assert tasks[5].job_id == 96 and tasks[5].state is A.RUNNING and tasks[5].nodes == ["spot1"]
    (waiting,) = [j for j in jobs if j.array_tasks is not None]
    assert (waiting.job_id, waiting.array_tasks, waiting.restarts) == (91, "2,7-9", 0)
    assert waiting.state is A.PENDING and "BeginTime" in waiting.reason


def test_a_plain_job_has_no_array_fields() -> None:
    (job,) = [j for j in parse.parse_squeue(rec("configuring.squeue.txt")) if j.job_id == 4]
    assert job.array_job_id is None and job.array_task is None and job.array_tasks is None


def test_array_sacct_names_each_run_of_each_task() -> None:
    from broker.slurm.arrays import parse_array_sacct

    rows = parse_array_sacct(rec("arrays-tasks.sacct.txt"))
    by_task: dict[int, list[parse.SacctRow]] = {}
    for r in rows:
        assert r.array_id == 91
        by_task.setdefault(r.task, []).append(r.row)
    # The reclaimed task: its NODE_FAIL run (its own Slurm id, 93), then the run waiting to start.
    assert [(r.job_id, r.restarts, r.state_raw) for r in by_task[2]] == [(93, 0, "NODE_FAIL"), (93, 1, "PENDING")]
    assert by_task[2][0].state is A.RECLAIMED and by_task[2][0].elapsed_s == 7 and by_task[2][1].end is None
    assert (by_task[3][0].state_raw, by_task[3][0].exit_code) == ("FAILED", 2)
    assert by_task[1][0].state is A.COMPLETED and by_task[1][0].alloc_gpus == 4
    assert 7 not in by_task  # never started: nothing to charge


def test_array_option_takes_only_slurms_grammar() -> None:
    from broker.errors import SpecError
    from broker.slurm.arrays import array_option, parse_task_id

    assert array_option("1-40:2%8") == "--array=1-40:2%8"
    for bad in ("1-40;rm", "", "1-", "a-b", "1-4 --wrap=x"):
        with pytest.raises(SpecError):
            array_option(bad)
    assert parse_task_id("123_7") == (123, 7) and parse_task_id("123_[8-40]") is None and parse_task_id("5") is None
