"""The one way providers run site commands: argv list, no shell, a timeout.

Errors carry argv, exit code and stderr so the operator can rerun the exact
command by hand.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.nodes.providers.base import ProviderCommandError

DEFAULT_TIMEOUT_SECONDS = 120
STDERR_TAIL_CHARS = 2000
"""Only the end of stderr goes into an error: the cause is usually last."""


@dataclass(frozen=True)
class CommandResult:
    argv: list[str]
    stdout: str
    stderr: str


def run_argv(
    argv: Sequence[str],
    *,
    stdin: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_SECONDS,
    env: Mapping[str, str] | None = None,
    what: str = "provider command",
) -> CommandResult:
    """Run ``argv`` (never through a shell); raise ProviderCommandError unless it exits 0.

    The command runs in its own session so a timeout kills everything it
    started, not just the first process.
    """
    argv = [str(a) for a in argv]
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise ProviderCommandError(
            f"{what} not found: {argv[0]}",
            argv=argv,
            returncode=None,
            stderr=str(exc),
            hint="check the path in the provider settings (use an absolute path)",
        ) from exc
    except PermissionError as exc:
        raise ProviderCommandError(
            f"{what} is not executable: {argv[0]}",
            argv=argv,
            returncode=None,
            stderr=str(exc),
            hint=f"chmod +x {argv[0]}, or put the interpreter first in the argv list",
        ) from exc
    try:
        stdout, stderr = proc.communicate(input=stdin, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        stdout, stderr = proc.communicate()
        raise ProviderCommandError(
            f"{what} timed out after {timeout_s:g} s: {' '.join(argv)}",
            argv=argv,
            returncode=None,
            stderr=(stderr or "")[-STDERR_TAIL_CHARS:],
            hint="the command must finish within the timeout; raise timeout_s or make it return "
            "once the request is accepted",
        ) from None
    if proc.returncode != 0:
        tail = (stderr or "").strip()[-STDERR_TAIL_CHARS:]
        raise ProviderCommandError(
            f"{what} failed with exit code {proc.returncode}: {' '.join(argv)}"
            + (f"\n  stderr: {tail}" if tail else ""),
            argv=argv,
            returncode=proc.returncode,
            stderr=tail,
            hint="run the command by hand to see the problem; it must exit 0 on success",
        )
    return CommandResult(argv=argv, stdout=stdout or "", stderr=stderr or "")


def _kill_session(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
