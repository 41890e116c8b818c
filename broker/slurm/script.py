"""The batch script for one attempt of a job.

Slurm runs this script; it runs the user's program in the background and
forwards the warning signal (USR1, asked for with ``--signal=B:USR1@<s>``)
and TERM to it, so the program can checkpoint before the node goes away.
It then waits until the program has really exited: ``wait`` returns early
whenever a trapped signal arrives, so it is called again until the
program's own exit status is known, and that status is the script's.

Safety rules:

* Every user value is quoted with :func:`shlex.quote`; nothing is
  interpolated raw. Values holding NUL or a newline are refused.
* Nothing from the user appears before the first command line: sbatch
  reads ``#SBATCH`` directives only up to there, and the header is fixed
  text, so a user value can never become a directive.
* A user's own job script (``script_text``) travels base64-encoded and is
  written to a private temporary file on the node, then run with bash: its
  ``#SBATCH`` lines are never seen by sbatch, and no line of it can end a
  here-document or break out of quoting.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Sequence

from broker.errors import SpecError
from broker.spec import check_env_name

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

HEADER = """#!/bin/bash
# gbroker batch script. Generated; every Slurm option is given on the sbatch command line.
set -u
"""

RUNNER = r"""
# Run the program in the background so this shell can forward signals to it.
child=0
interrupted=0
forward() {
    interrupted=1
    if [ "$child" -ne 0 ]; then
        kill -s "$1" "$child" 2>/dev/null || true
    fi
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

__COMMAND__ &
child=$!

# A trapped signal makes `wait` return early (status > 128) while the program
# still runs; wait again until it has really exited and keep its status.
status=0
while :; do
    interrupted=0
    wait "$child"
    rc=$?
    if [ "$rc" -eq 127 ] && [ "$status" -gt 128 ]; then
        rc=$status
    fi
    status=$rc
    if [ "$interrupted" -eq 1 ] && [ "$rc" -gt 128 ] && kill -0 "$child" 2>/dev/null; then
        continue
    fi
    if [ "$interrupted" -eq 1 ] && [ "$rc" -gt 128 ]; then
        # The program ended while we were forwarding; collect its real status.
        wait "$child" 2>/dev/null
        rc=$?
        if [ "$rc" -ne 127 ]; then
            status=$rc
        fi
    fi
    break
done
exit "$status"
"""


def _check(label: str, value: str) -> str:
    if "\0" in value or "\n" in value or "\r" in value:
        raise SpecError(
            f"{label} contains a NUL byte or a line break",
            hint="pass each argument as one line of text",
        )
    return value


def render_batch_script(
    *,
    job_id: str | int,
    attempt: int,
    checkpoint_dir: str,
    command: Sequence[str] | None = None,
    script_path: str | None = None,
    script_text: str | None = None,
    resume_from: str | None = None,
    warning_signal_s: int | None = None,
    env: Sequence[tuple[str, str]] = (),
) -> str:
    """The bash script for one attempt.

    Exactly one program must be given: ``command`` (an argv list),
    ``script_path`` (a bash script on shared storage) or ``script_text``
    (the user's job script itself); scripts run with ``/bin/bash``.
    ``warning_signal_s`` is exported as GBROKER_WARNING_SECONDS for the
    program's information; the signal itself is requested by the caller
    with sbatch ``--signal``. ``env`` is the job's own environment
    (name, value) pairs, exported here so it reaches the program and never
    sbatch itself.
    """
    given = [x for x in (command, script_path, script_text) if x is not None]
    if len(given) != 1:
        raise SpecError(
            "give exactly one of a command, a script path or a script",
            hint="a job runs one program",
        )
    prelude: list[str] = []
    if command is not None:
        argv = [_check("command argument", str(a)) for a in command]
        if not argv or not argv[0]:
            raise SpecError("the command is empty", hint="give the program to run")
    elif script_path is not None:
        argv = ["/bin/bash", _check("script path", script_path)]
    else:
        assert script_text is not None
        if "\0" in script_text or not script_text.strip():
            raise SpecError("the job script is empty or contains a NUL byte")
        payload = base64.b64encode(script_text.encode()).decode()
        prelude = [
            'script_file=$(mktemp "${TMPDIR:-/tmp}/gbroker-script.XXXXXX")',
            "trap 'rm -f -- \"$script_file\"' EXIT",
            f"printf '%s' {shlex.quote(payload)} | base64 -d > \"$script_file\"",
        ]
        argv = []
    job = str(job_id)
    if not _JOB_ID.match(job):
        raise SpecError(f"not a gbroker job id: {job!r}")
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise SpecError(f"attempt must be a non-negative integer, got {attempt!r}")
    _check("checkpoint directory", checkpoint_dir)
    if not checkpoint_dir:
        raise SpecError("the checkpoint directory is empty")

    # When Slurm requeues the job itself (a node failure on spot), the same
    # script runs again: SLURM_RESTART_COUNT tells which run this is, and the
    # broker numbers that run attempt + restarts.
    lines = [
        f"export GBROKER_JOB_ID={shlex.quote(job)}",
        f"export GBROKER_ATTEMPT=$(( {attempt} + ${{SLURM_RESTART_COUNT:-0}} ))",
        f"export GBROKER_CHECKPOINT_DIR={shlex.quote(checkpoint_dir)}",
    ]
    if resume_from is not None:
        lines.append(
            f"export GBROKER_RESUME_FROM={shlex.quote(_check('resume path', resume_from))}"
        )
    else:
        lines.append(
            'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then '
            'export GBROKER_RESUME_FROM="$GBROKER_CHECKPOINT_DIR"; fi'
        )
    if warning_signal_s is not None:
        if isinstance(warning_signal_s, bool) or int(warning_signal_s) < 0:
            raise SpecError(f"warning signal seconds must be >= 0, got {warning_signal_s!r}")
        lines.append(f"export GBROKER_WARNING_SECONDS={int(warning_signal_s)}")
    lines.append('mkdir -p -- "$GBROKER_CHECKPOINT_DIR"')
    for name, value in env:
        check_env_name(name)
        if "\0" in value:
            raise SpecError(f"env.{name} contains a NUL byte")
        lines.append(f"export {name}={shlex.quote(value)}")
    lines.extend(prelude)
    if argv:
        command_line = " ".join(shlex.quote(a) for a in argv)
    else:
        command_line = '/bin/bash "$script_file"'
    return HEADER + "\n".join(lines) + "\n" + RUNNER.replace("__COMMAND__", command_line)
