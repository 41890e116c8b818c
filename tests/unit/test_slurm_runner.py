"""The one subprocess door: timeouts, errors that carry argv/exit/stderr, run-as-user, counting."""

from __future__ import annotations

import logging
import os
import pwd

import pytest

from broker.errors import NotFound, PermissionDenied, SlurmError, SlurmUnavailable
from broker.slurm.runner import CallCounter, Runner, is_unavailable, run

PY = "python3"
"""Commands are named, and run from the configured bin directory (/usr/bin by default)."""


def test_success_returns_output_and_elapsed() -> None:
    r = run([PY, "-c", "import sys; print('out'); print('err', file=sys.stderr)"])
    assert r.stdout == "out\n"
    assert r.stderr == "err\n"
    assert r.returncode == 0
    assert r.elapsed_s > 0


def test_input_goes_to_stdin() -> None:
    r = run([PY, "-c", "import sys; print(sys.stdin.read().upper())"], input="#!/bin/bash\n")
    assert r.stdout == "#!/BIN/BASH\n\n"


def test_nonzero_exit_raises_slurm_error_with_details() -> None:
    argv = [
        PY,
        "-c",
        "import sys; print('sbatch: error: invalid partition', file=sys.stderr); sys.exit(3)",
    ]
    with pytest.raises(SlurmError) as info:
        run(argv)
    err = info.value
    assert type(err) is SlurmError
    assert err.argv == argv
    assert err.returncode == 3
    assert "invalid partition" in err.stderr
    assert "invalid partition" in str(err)


@pytest.mark.parametrize(
    "stderr",
    [
        "squeue: error: Unable to contact slurm controller (connect failure)",
        "slurm_load_jobs error: Socket timed out on send/recv operation",
        (
            "sacct: error: slurm_persist_conn_open_without_init: failed to open persistent "
            "connection to host:localhost:6819: Connection refused"
        ),
        "sacct: error: Problem talking to the database: Connection refused",
        # recorded with the controller port dead: scontrol hold/release/requeue/update
        "Unexpected message received for job 99\nslurm_suspend error: Unexpected message received",
        "scancel: error: Kill job error on job id 99: Unable to contact slurm controller (connect failure)",
        "slurm_update error: Unable to contact slurm controller (connect failure)",
    ],
)
def test_controller_unreachable_raises_unavailable(stderr: str) -> None:
    argv = [PY, "-c", f"import sys; print({stderr!r}, file=sys.stderr); sys.exit(1)"]
    with pytest.raises(SlurmUnavailable) as info:
        run(argv)
    assert info.value.returncode == 1
    assert info.value.argv == argv


def test_unavailable_is_a_slurm_error_but_not_the_reverse() -> None:
    assert issubclass(SlurmUnavailable, SlurmError)
    assert not is_unavailable(
        "sbatch: error: Batch job submission failed: Invalid partition name specified"
    )


def test_timeout_raises_unavailable_quickly() -> None:
    with pytest.raises(SlurmUnavailable) as info:
        run([PY, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert info.value.returncode is None
    assert "did not answer within 0.5s" in str(info.value)


def test_missing_command_is_a_slurm_error_with_a_hint() -> None:
    with pytest.raises(SlurmError) as info:
        run(["no-such-squeue"])
    assert "slurm-client" in str(info.value)


def test_commands_come_from_the_bin_directory_never_a_path() -> None:
    with pytest.raises(ValueError):
        run(["/tmp/sbatch"])
    with pytest.raises(ValueError):
        Runner(bin_dir="usr/bin")
    r = Runner(bin_dir="/usr/bin").run(["sh", "-c", "echo $PATH"], env={"PATH": "/home/alice/evil"})
    assert r.stdout.strip() == "/home/alice/evil"  # the child's PATH is what the caller gave; sh itself was /usr/bin/sh


def test_no_shell_is_involved() -> None:
    r = run(["echo", "$HOME; rm -rf /", "`id`"])
    assert r.stdout == "$HOME; rm -rf / `id`\n"


def test_env_is_the_whole_child_environment() -> None:
    r = run([PY, "-c", "import os; print(sorted(k for k in os.environ if k.startswith('GBT_')))"],
            env={"GBT_ONLY": "1", "PATH": os.environ["PATH"]})  # fmt: skip
    assert r.stdout.strip() == "['GBT_ONLY']"


def test_counter_counts_every_call_including_failures() -> None:
    counter = CallCounter()
    runner = Runner(counter=counter)
    runner.run(["true"])
    runner.run(["true"])
    with pytest.raises(SlurmError):
        runner.run(["false"])
    assert counter.total == 3
    assert counter.snapshot() == {"true": 2, "false": 1}
    counter.reset()
    assert counter.total == 0 and counter.snapshot() == {}


def test_each_call_is_logged_at_debug_with_elapsed(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="broker.slurm.runner"):
        run(["true"])
    assert any("slurm call true rc=0 in" in r.getMessage() for r in caplog.records)


def test_user_runs_the_command_as_that_uid() -> None:
    # The suite runs as root (it starts Slurm); running as another user is what the daemon does.
    assert os.geteuid() == 0, "run the tests as root, as contrib/dev/test does"
    nobody = pwd.getpwnam("nobody")
    r = run(["id", "-u"], user="nobody")
    assert r.stdout.strip() == str(nobody.pw_uid)
    r = run(["sh", "-c", 'echo "$HOME $USER $(id -g)"'], user="nobody")
    assert r.stdout.split() == [nobody.pw_dir, "nobody", str(nobody.pw_gid)]


def test_unknown_user_is_not_found() -> None:
    with pytest.raises(NotFound):
        run(["true"], user="no-such-user-gbroker")


def test_non_root_cannot_switch_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 12345)
    with pytest.raises(PermissionDenied):
        run(["true"], user="nobody")


def test_nul_byte_is_refused_before_running() -> None:
    counter = CallCounter()
    with pytest.raises(SlurmError):
        Runner(counter=counter).run(["echo", "a\0b"])
    assert counter.total == 0
