"""The one way gbroker runs another program: an argv list, never a shell.

Every child gets:

* an argv list (no shell, so no quoting mistakes) and an environment built by
  the caller (nothing of the daemon's leaks in by accident);
* a deadline, after which its whole session is killed (it runs in a session
  of its own, so nothing it started survives);
* bounded output: past ``max_output`` bytes on a stream the rest is dropped
  and the child killed, so a hostile or runaway program cannot fill the
  daemon's memory;
* optionally another identity: with ``user`` it runs as that Unix user, with
  the user's groups, from ``/`` (only root may ask), through setpriv(1), so the
  daemon is not forked whole for it. This is how the root
  daemon does what must be done as a user (principle 10): submit the user's
  job, look at the user's files.

Callers give the result its meaning: the Slurm door (``broker.slurm.runner``)
turns exit codes into SlurmError / SlurmUnavailable, the providers' site
commands (``broker.nodes.providers.runner``) into ProviderCommandError, alerts
and users' files into their own errors. Standard library only.
"""

from __future__ import annotations

import logging
import os
import pwd
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from broker.errors import BrokerError, NotFound, PermissionDenied

log = logging.getLogger(__name__)

DEFAULT_MAX_OUTPUT = 16 * 1024 * 1024
REAP_WAIT_S = 2.0
"""How long a killed child may take to die before it is left to a reaper thread: SIGKILL does
not end a process in uninterruptible sleep (a ``find`` in a directory on a hung NFS mount)."""
"""Bytes kept per stream by default; more is dropped and the child killed."""
USER_UMASK = 0o022
"""Programs run as a user get the usual umask, not the daemon's private 077 (sbatch passes
its umask on to the job, whose files the user and their group expect to read)."""
ENV_PROGRAM = "/usr/bin/env"
"""coreutils env(1), which enters a directory (--chdir) after the identity changed."""
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH for children that need one; never a user's."""
SETPRIV_PROGRAM = "/usr/bin/setpriv"
"""util-linux setpriv(1), which takes on a user's identity (real, effective and saved ids, the
groups; no capabilities left) and then executes the program. Through it the daemon starts a
child with vfork (Python forks the whole daemon when Popen itself must change the identity:
tens of milliseconds for a large, threaded process, and all of it under the daemon's lock-free
but CPU-bound load)."""


class CommandNotRunnable(BrokerError):
    """The program does not exist or may not be executed (or its directory cannot be entered)."""

    def __init__(self, message: str, argv: Sequence[str], *, hint: str | None = None,
                 missing_cwd: bool = False, denied: bool = False, os_error: str = "") -> None:
        super().__init__(message, hint=hint)
        self.argv = list(argv)
        self.missing_cwd = missing_cwd
        self.denied = denied
        """The program exists but may not be executed (else: it was not found)."""
        self.os_error = os_error
        """The operating system's own words, e.g. "[Errno 2] No such file or directory: '/x'"."""


@dataclass(frozen=True)
class Identity:
    """A Unix user as the system's user database knows it."""

    uid: int
    gid: int
    groups: tuple[int, ...]
    name: str
    home: str


def passwd_entry(user: str) -> pwd.struct_passwd:
    """The user's passwd entry (no group list); NotFound with a hint when there is no such user."""
    try:
        return pwd.getpwnam(user)
    except KeyError:
        raise NotFound(
            f"no Unix user named {user!r} on this machine",
            hint="create the account (or fix the user name) first",
        ) from None


def identity(user: str) -> Identity:
    """Look a user up, with the groups they are in; NotFound with a hint when there is no such user."""
    pw = passwd_entry(user)
    groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))))
    return Identity(pw.pw_uid, pw.pw_gid, groups, pw.pw_name, pw.pw_dir)


@dataclass(frozen=True)
class Result:
    """What a child did."""

    argv: list[str]
    returncode: int | None
    """None when it was killed at its deadline."""
    stdout: bytes
    stderr: bytes
    elapsed_s: float
    truncated: bool = False
    """Output went past the cap; the child was killed."""

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def err(self) -> str:
        return self.stderr.decode("utf-8", "replace")


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout_s: float,
    user: Identity | None = None,
    input: bytes | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
    cwd: str | None = None,
) -> Result:
    """Run ``argv`` to completion (or to its deadline) and return what it did.

    ``user`` runs it as that user (the caller must be root, or be that user);
    its working directory is then ``/`` unless ``cwd`` says otherwise.
    Raises CommandNotRunnable when the program cannot be started.
    """
    started = start(argv, env=env, timeout_s=timeout_s, user=user, max_output=max_output, cwd=cwd,
                    stdin=input is not None)
    return started.finish(input)


