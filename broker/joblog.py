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

Standard library only: the CLI imports it.
"""

from __future__ import annotations

import os
import re

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
