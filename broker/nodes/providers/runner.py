"""How providers run site commands: through ``broker.proc``, with provider errors.

``broker.proc`` gives the argv list (no shell), the deadline that kills the
command's whole session and the bound on its output. Here a command that
cannot start, runs out of time, prints too much or exits non-zero becomes a
ProviderCommandError carrying argv, exit code and stderr, so the operator
can rerun the exact command by hand.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker import proc
from broker.nodes.providers.base import ProviderCommandError

DEFAULT_TIMEOUT_SECONDS = 120
STDERR_TAIL_CHARS = 2000
"""Only the end of stderr goes into an error: the cause is usually last."""


@dataclass(frozen=True)
class CommandResult:
    argv: list[str]
    stdout: str
    stderr: str


def _text(data: bytes) -> str:
    """Output as text, with the newlines read as universal ones (``\\r\\n`` and ``\\r`` are ``\\n``)."""
    return data.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


def run_argv(
    argv: Sequence[str],
    *,
    stdin: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_SECONDS,
    env: Mapping[str, str] | None = None,
    what: str = "provider command",
    max_output: int = proc.DEFAULT_MAX_OUTPUT,
) -> CommandResult:
    """Run ``argv`` (never through a shell); raise ProviderCommandError unless it exits 0.

    The command gets the daemon's environment plus ``env`` (site commands
    need their cloud's credentials). It runs in its own session, so a
    timeout kills everything it started, not just the first process. Past
    ``max_output`` bytes on stdout or stderr it is stopped.
    """
    argv = [str(a) for a in argv]
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    try:
        result = proc.run(argv, env=full_env, timeout_s=timeout_s, max_output=max_output,
                          input=None if stdin is None else stdin.encode("utf-8"))
    except proc.CommandNotRunnable as exc:
        if exc.denied:
            raise ProviderCommandError(
                f"{what} is not executable: {argv[0]}",
                argv=argv,
                returncode=None,
                stderr=exc.os_error,
                hint=f"chmod +x {argv[0]}, or put the interpreter first in the argv list",
            ) from exc
        raise ProviderCommandError(
            f"{what} not found: {argv[0]}",
            argv=argv,
            returncode=None,
            stderr=exc.os_error,
            hint="check the path in the provider settings (use an absolute path)",
        ) from exc
    stdout, stderr = _text(result.stdout), _text(result.stderr)
    if result.timed_out:
        raise ProviderCommandError(
            f"{what} timed out after {timeout_s:g} s: {' '.join(argv)}",
            argv=argv,
            returncode=None,
            stderr=stderr[-STDERR_TAIL_CHARS:],
            hint="the command must finish within the timeout; raise timeout_s or make it return "
            "once the request is accepted",
        )
    if result.truncated:
        raise ProviderCommandError(
            f"{what} printed more than {max_output} bytes and was stopped: {' '.join(argv)}",
            argv=argv,
            returncode=None,
            stderr=stderr[-STDERR_TAIL_CHARS:],
            hint="a provider command prints a short answer (see docs/PROVIDERS.md); run it by hand to see why not",
        )
    if result.returncode != 0:
        tail = stderr.strip()[-STDERR_TAIL_CHARS:]
        raise ProviderCommandError(
            f"{what} failed with exit code {result.returncode}: {' '.join(argv)}"
            + (f"\n  stderr: {tail}" if tail else ""),
            argv=argv,
            returncode=result.returncode,
            stderr=tail,
            hint="run the command by hand to see the problem; it must exit 0 on success",
        )
    return CommandResult(argv=argv, stdout=stdout, stderr=stderr)
