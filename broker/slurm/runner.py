"""The one door to Slurm (design principle 5).

Every Slurm command gbroker runs goes through :func:`run` (or a
:class:`Runner`): an argv list, never a shell string; a timeout; an error
that carries argv, exit code and stderr; and a counter so tests and
benchmarks can assert how many Slurm calls a reconcile tick costs.

A controller that does not answer raises :class:`SlurmUnavailable`, which
callers read as "state unknown", never as "job failed". A command that timed
out may still have happened (an sbatch may have queued its job): callers
find out by the intent key in the job comment, not by retrying blindly.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from broker import proc
from broker.errors import SlurmError, SlurmUnavailable

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_BIN_DIR = "/usr/bin"

# stderr fragments that mean "the controller (or slurmdbd) did not answer",
# as opposed to "Slurm answered no". Matched case-insensitively.
UNAVAILABLE_MARKERS: tuple[str, ...] = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "connection timed out",
    # scontrol's job updates (hold, release, requeue, update) report a dead
    # controller only as this protocol error.
    "unexpected message received",
    "communication connection failure",
    "zero bytes were transmitted or received",
    "transport endpoint is not connected",
    "slurm backup controller in standby mode",
    "problem talking to the database",
    "slurmdbd: unable to connect",
    "unable to connect to database",
    "error connecting to slurm",
    "controller is not responding",
)


@dataclass(frozen=True)
class CompletedRun:
    """What one Slurm command returned."""

    argv: list[str]
    stdout: str
    stderr: str
    returncode: int
    elapsed_s: float


@dataclass
class CallCounter:
    """Counts Slurm calls, in total and per command name.

    Not a global: each Runner owns one, so a test or benchmark reads (or
    resets) the counter of the backend it drives.
    """

    total: int = 0
    by_command: collections.Counter[str] = field(default_factory=collections.Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, argv: list[str]) -> None:
        name = os.path.basename(argv[0]) if argv else "?"
        with self._lock:
            self.total += 1
            self.by_command[name] += 1

    def reset(self) -> None:
        with self._lock:
            self.total = 0
            self.by_command.clear()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.by_command)


class RunFn(Protocol):
    """What a backend needs from the door; a fake in unit tests."""

    counter: CallCounter

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        input: str | None = None,
        cwd: str | None = None,
    ) -> CompletedRun: ...


def is_unavailable(stderr: str) -> bool:
    """True when stderr says the controller or database did not answer."""
    low = stderr.lower()
    return any(marker in low for marker in UNAVAILABLE_MARKERS)


def _last_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "error" in ln.lower() or "fatal" in ln.lower():
            return ln
    return lines[-1] if lines else ""


def _describe(argv: list[str]) -> str:
    return " ".join(argv[:3]) + (" ..." if len(argv) > 3 else "")


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every Slurm command starts from: fixed basics, the cluster's SLURM_CONF.

    Nothing else of the daemon's environment (passwords, tokens) and nothing a
    user wrote: Slurm's tools read their environment (SBATCH_*, SLURM_*), so
    only gbroker decides it.
    """
    env = {"PATH": proc.SAFE_PATH, "LANG": "C.UTF-8"}
    if os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    if extra:
        env.update(extra)
    return env


