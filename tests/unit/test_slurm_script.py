"""The batch script: golden files, quoting, refusals, and real signal forwarding under bash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.checkpoint import record_finished
from broker.errors import SpecError
from broker.slurm.script import HEADER, TIMED_OUT_EXIT, render_batch_script

DATA = Path(__file__).parent / "data" / "slurm"

HOSTILE_ARG = "it's; $(rm -rf /)"


def resume_script() -> str:
    return render_batch_script(
        job_id="j-000042",
        attempt=2,
        checkpoint_dir="/scratch/ck/j 42",
        command=["python3", "train.py", "--name", HOSTILE_ARG, "#SBATCH --partition=od"],
        resume_from="/scratch/ck/j 42/step-900",
        warning_signal_s=120,
    )


def test_golden_resumed_attempt() -> None:
    assert resume_script() == (DATA / "golden_resume.sh").read_text()


def test_golden_first_attempt_from_a_script_path() -> None:
    got = render_batch_script(
        job_id="j-000007",
        attempt=0,
        checkpoint_dir="/scratch/ck/j7",
        script_path="/home/alice/run.sh",
    )
    assert got == (DATA / "golden_first.sh").read_text()
    assert "export GBROKER_RESUME_FROM=/" not in got  # only set when Slurm restarted the job
    assert "/bin/bash /home/alice/run.sh &" in got


USER_SCRIPT = (
    "#!/bin/bash\n#SBATCH --partition=ondemand\n"
    "cat <<'EOF'\n'; rm -rf / #\nEOF\n"
    'echo "job=$GBROKER_JOB_ID attempt=$GBROKER_ATTEMPT script=$0"\n'
    "exit 4\n"
)


def test_golden_user_script_text() -> None:
    got = render_batch_script(
        job_id="j-000009",
        attempt=1,
        checkpoint_dir="/scratch/ck/j9",
        script_text='#!/bin/bash\n#SBATCH --partition=ondemand\necho "it\'s $GBROKER_JOB_ID"\n',
        warning_signal_s=90,
    )
    assert got == (DATA / "golden_script_text.sh").read_text()


def test_user_script_text_never_appears_in_clear() -> None:
    text = render_batch_script(
        job_id="j1", attempt=0, checkpoint_dir="/ck", script_text=USER_SCRIPT
    )
    assert "SBATCH" not in text and "rm -rf" not in text and "EOF" not in text


def test_a_command_naming_the_scripts_placeholders_runs_as_written() -> None:
    argv = ["echo", "__TRAPS__", "__RESUME__", "__STOPPED__", "__FINISHED__", "__TIMED_OUT__"]
    text = render_batch_script(job_id="j1", attempt=0, checkpoint_dir="/ck", command=argv)
    assert "setsid echo __TRAPS__ __RESUME__ __STOPPED__ __FINISHED__ __TIMED_OUT__ &\n" in text


def test_user_script_text_runs_with_its_own_status_and_is_cleaned_up(tmp_path: Path) -> None:
    batch = tmp_path / "batch.sh"
    batch.write_text(
        render_batch_script(
            job_id="j-5", attempt=2, checkpoint_dir=str(tmp_path / "ck"), script_text=USER_SCRIPT
        )
    )
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.run(
        ["/bin/bash", str(batch)], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 4
    out = [ln for ln in proc.stdout.splitlines() if not ln.startswith("=== gbroker:")]
    assert out[0] == "'; rm -rf / #"
    assert out[1].startswith("job=j-5 attempt=2 script=" + str(tmp_path / "gbroker-script."))
    assert not list(tmp_path.glob("gbroker-script.*"))  # the temporary copy is gone


def test_nothing_from_the_user_before_the_first_command() -> None:
    text = resume_script()
    lines = text.splitlines()
    first_cmd = next(i for i, ln in enumerate(lines) if ln.strip() and not ln.startswith("#"))
    assert "\n".join(lines[:first_cmd]) + "\n" == "\n".join(HEADER.splitlines()[:first_cmd]) + "\n"
    # no line of the script can be read by sbatch as a directive
    assert not any(ln.lstrip().startswith("#SBATCH") for ln in lines)


def test_user_values_are_quoted() -> None:
    text = resume_script()
    assert "'it'\"'\"'s; $(rm -rf /)'" in text
    assert "export GBROKER_CHECKPOINT_DIR='/scratch/ck/j 42'" in text
    assert "$(rm -rf /)' " in text  # inside single quotes, never bare


@pytest.mark.parametrize(
    "kwargs",
    [
        {"command": ["python3", "a\nb"]},
        {"command": ["python3", "a\0b"]},
        {"command": ["python3"], "checkpoint_dir": "/ck\n#SBATCH --partition=x"},
        {"command": ["python3"], "resume_from": "/ck/a\rb"},
        {"command": []},
        {"command": [""]},
        {"command": ["x"], "script_path": "/y"},
        {"script_text": "x", "script_path": "/y"},
        {"script_text": ""},
        {"script_text": "echo a\0b"},
        {},
        {"command": ["x"], "job_id": "a b"},
        {"command": ["x"], "job_id": "../x\n"},
        {"command": ["x"], "attempt": -1},
        {"command": ["x"], "warning_signal_s": -5},
    ],
)
def test_refusals(kwargs: dict) -> None:
    base = {"job_id": "j1", "attempt": 0, "checkpoint_dir": "/ck"}
    with pytest.raises(SpecError):
        render_batch_script(**{**base, **kwargs})


# ------------------------------------------------------------ running it for real

PROGRAM = r"""
import os, signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
mode = sys.argv[2]
got = []
def on(sig, frame):
    got.append(sig)
    log.write(f"got {signal.Signals(sig).name}\n")
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGTERM, on)
log.write(f"start {os.environ['GBROKER_JOB_ID']} {os.environ['GBROKER_ATTEMPT']} "
          f"{os.environ['GBROKER_CHECKPOINT_DIR']} {os.environ.get('GBROKER_RESUME_FROM', '-')}\n")
