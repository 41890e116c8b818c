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
import pwd
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from broker.errors import NotFound, PermissionDenied, SlurmError, SlurmUnavailable

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0

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


@dataclass(frozen=True)
class _Identity:
    uid: int
    gid: int
    groups: list[int]
    name: str
    home: str


def _identity(user: str) -> _Identity:
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise NotFound(
            f"no Unix user named {user!r} on this machine",
            hint="create the account (or fix the user name) before submitting as it",
        ) from None
    groups = sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid)))
    return _Identity(pw.pw_uid, pw.pw_gid, groups, pw.pw_name, pw.pw_dir)


def _describe(argv: list[str]) -> str:
    return " ".join(argv[:3]) + (" ..." if len(argv) > 3 else "")


class Runner:
    """Runs Slurm commands; owns the call counter."""

    def __init__(
        self,
        *,
        counter: CallCounter | None = None,
        default_timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.counter = counter if counter is not None else CallCounter()
        self.default_timeout_s = default_timeout_s

    def run(
        self,
        argv: list[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        user: str | None = None,
        input: str | None = None,
    ) -> CompletedRun:
        """Run ``argv``; return its output or raise SlurmError / SlurmUnavailable.

        ``env`` is the child's whole environment (None: inherit ours), so a
        submitted job never sees the daemon's own variables by accident.
        ``user`` runs the command as that Unix user (only root may); the job
        sbatch creates then belongs to that user in Slurm.
        """
        if not argv or not all(isinstance(a, str) for a in argv):
            raise TypeError("argv must be a non-empty list of str")
        if any("\0" in a for a in argv):
            raise SlurmError("refusing to run a Slurm command with a NUL byte", argv=argv)
        timeout = self.default_timeout_s if timeout_s is None else timeout_s
        child_env = dict(os.environ if env is None else env)
        run_uid: int | None = None
        run_gid: int | None = None
        run_groups: list[int] | None = None
        cwd: str | None = None
        if user is not None:
            ident = _identity(user)
            if os.geteuid() != ident.uid:
                if os.geteuid() != 0:
                    raise PermissionDenied(
                        f"cannot run Slurm commands as {user!r}: this process is not root",
                        hint="run the gbroker daemon as root, or act as yourself",
                    )
                run_uid, run_gid, run_groups = ident.uid, ident.gid, ident.groups
            child_env.update(HOME=ident.home, USER=ident.name, LOGNAME=ident.name)
            cwd = "/"

        self.counter.record(argv)
        start = time.monotonic()
        try:
            proc = subprocess.run(
                argv,
                input=input,
                capture_output=True,
                text=True,
                env=child_env,
                timeout=timeout,
                check=False,
                cwd=cwd,
                user=run_uid,
                group=run_gid,
                extra_groups=run_groups,
            )
        except subprocess.TimeoutExpired as exc:
            elapsed = time.monotonic() - start
            log.debug("slurm call %s timed out after %.3fs", _describe(argv), elapsed)
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise SlurmUnavailable(
                f"{os.path.basename(argv[0])} did not answer within {timeout:g}s",
                argv=argv,
                returncode=None,
                stderr=stderr,
                hint="the Slurm controller may be down or overloaded; gbroker retries on the next tick",
            ) from None
        except FileNotFoundError:
            raise SlurmError(
                f"Slurm command {argv[0]!r} not found",
                argv=argv,
                hint="install the Slurm client tools (slurm-client) or fix PATH",
            ) from None
        elapsed = time.monotonic() - start
        log.debug(
            "slurm call %s rc=%d in %.3fs%s",
            _describe(argv),
            proc.returncode,
            elapsed,
            f" as {user}" if user else "",
        )
        if proc.returncode != 0:
            name = os.path.basename(argv[0])
            detail = _last_error_line(proc.stderr) or f"exit code {proc.returncode}"
            if is_unavailable(proc.stderr):
                raise SlurmUnavailable(
                    f"{name}: Slurm did not answer: {detail}",
                    argv=argv,
                    returncode=proc.returncode,
                    stderr=proc.stderr,
                    hint="check that slurmctld (and slurmdbd for history) run; "
                    "gbroker treats jobs as unknown meanwhile",
                )
            raise SlurmError(
                f"{name} failed: {detail}",
                argv=argv,
                returncode=proc.returncode,
                stderr=proc.stderr,
            )
        return CompletedRun(argv, proc.stdout, proc.stderr, proc.returncode, elapsed)


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
