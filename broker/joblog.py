"""A job's log file: its name, and making it as the user who submits.

The log is ``<workdir>/gbroker-<job name>-<6 random characters>.out``, made
with O_EXCL and mode 0600 before the job is queued (so `gbroker logs` has a
file to follow from the start, and nobody can plant one under that name).

Whoever makes it makes it as the job's owner: the client, which runs as the
submitting user, does (``create_own``) and names it in the submit request;
the daemon (as root) never opens it, it checks that the name is one this
module would make in the job's own workdir (``is_log_name``) and hands it to
Slurm, whose slurmd opens it as the user. A request without one (curl, an
older client) gets one made by the daemon as the user (``mktemp`` as them,
``broker.userfiles``), with the same template.

Reading it is ``open_log``: ``gbroker logs`` run by the owner opens it
directly; run by root (an admin) for another user's job, a child process
that has become the owner opens it and hands the descriptor back, so the
kernel checks the owner's rights, not root's. Either way it is opened with
O_NOFOLLOW and O_NONBLOCK and shown only when it is a regular file of the
job's owner: the owner may replace their log with a symlink to
/etc/shadow, a FIFO, a hard link to a file they cannot read, and root's
command must not print, hang on or flood the terminal with any of them.
``shown`` escapes the control characters a log may hold (a job that prints
ESC sequences would otherwise retitle or clear the reader's terminal).

Standard library only: the CLI imports it.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
import signal
import socket
import stat

SUFFIX = ".out"
RANDOM_CHARS = 6
_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_RANDOM_RE = re.compile(f"[{re.escape(_ALPHABET)}]{{{RANDOM_CHARS}}}")


def prefix(workdir: str, name: str) -> str:
    """The part of the path before the random characters."""
    return f"{workdir.rstrip('/')}/gbroker-{name}-"


def mktemp_template(workdir: str, name: str) -> str:
    """The same name as mktemp(1) wants it (``X``s for the random part; the suffix apart)."""
    return prefix(workdir, name) + "X" * RANDOM_CHARS


def is_log_name(path: str, workdir: str, name: str) -> bool:
    """Is ``path`` a log name made for job ``name`` in ``workdir``?"""
    head = prefix(workdir, name)
    return (path.startswith(head) and path.endswith(SUFFIX)
            and _RANDOM_RE.fullmatch(path[len(head):-len(SUFFIX)]) is not None)


def create_own(workdir: str, name: str, tries: int = 20) -> str:
    """Make the log as this process's user; its path. OSError when the user cannot
    (a directory that does not exist or is not theirs to write)."""
    for _ in range(tries):
        rand = "".join(_ALPHABET[b % len(_ALPHABET)] for b in os.urandom(RANDOM_CHARS))
        path = prefix(workdir, name) + rand + SUFFIX
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        os.close(fd)
        return path
    raise FileExistsError(f"no free log name after {tries} tries: {prefix(workdir, name)}*{SUFFIX}")


# -- reading a log, as its owner ---------------------------------------------------------------
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
"""Never through a symlink, never waiting on a FIFO's writer, never taking a terminal."""
OPEN_TIMEOUT_S = 10.0
"""How long the owner's child may take to open the log (a hung file system) before it is killed."""


class Unreadable(Exception):
    """The log is not shown: not a regular file of the job's owner, or not openable as them."""


def open_log(path: str, owner: str, owner_uid: int | None = None) -> int | None:
    """A descriptor of ``owner``'s job log at ``path``, checked; None while it does not exist.

    Opened as the owner: directly when this process is the owner (or not root:
    then the kernel checks this process's own rights), through a child that
    has become the owner when this process is root. Unreadable when the
    path is a symlink, not a regular file, or not the owner's.
    """
    who = _owner(owner, owner_uid)
    as_root_for_another = os.geteuid() == 0 and who.pw_uid != 0
    fd = _open_as(who, path) if as_root_for_another else _open(path)
    if fd is None:
        return None
    try:
        _check(fd, path, who)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _owner(owner: str, owner_uid: int | None) -> pwd.struct_passwd:
    try:
        return pwd.getpwuid(owner_uid) if owner_uid is not None else pwd.getpwnam(owner)
    except KeyError:
        raise Unreadable(f"the job's owner {owner} is not a user on this machine; its log is not read") from None


