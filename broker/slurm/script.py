"""The batch script for one attempt of a job.

Slurm runs this script; it runs the user's program and stands between it and
Slurm's signals:

* The program runs in a process group of its own (``setsid``), so a signal
  reaches all of it: a bash job script, a launcher such as ``torchrun`` or
  ``accelerate launch``, and what they started in that group. For launchers
  that put their workers in sessions of their own, ``PET_SIGNALS_TO_HANDLE``
  makes torchrun's agent (which accelerate uses too) pass the warning on.
* The time-limit warning is asked for only when the job wants one
  (``--signal=B:<SIG>@<lead>``, sent to this shell) and forwarded to the
  whole group; TERM (Slurm stopping the job) is forwarded the same way. The
  job log gets a line for each signal sent, and for a program a signal ended.
  A signal that comes between starting the program and learning its pid
  (bash runs traps between commands) is sent just after, not dropped.
* ``wait`` returns early whenever a trapped signal arrives, so it is called
  again until the program's own exit status is known; then the script waits
  for the rest of the group (a trainer still saving after its wrapper died).
* The exit status says how the run ended, for gbroker: 75 (EX_TEMPFAIL) when
  the program saved and asks to go on in a new run (its own 75, or the mark
  gbroker's checkpoint callbacks leave when they stop on a signal, since
  launchers turn a worker's 75 into 1); 0 when it ended badly after the
  time-limit warning but had marked all its work done (a launcher the warning
  reached while it shut down); 124 when it ended badly after the
  time-limit warning (it ran out of time; not a failure to retry); else the
  program's own status.

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
from dataclasses import dataclass

from broker.checkpoint.manifest import FINISHED_MARKER, RESUME_EXIT, STOPPED_MARKER
from broker.errors import SpecError
from broker.spec import WARNING_SIGNALS, check_env_name

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

TIMED_OUT_EXIT = 124
"""The script's status for a program that ended badly after the time-limit warning (as timeout(1))."""

HEADER = """#!/bin/bash
# gbroker batch script. Generated; every Slurm option is given on the sbatch command line.
set -u
"""

RUNNER = r"""
note() { printf '=== gbroker: %s (%s) ===\n' "$*" "$(date -u +%Y-%m-%dT%H:%M:%SZ)"; }
note "job $GBROKER_JOB_ID attempt $GBROKER_ATTEMPT starts: Slurm job ${SLURM_JOB_ID:-?}, restart ${SLURM_RESTART_COUNT:-0}, on $(hostname)"

# Run the program in a process group of its own, so signals reach all of it.
child=0
interrupted=0
warned=0
early=""
# To the program's process group. Just after the start, setsid may not have made it yet (it
# runs in the child), and a signal sent to the child then can land before the child has
# dropped the script's traps, and be lost: wait for the group, up to a second.
send() {
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        kill -s "$1" -- "-$child" 2>/dev/null && return 0
        kill -0 "$child" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -s "$1" "$child" 2>/dev/null || true
}
forward() {
    interrupted=1
    if [ "$1" = "${GBROKER_WARNING_SIGNAL:-}" ]; then
        warned=1
    fi
    if [ "$child" -ne 0 ]; then
        note "SIG$1 ($2) sent to the job"
        send "$1"
    else
        # Between starting the program and learning its pid: sent just after.
        early="$1 $2"
    fi
}
__TRAPS__

setsid __COMMAND__ &
child=$!
if [ -n "$early" ]; then
    forward "${early%% *}" "${early#* }"
fi

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
# The rest of its group may still run: a trainer saving after the wrapper that started it died.
while kill -0 -- "-$child" 2>/dev/null; do
    sleep 1
done
if [ "$status" -gt 128 ]; then
    note "the program was ended by signal $((status - 128))"
fi
if [ "$status" -eq __RESUME__ ] || [ -e "$GBROKER_CHECKPOINT_DIR/__STOPPED__$GBROKER_ATTEMPT" ]; then
    note "the program saved and asks to go on in a new run"
    status=__RESUME__
elif [ "$warned" -eq 1 ] && [ "$status" -ne 0 ] && [ -e "$GBROKER_CHECKPOINT_DIR/__FINISHED__$GBROKER_ATTEMPT" ]; then
    note "the program had done all its work when the time-limit warning came (status $status): completed"
    status=0
elif [ "$warned" -eq 1 ] && [ "$status" -ne 0 ]; then
    note "the program ended (status $status) after the time-limit warning: it ran out of time"
    status=__TIMED_OUT__
fi
exit "$status"
"""
TRAP_LABELS = {"TERM": "Slurm stops the job"}


@dataclass(frozen=True)
class ArrayPart:
    """What a task of a job array needs: its chunk's last index and its sweep arguments, by task index."""

    step: int = 1
    lasts: tuple[tuple[int, int], ...] = ()
    """(first, last) of every chunk longer than one index; a task not named runs its own index alone."""
    sweep: tuple[tuple[int, tuple[str, ...]], ...] = ()
    """(task index, arguments) of a sweep: the arguments go after the command."""
    own_checkpoint: bool = False
    """Each piece saves in a directory of its own (``<dir>/piece-<N>``): pieces that checkpoint
    state; pieces of style "pieces" share the directory (their outputs are the checkpoint)."""