class Started:
    """A child that runs and waits for its input (``start``): ``finish`` gives it its input and
    collects what it did; ``abort`` kills it before it got any."""

    def __init__(self, proc: subprocess.Popen[bytes], args: list[str], started_at: float, timeout_s: float,
                 max_output: int, program: list[str] | None = None) -> None:
        self.proc, self.argv, self.started_at = proc, args, started_at
        self.timeout_s, self.max_output = timeout_s, max_output
        self.program = program or args
        """``argv`` without the identity switch in front (what the caller asked to run)."""
        self.done = False

    def finish(self, input: bytes | None = None) -> Result:
        """Write ``input`` (then end it), read the output to its end or the deadline, reap the child."""
        if self.done:
            raise RuntimeError("this child has finished already")
        self.done = True
        proc, args = self.proc, self.program
        # The deadline counts from here: the time the child waited for its input is the caller's.
        deadline = time.monotonic() + self.timeout_s
        stdout, stderr, truncated, timed_out = _pump(proc, input, deadline, self.max_output)
        code = None if timed_out or truncated else _wait(proc, deadline - time.monotonic())
        if code is None:  # past its deadline (its output ended, but it did not), or too much output
            timed_out = not truncated
            _kill_session(proc)
            code = _reap(proc, args)
        first = stderr.split(b"\n", 1)[0]
        if self.argv[0] == SETPRIV_PROGRAM and code in (126, 127) and first.startswith(b"setpriv: "):
            # setpriv could not take on the identity (127) or not execute the program (126, 127)
            why = first.decode("utf-8", "replace").removeprefix("setpriv: ")
            if "failed to execute" not in why:
                raise PermissionDenied(f"cannot run {os.path.basename(args[0])} as another user: {why}",
                                       hint="the gbroker daemon must run as root")
            if args[0] == ENV_PROGRAM:
                raise CommandNotRunnable(f"program {ENV_PROGRAM!r} not found", args, os_error=why,
                                         hint="install coreutils")
            denied = code == 126
            raise CommandNotRunnable(f"program {args[0]!r} " + ("may not be executed" if denied else "not found"),
                                     args, denied=denied, os_error=why,
                                     hint="check its permissions and the configured path" if denied
                                     else "install it, or fix the configured path")
        if args[0] == ENV_PROGRAM and code == 125 and b"env: cannot change directory" in first:
            why = stderr.decode("utf-8", "replace").strip().rsplit(": ", 1)[-1]
            raise CommandNotRunnable(why, args, missing_cwd=True, hint="the directory must exist and be enterable")
        return Result(args, None if timed_out or code is None else code, stdout, stderr,
                      time.monotonic() - self.started_at, truncated)

    def abort(self) -> None:
        """Kill the child (and its session) before it was given its input; reap it."""
        if self.done:
            return
        self.done = True
        _kill_session(self.proc)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
        _reap(self.proc, self.program)