deadline = time.time() + 20
while time.time() < deadline:
    if mode == "exit-after-signal" and got:
        time.sleep(0.5)             # "checkpointing" takes a while after the signal
        log.write("checkpointed\n")
        sys.exit(7)
    if mode == "keep-going" and len(got) >= 2:
        log.write("two signals\n")
        sys.exit(0)
    if mode == "exit3":
        sys.exit(3)
    time.sleep(0.05)
sys.exit(99)
"""


def _start(
    tmp_path: Path, mode: str, resume: str | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    prog = tmp_path / "prog.py"
    prog.write_text(PROGRAM)
    log = tmp_path / "log.txt"
    ck = tmp_path / "ck dir"
    script = tmp_path / "batch.sh"
    script.write_text(
        render_batch_script(
            job_id="j-1",
            attempt=3,
            checkpoint_dir=str(ck),
            command=[sys.executable, str(prog), str(log), mode],
            resume_from=resume,
            warning_signal_s=60,
        )
    )
    with open(tmp_path / "script.out", "wb") as out:  # its notes, shown when a test fails
        proc = subprocess.Popen(["/bin/bash", str(script)], stdout=out, stderr=subprocess.STDOUT)
    _wait_for(log, "start")
    return proc, log


def _exit_status(proc: subprocess.Popen[bytes], tmp_path: Path, timeout: float = 15) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(
            f"the script ran on past {timeout} s; it said:\n{(tmp_path / 'script.out').read_text()}"
            f"\nthe program's log:\n{(tmp_path / 'log.txt').read_text()}"
        ) from None


def _wait_for(log: Path, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text():
            return
        time.sleep(0.02)
    raise AssertionError(
        f"{text!r} never appeared in {log}: {log.read_text() if log.exists() else ''}"
    )


def test_usr1_is_forwarded_and_the_script_waits_for_the_real_exit(tmp_path: Path) -> None:
    proc, log = _start(tmp_path, "exit-after-signal", resume="/ck/step-5")
    assert (tmp_path / "ck dir").is_dir()
    proc.send_signal(signal.SIGUSR1)
    code = _exit_status(proc, tmp_path)
    lines = log.read_text().splitlines()
    assert lines[0] == f"start j-1 3 {tmp_path / 'ck dir'} /ck/step-5"
    assert lines[1:] == ["got SIGUSR1", "checkpointed"], (tmp_path / "script.out").read_text()
    # The program ended badly (7) after the time-limit warning without asking to go on:
    # the script says it ran out of time (124), not that it failed.
    assert code == TIMED_OUT_EXIT


def test_a_signal_between_starting_the_program_and_learning_its_pid_is_sent_just_after(
        tmp_path: Path) -> None:
    """bash runs a trap between two commands; the one between `setsid … &` and `child=$!` saw no pid.

    A DEBUG trap (read from BASH_ENV before the script) signals the script at exactly that
    point. The signal used to be dropped: the program ran on to its end, and the job with it.
    """
    hook = tmp_path / "hook.sh"
    hook.write_text('trap \'[ "$BASH_COMMAND" = "child=\\$!" ] && kill -USR1 $$\' DEBUG\n')
    script = tmp_path / "batch.sh"
    script.write_text(render_batch_script(
        job_id="j-1", attempt=0, checkpoint_dir=str(tmp_path / "ck"),
        command=["sleep", "30"], warning_signal_s=60))
    env = dict(os.environ, BASH_ENV=str(hook))
    proc = subprocess.run(["/bin/bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=15, check=False)
    assert "SIGUSR1 (time-limit warning) sent to the job" in proc.stdout
    assert proc.returncode == TIMED_OUT_EXIT


def test_a_program_that_marked_its_work_done_is_not_out_of_time_when_the_warning_ends_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's agent dies of a warning that comes while it shuts down after its workers finished."""
    proc, _ = _start(tmp_path, "exit-after-signal")
    monkeypatch.setenv("GBROKER_ATTEMPT", "3")
    assert record_finished(tmp_path / "ck dir")  # as the program's rank zero does at its end
    assert (tmp_path / "ck dir" / ".gbroker-finished-3").exists()  # this attempt's mark
    proc.send_signal(signal.SIGUSR1)
    assert _exit_status(proc, tmp_path) == 0