class Runner:
    """Runs Slurm commands by absolute path; owns the call counter."""

    def __init__(
        self,
        *,
        counter: CallCounter | None = None,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
        bin_dir: str = DEFAULT_BIN_DIR,
    ) -> None:
        self.counter = counter if counter is not None else CallCounter()
        self.default_timeout_s = default_timeout_s
        if not bin_dir.startswith("/"):
            raise ValueError(f"the Slurm bin directory must be absolute, not {bin_dir!r}")
        self.bin_dir = bin_dir

    def resolve(self, program: str) -> str:
        """'sbatch' -> '/usr/bin/sbatch': Slurm's commands come from the configured directory only."""
        if "/" in program:
            raise ValueError(f"Slurm commands are named, not given as paths: {program!r}")
        return os.path.join(self.bin_dir, program)

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        input: str | None = None,
        cwd: str | None = None,
    ) -> CompletedRun:
        """Run ``argv``; return its output or raise SlurmError / SlurmUnavailable.

        ``argv[0]`` is a Slurm command's name, run from the configured bin
        directory. ``env`` is the child's whole environment (None: the clean
        base of :func:`clean_env`), so a submitted job never sees the daemon's
        own variables by accident. ``user`` runs the command as that Unix user
        (only root may); the job sbatch creates then belongs to that user in
        Slurm. ``cwd`` is where it runs (default ``/`` for another user).
        """
        return self.start(argv, timeout_s=timeout_s, env=env, user=user, cwd=cwd,
                          stdin=input is not None).finish(input)

    def start(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        cwd: str | None = None,
        stdin: bool = True,
    ) -> RunningCommand:
        """Start ``argv`` as :meth:`run` does and return at once; the command waits for its
        input until :meth:`RunningCommand.finish` writes it (sbatch reads its script from
        stdin only after it has started up: that start-up can overlap the caller's work)."""
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError("argv must be a non-empty list of str")
        if any("\0" in a for a in argv):
            raise SlurmError("refusing to run a Slurm command with a NUL byte", argv=argv)
        timeout = self.default_timeout_s if timeout_s is None else timeout_s
        child_env = dict(clean_env() if env is None else env)
        ident = None
        if user is not None:
            ident = proc.identity(user)
            child_env.update(HOME=ident.home, USER=ident.name, LOGNAME=ident.name)
        full = [self.resolve(argv[0]), *argv[1:]]
        self.counter.record(argv)
        try:
            started = proc.start(full, env=child_env, timeout_s=timeout, user=ident, cwd=cwd, stdin=stdin)
        except proc.CommandNotRunnable as exc:
            raise _not_runnable(argv, full, cwd, exc) from None
        return RunningCommand(argv, full, started, timeout, user, cwd)


class RunningCommand:
    """A Slurm command started by :meth:`Runner.start`, waiting for its input."""

    def __init__(self, argv: list[str], full: list[str], started: proc.Started, timeout: float,
                 user: str | None, cwd: str | None) -> None:
        self.argv, self.full, self.started = argv, full, started
        self.timeout, self.user, self.cwd = timeout, user, cwd

    def abort(self) -> None:
        """Kill it before it got its input (an sbatch that never read its script queues nothing)."""
        self.started.abort()

    def finish(self, input: str | None = None) -> CompletedRun:
        """Give it its input; its output, or SlurmError / SlurmUnavailable as :meth:`Runner.run` raises."""
        argv, full, timeout, user, cwd = self.argv, self.full, self.timeout, self.user, self.cwd
        try:
            result = self.started.finish(None if input is None else input.encode())
        except proc.CommandNotRunnable as exc:
            raise _not_runnable(argv, full, cwd, exc) from None
        stdout, stderr = result.out, result.err
        log.debug(
            "slurm call %s rc=%s in %.3fs%s",
            _describe(argv),
            result.returncode,
            result.elapsed_s,
            f" as {user}" if user else "",
        )
        if result.timed_out:
            raise SlurmUnavailable(
                f"{argv[0]} did not answer within {timeout:g}s",
                argv=argv,
                returncode=None,
                stderr=stderr,
                hint="the Slurm controller may be down or overloaded; gbroker retries on the next tick",
            )
        if result.returncode != 0:
            name = argv[0]
            detail = _last_error_line(stderr) or f"exit code {result.returncode}"
            if is_unavailable(stderr):
                raise SlurmUnavailable(
                    f"{name}: Slurm did not answer: {detail}",
                    argv=argv,
                    returncode=result.returncode,
                    stderr=stderr,
                    hint="check that slurmctld (and slurmdbd for history) run; "
                    "gbroker treats jobs as unknown meanwhile",
                )
            raise SlurmError(
                f"{name} failed: {detail}",
                argv=argv,
                returncode=result.returncode,
                stderr=stderr,
            )
        return CompletedRun(argv, stdout, stderr, result.returncode or 0, result.elapsed_s)


def _not_runnable(argv: list[str], full: list[str], cwd: str | None, exc: proc.CommandNotRunnable) -> SlurmError:
    if exc.missing_cwd:
        return SlurmError(
            f"cannot run {argv[0]} in {cwd}: {exc.message}", argv=argv,
            hint="the directory must exist and be yours to enter",
        )
    return SlurmError(
        f"Slurm command {full[0]!r} not found or not executable",
        argv=argv,
        hint="install the Slurm client tools (slurm-client), or set slurm_bin_dir",
    )


def run(
    argv: list[str],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    user: str | None = None,
    input: str | None = None,
    counter: CallCounter | None = None,
) -> CompletedRun:
    """One Slurm command through the door; see :meth:`Runner.run`."""
    return Runner(counter=counter).run(argv, timeout_s=timeout_s, env=env, user=user, input=input)


__all__ = [
    "CallCounter",
    "CompletedRun",
    "RunFn",
    "Runner",
    "is_unavailable",
    "run",
]