def _open(path: str) -> int | None:
    try:
        return os.open(path, OPEN_FLAGS)
    except OSError as exc:
        _refuse_unless_missing(exc, path)
        return None


def _refuse_unless_missing(exc: OSError, path: str) -> None:
    """Raise the Unreadable that says why ``path`` could not be opened, unless it does not exist yet."""
    if exc.errno == errno.ENOENT:
        return None
    if exc.errno == errno.ELOOP:
        raise Unreadable(f"{path} is a symbolic link; a job's log is read only as the file itself, never "
                         "through a link") from None
    raise Unreadable(f"cannot read {path}: {exc.strerror or exc}") from None


def _open_as(who: pwd.struct_passwd, path: str) -> int | None:
    """Open ``path`` in a child that has become ``who``; the child hands the descriptor back."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the child: become the owner, open, hand over, end
        code = 1
        try:
            mine.close()
            os.initgroups(who.pw_name, who.pw_gid)
            os.setgid(who.pw_gid)
            os.setuid(who.pw_uid)
            try:
                fd = os.open(path, OPEN_FLAGS)
            except OSError as exc:
                theirs.sendall(str(exc.errno).encode())
            else:
                socket.send_fds(theirs, [b"fd"], [fd])
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    try:
        return _receive(mine, pid, who, path)
    finally:
        mine.close()


def _receive(sock: socket.socket, pid: int, who: pwd.struct_passwd, path: str) -> int | None:
    sock.settimeout(OPEN_TIMEOUT_S)
    try:
        msg, fds, _flags, _addr = socket.recv_fds(sock, 64, 1)
    except TimeoutError:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise Unreadable(f"opening {path} as {who.pw_name} took more than {OPEN_TIMEOUT_S:g}s; "
                         "its file system may be hung") from None
    os.waitpid(pid, 0)
    if fds:
        for extra in fds[1:]:
            os.close(extra)
        return fds[0]
    if msg.isdigit():
        number = int(msg)
        _refuse_unless_missing(OSError(number, os.strerror(number)), path)
        return None
    raise Unreadable(f"could not become {who.pw_name} to read {path}")


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _check(fd: int, path: str, who: pwd.struct_passwd) -> None:
    """Refuse what is not a regular file of the job's owner (what the owner put there instead of the log)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        raise Unreadable(f"{path} is {kind}, not the job's log file; it is not read")
    if st.st_uid != who.pw_uid:
        raise Unreadable(f"{path} belongs to uid {st.st_uid}, not to the job's owner {who.pw_name}; "
                         "it is not the job's log and is not read")


# -- showing it on a terminal ------------------------------------------------------------------
_ESCAPED_CHARS = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\udc80-\udcff"
"""C0 and C1 controls but newline and tab; the bidirectional marks, embeddings, overrides and
isolates (a job could print text that reads one way and is another, as in "Trojan Source");
bytes that are not UTF-8."""
_SHOWN_AS_IS = re.compile(f"[^{_ESCAPED_CHARS}]*")
_ESCAPED = re.compile(f"[{_ESCAPED_CHARS}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code >= 0xDC80:  # a byte that is not UTF-8, kept by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` with its control characters escaped (ESC as ``\\x1b``, C1 as ``\\u009b``, a bidi
    override as ``\\u202e``, a byte that is not UTF-8 as ``\\xNN``); newlines and tabs stay.
    Decode with ``surrogateescape`` for the bytes."""
    if _SHOWN_AS_IS.fullmatch(text):
        return text
    return _ESCAPED.sub(_escape, text)