def test_a_finished_mark_of_another_attempt_does_not_count(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path, "exit-after-signal")
    (tmp_path / "ck dir" / ".gbroker-finished-2").touch()
    proc.send_signal(signal.SIGUSR1)
    assert _exit_status(proc, tmp_path) == TIMED_OUT_EXIT


def test_term_is_forwarded_and_repeated_signals_keep_waiting(tmp_path: Path) -> None:
    proc, log = _start(tmp_path, "keep-going")
    proc.send_signal(signal.SIGUSR1)
    _wait_for(log, "got SIGUSR1")
    assert proc.poll() is None  # one signal: the program goes on, so does the script
    proc.send_signal(signal.SIGTERM)
    code = _exit_status(proc, tmp_path)
    assert log.read_text().splitlines()[1:] == ["got SIGUSR1", "got SIGTERM", "two signals"]
    assert code == 0


def test_exit_status_is_the_programs(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path, "exit3")
    assert _exit_status(proc, tmp_path) == 3


def test_program_killed_by_a_signal_reports_it(tmp_path: Path) -> None:
    proc, _ = _start(tmp_path, "keep-going")
    pgrep = subprocess.run(
        ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True, check=True
    )
    child = int(pgrep.stdout.split()[0])
    os.kill(child, signal.SIGKILL)
    assert _exit_status(proc, tmp_path) == 128 + signal.SIGKILL


@pytest.mark.parametrize("restarts,attempt,resume", [("", "3", ""), ("2", "5", "/ck/j")])
def test_a_slurm_requeue_numbers_the_attempt_and_resumes(tmp_path, restarts: str, attempt: str, resume: str) -> None:
    """Slurm reruns the same script after a node failure: attempt and resume path follow SLURM_RESTART_COUNT."""
    script = render_batch_script(
        job_id="j", attempt=3, checkpoint_dir=str(tmp_path / "ck" / "j"),
        command=["sh", "-c", 'echo "$GBROKER_ATTEMPT|${GBROKER_RESUME_FROM:-}"'],
    )
    env = dict(os.environ)
    env.pop("SLURM_RESTART_COUNT", None)
    if restarts:
        env["SLURM_RESTART_COUNT"] = restarts
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    (line,) = [ln for ln in out.splitlines() if not ln.startswith("=== gbroker:")]
    got_attempt, got_resume = line.split("|")
    assert got_attempt == attempt
    assert got_resume == (str(tmp_path / "ck" / "j") if resume else "")