def start(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout_s: float,
    user: Identity | None = None,
    max_output: int = DEFAULT_MAX_OUTPUT,
    cwd: str | None = None,
    stdin: bool = True,
) -> Started:
    """Start ``argv`` as ``run`` does, and return at once: the child starts up while the caller
    works, and blocks reading its input (``stdin``) until ``Started.finish`` writes it.

    The deadline (``timeout_s``) counts from ``finish``. Raises CommandNotRunnable when the
    program cannot be started.
    """
    args = [str(a) for a in argv]
    if not args or any("\0" in a for a in args):
        raise ValueError("argv must be a non-empty list without NUL bytes")
    uid: int | None = None
    gid: int | None = None
    groups: list[int] | None = None
    switch: list[str] = []
    if user is not None:
        if os.geteuid() != user.uid:
            if os.geteuid() != 0:
                raise PermissionDenied(
                    f"cannot run {os.path.basename(args[0])} as {user.name!r}: this process is not root",
                    hint="run the gbroker daemon as root, or act as yourself",
                )
            if os.path.exists(SETPRIV_PROGRAM):
                group_list = ",".join(str(g) for g in user.groups)
                switch = [SETPRIV_PROGRAM, f"--reuid={user.uid}", f"--regid={user.gid}",
                          f"--groups={group_list}" if group_list else "--clear-groups", "--"]
            else:
                uid, gid, groups = user.uid, user.gid, list(user.groups)
        if cwd not in (None, "/"):
            # Enter the directory as the user, not as root: Popen's cwd is entered
            # before the identity changes, which would let a user name a directory
            # only root may enter.
            args = [ENV_PROGRAM, f"--chdir={cwd}", "--", *args]
        cwd = "/"
    program = args
    args = [*switch, *args]
    begin = time.monotonic()
    try:
        proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            close_fds=True,
            umask=USER_UMASK if user is not None else -1,
            user=uid,
            group=gid,
            extra_groups=groups,
        )
    except OSError as exc:
        if cwd is not None and exc.filename == cwd:
            raise CommandNotRunnable(exc.strerror or str(exc), args, missing_cwd=True, os_error=str(exc),
                                     hint="the directory must exist and be enterable") from None
        if isinstance(exc, FileNotFoundError):
            raise CommandNotRunnable(f"program {args[0]!r} not found", args, os_error=str(exc),
                                     hint="install it, or fix the configured path") from None
        if isinstance(exc, PermissionError):
            raise CommandNotRunnable(f"program {args[0]!r} may not be executed", args, denied=True,
                                     os_error=str(exc),
                                     hint="check its permissions and the configured path") from None
        raise
    return Started(proc, args, begin, timeout_s, max_output, program)


def _pump(
    proc: subprocess.Popen[bytes], data: bytes | None, deadline: float, cap: int
) -> tuple[bytes, bytes, bool, bool]:
    """Feed stdin and collect stdout/stderr until EOF, the deadline or the cap."""
    out: dict[int, bytearray] = {}
    sel = selectors.DefaultSelector()
    assert proc.stdout is not None and proc.stderr is not None
    fo, fe = proc.stdout.fileno(), proc.stderr.fileno()
    for stream in (proc.stdout, proc.stderr):
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
        out[stream.fileno()] = bytearray()
    view = memoryview(data or b"")
    if proc.stdin is not None:
        os.set_blocking(proc.stdin.fileno(), False)
        if view:
            sel.register(proc.stdin, selectors.EVENT_WRITE)
        else:
            proc.stdin.close()
    truncated = False
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(out[fo]), bytes(out[fe]), truncated, True
            for key, _ in sel.select(timeout=min(left, 1.0)):
                if key.fileobj is proc.stdin:
                    try:
                        sent = os.write(key.fd, view[:65536])
                    except BrokenPipeError:
                        sent = len(view)
                    view = view[sent:]
                    if not view:
                        sel.unregister(key.fileobj)
                        proc.stdin.close()
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = out[key.fd]
                room = cap - len(buf)
                buf += chunk[:max(0, room)]
                if len(chunk) > room:
                    truncated = True
                    return bytes(out[fo]), bytes(out[fe]), True, False
    finally:
        sel.close()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()
    # Output ended; the child may still be finishing. It gets the rest of its time.
    try:
        proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(out[fo]), bytes(out[fe]), truncated, True
    return bytes(out[fo]), bytes(out[fe]), truncated, False


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """Its exit status, or None if it is still running after ``timeout_s``."""
    try:
        return proc.wait(timeout=max(0.0, timeout_s))
    except subprocess.TimeoutExpired:
        return None


def _reap(proc: subprocess.Popen[bytes], argv: Sequence[str]) -> int | None:
    """Wait up to ``REAP_WAIT_S`` for a killed child; past that, a daemon thread waits for it
    (no zombie is left) and the caller goes on: one stuck child never stops a tick."""
    code = _wait(proc, REAP_WAIT_S)
    if code is None:
        log.error("%s (pid %d) did not die of SIGKILL within %.0f s (uninterruptible sleep: a hung "
                  "file system?); left to a reaper thread", os.path.basename(argv[0]), proc.pid, REAP_WAIT_S)
        threading.Thread(target=proc.wait, name=f"gbroker-reap-{proc.pid}", daemon=True).start()
    return code


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