def array_lines(part: ArrayPart) -> list[str]:
    """Lines that set GBROKER_PIECE, _FIRST, _LAST, _STEP from Slurm's task index, and a sweep's arguments.

    Every value is a number or :func:`shlex.quote`-d; a sweep's arguments become
    the positional parameters (``set --``), so no line of a sweep file is ever
    read by a shell as code.
    """
    lines = [
        'export GBROKER_PIECE="${SLURM_ARRAY_TASK_ID:?not a task of a job array}"',
        'export GBROKER_PIECE_FIRST="$GBROKER_PIECE"',
        'export GBROKER_PIECE_LAST="$GBROKER_PIECE"',
        f"export GBROKER_PIECE_STEP={int(part.step)}",
    ]
    if part.own_checkpoint:
        lines.append('export GBROKER_CHECKPOINT_DIR="$GBROKER_CHECKPOINT_DIR/piece-$GBROKER_PIECE"')
        lines.append('mkdir -p -- "$GBROKER_CHECKPOINT_DIR"')
        lines.append('if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then export GBROKER_RESUME_FROM="$GBROKER_CHECKPOINT_DIR"; fi')
    if part.lasts:
        lines.append('case "$GBROKER_PIECE" in')
        lines.extend(f"    {int(first)}) GBROKER_PIECE_LAST={int(last)} ;;" for first, last in part.lasts)
        lines.append("esac")
    if part.sweep:
        lines.append("set --")
        lines.append('case "$GBROKER_PIECE" in')
        for index, args in part.sweep:
            quoted = " ".join(shlex.quote(_check("sweep argument", a)) for a in args)
            lines.append(f"    {int(index)}) set -- {quoted} ;;")
        lines.append("esac")
    return lines


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
    warning_signal: str = "USR1",
    env: Sequence[tuple[str, str]] = (),
    array: ArrayPart | None = None,
) -> str:
    """The bash script for one attempt.

    Exactly one program must be given: ``command`` (an argv list),
    ``script_path`` (a bash script on shared storage) or ``script_text``
    (the user's job script itself); scripts run with ``/bin/bash``.
    ``warning_signal_s`` (None: the job gets no warning) is exported as
    GBROKER_WARNING_SECONDS and ``warning_signal`` as GBROKER_WARNING_SIGNAL
    for the program's information; the signal itself is requested by the
    caller with sbatch ``--signal``. ``env`` is the job's own environment
    (name, value) pairs, exported here so it reaches the program and never
    sbatch itself. ``array`` makes it the script of every task of a job
    array (:func:`array_lines`).
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
    if not _JOB_ID.fullmatch(job):
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
    traps = {"TERM"}
    if warning_signal_s is not None:
        if isinstance(warning_signal_s, bool) or int(warning_signal_s) < 0:
            raise SpecError(f"warning signal seconds must be >= 0, got {warning_signal_s!r}")
        if warning_signal not in WARNING_SIGNALS:
            raise SpecError(f"not a warning signal: {warning_signal!r}")
        lines.append(f"export GBROKER_WARNING_SECONDS={int(warning_signal_s)}")
        lines.append(f"export GBROKER_WARNING_SIGNAL={warning_signal}")
        if warning_signal != "TERM":
            # torchrun's agent (and accelerate's, which is torchrun's) passes these on to its workers.
            lines.append(f"export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIG{warning_signal}")
        traps.add(warning_signal)
    lines.append('mkdir -p -- "$GBROKER_CHECKPOINT_DIR"')
    for name, value in env:
        check_env_name(name)
        if "\0" in value:
            raise SpecError(f"env.{name} contains a NUL byte")
        lines.append(f"export {name}={shlex.quote(value)}")
    lines.extend(prelude)
    if array is not None:
        lines.extend(array_lines(array))
    if argv:
        command_line = " ".join(shlex.quote(a) for a in argv)
    else:
        command_line = '/bin/bash "$script_file"'
    if array is not None and array.sweep:
        command_line += ' "$@"'
    trap_lines = "\n".join(
        f"trap 'forward {sig} \"{TRAP_LABELS.get(sig, 'time-limit warning')}\"' {sig}"
        for sig in sorted(traps, key=lambda x: (x == "TERM", x))
    )
    # The user's command goes in last, so no placeholder inside it is ever replaced.
    runner = (RUNNER.replace("__TRAPS__", trap_lines)
              .replace("__RESUME__", str(RESUME_EXIT)).replace("__TIMED_OUT__", str(TIMED_OUT_EXIT))
              .replace("__STOPPED__", STOPPED_MARKER)
              .replace("__FINISHED__", FINISHED_MARKER)
              .replace("__COMMAND__", command_line))
    return HEADER + "\n".join(lines) + "\n" + runner
