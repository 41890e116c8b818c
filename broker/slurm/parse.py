"""Pure parsers for the machine-readable output of squeue, sacct, sinfo and sbatch.

Kept apart from the code that runs the commands so unit tests feed them
recorded real output. The formats they read are defined next to them
(``SQUEUE_FIELDS`` ...), using only fields and options that both Slurm
22.05 and 24.11 have.

Fields are separated by an ASCII unit separator (0x1F) and, where Slurm
lets us, records end with an ASCII record separator (0x1E). A job's name
and comment are whatever its owner wrote, and Slurm keeps them byte for
byte: ``|``, spaces, newlines and these very control characters. So the
commands that print them (squeue, sacct) are given ``Separators.fresh()``:
each separator followed by a random token drawn for that one command,
which no owner can know when naming a job. A name cannot then end a field
or a record early, and one user's job cannot print a record that reads as
another's. sacct ends its rows with a bare newline (it has no record
suffix), so its rows are counted by separators, not split at newlines
(``delimited_rows``). A record that does not parse is skipped with a warning
rather than guessed.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from broker.durations import parse_duration
from broker.slurm import hostlist, statemap
from broker.slurm.backend import NodeInfo, SacctRow, SlurmJob
from broker.slurm.partitions import PartitionInfo

log = logging.getLogger(__name__)

FS = "\x1f"  # field separator
RS = "\x1e"  # record separator (squeue/sinfo -O suffix on the last field)


@dataclass(frozen=True)
class Separators:
    """The field and record separators of one command's output."""

    fs: str = FS
    rs: str = RS

    @classmethod
    def fresh(cls) -> Separators:
        """FS and RS, each followed by 16 random hex digits drawn now, for one command."""
        token = secrets.token_hex(8)
        return cls(FS + token, RS + token)

    def respell(self, plain: str) -> str:
        """``plain`` output (written with the bare FS and RS, as recordings are) with these separators."""
        return plain.replace(RS, "\0").replace(FS, self.fs).replace("\0", self.rs)


PLAIN = Separators()
"""The bare separators: sinfo (whose fields are the admins' and Slurm's own) and recordings."""

SQUEUE_FORMAT_ENV = "SQUEUE_FORMAT2"
"""squeue reads its ``--Format`` from here: in the environment the token is not in the process's
command line, which every user of the machine can read in /proc while squeue runs."""


def separators_of(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Separators:
    """The separators a squeue or sacct command asks for (for programs that answer in Slurm's place)."""
    spec = (env or {}).get(SQUEUE_FORMAT_ENV, "")
    for a in argv:
        if a.startswith("--Format="):
            spec = a.removeprefix("--Format=")
        if a.startswith("--delimiter="):
            return Separators(a.removeprefix("--delimiter="), RS)
    m = re.search(f"{FS}([0-9a-f]*),", spec)
    return Separators(FS + m.group(1), RS + m.group(1)) if m else PLAIN

ARRAY_FIELDS: tuple[str, ...] = ("ArrayJobID", "ArrayTaskID")
"""squeue's fields of array tasks (``broker.slurm.arrays``), at the end of ``SQUEUE_FIELDS``."""
SQUEUE_FIELDS: tuple[str, ...] = (
    "JobID", "Name", "UserName", "Account", "Partition", "State", "Reason",
    "NodeList", "RestartCnt", "SubmitTime", "StartTime", "TimeLimit", "Comment",
    *ARRAY_FIELDS,
)  # fmt: skip
SACCT_FIELDS: tuple[str, ...] = (
    "JobIDRaw", "JobName", "User", "Account", "Partition", "State", "NodeList",
    "Submit", "Start", "End", "ElapsedRaw", "AllocTRES", "ExitCode", "Comment",
)  # fmt: skip
SINFO_FIELDS: tuple[str, ...] = (
    "NodeList", "StateComplete", "PartitionName", "Features", "Gres", "Reason",
)  # fmt: skip

GRES_USED_FIELDS: tuple[str, ...] = ("NodeList", "GresUsed")
"""``sinfo -N -O`` fields for the GPUs in use per node (``gpus_in_use``)."""

_NO_VALUE = frozenset({"", "n/a", "none", "unknown", "(null)", "null", "not_set", "invalid"})


def long_format(fields: tuple[str, ...], sep: Separators = PLAIN) -> str:
    """An ``-O/--Format`` spec: size 0 means "print it whole" (no padding, no cut)."""
    specs = [f"{name}:0{sep.fs}" for name in fields[:-1]] + [f"{fields[-1]}:0{sep.rs}"]
    return ",".join(specs)


def _text(value: str) -> str:
    return "" if value.strip().lower() in _NO_VALUE else value.strip()


def parse_time(value: str) -> datetime | None:
    """Slurm's ISO time (``SLURM_TIME_FORMAT=standard``, ``TZ=UTC``) -> aware UTC."""
    v = value.strip()
    if v.lower() in _NO_VALUE:
        return None
    try:
        parsed = datetime.fromisoformat(v)
    except ValueError:
        log.warning("unreadable Slurm time %r; treating it as unknown", value)
        return None
    if parsed.year < 1971:  # Slurm prints the epoch for "never"
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


def parse_duration_s(value: str) -> int | None:
    """``1-02:03:04`` / ``02:03:04`` / ``03:04`` / ``1-02`` / ``90`` (minutes) -> seconds.

    ``UNLIMITED``, ``NOT_SET``, ``INVALID`` and friends -> None. The grammar is
    ``broker.durations``'; fields past 59 are taken as they are, as Slurm does.
    """
    v = value.strip()
    if v.lower() in _NO_VALUE or v.upper() in ("UNLIMITED", "INFINITE", "PARTITION_LIMIT"):
        return None
    try:
        return parse_duration(v, strict=False)
    except ValueError as exc:
        raise ValueError(f"not a Slurm duration: {value!r} ({exc})") from None


def parse_exit_code(value: str) -> tuple[int, int]:
    """``"2:0"`` -> (2, 0): exit status and the signal that ended it."""
    v = value.strip()
    if not v or v.lower() in _NO_VALUE:
        return 0, 0
    code, _, sig = v.partition(":")
    return int(code or 0), int(sig or 0)


def parse_tres_gpus(tres: str) -> int:
    """GPUs in an AllocTRES string (``cpu=4,gres/gpu=4,...``); 0 if none."""
    plain = 0
    typed = 0
    for item in tres.split(","):
        key, _, val = item.partition("=")
        key = key.strip()
        if key == "gres/gpu":
            plain = int(val)
        elif key.startswith("gres/gpu:"):
            typed += int(val)
    return plain or typed


_PAREN = re.compile(r"\([^)]*\)")


def parse_gres_gpus(gres: str) -> int:
    """GPUs in a node's Gres (``gpu:4``, ``gpu:a100:4(S:0-1)``, ``(null)``)."""
    total = 0
    for item in _PAREN.sub("", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1].strip()
        if count.isdigit():
            total += int(count)
    return total


def _records(stdout: str, nfields: int, what: str, terminator: str, optional: int = 0,
             fs: str = FS) -> list[list[str]]:
    """The records of ``stdout``; the last ``optional`` fields may be missing (read as empty)."""
    out: list[list[str]] = []
    chunks = stdout.split(terminator)
    for chunk in chunks:
        rec = chunk.strip("\n")
        if not rec.strip():
            continue
        fields = rec.split(fs)
        if nfields - optional <= len(fields) < nfields:
            fields += [""] * (nfields - len(fields))
        if len(fields) != nfields:
            log.warning("skipping a %s record with %d fields (want %d): %r",
                        what, len(fields), nfields, rec[:200])  # fmt: skip
            continue
        out.append(fields)
    return out


def delimited_rows(stdout: str, nfields: int, what: str, fs: str) -> list[list[str]]:
    """The rows of ``sacct --parsable2 --delimiter=<fs>``, counted by separators.

    A row is ``nfields`` fields and ends with a newline; a field (a name, a comment) may
    hold newlines too. Split at ``fs``, the output is one token per field, except that a
    row's last field and the next row's first (JobIDRaw: digits) share one token, joined
    by the newline that ended the row: its last newline.
    """
    tokens = stdout.split(fs)
    if len(tokens) == 1:
        if tokens[0].strip():
            log.warning("skipping %s output without a single field separator: %r", what, stdout[:200])
        return []
    if (len(tokens) - 1) % (nfields - 1):
        log.error("%s printed %d separators, not a whole number of %d-field rows; reading none of it: %r",
                  what, len(tokens) - 1, nfields, stdout[:200])  # fmt: skip
        return []
    out: list[list[str]] = []
    first = tokens[0]
    for i in range(1, len(tokens), nfields - 1):
        *middle, tail = tokens[i:i + nfields - 1]
        if i + nfields - 1 == len(tokens):  # the last row
            last, nxt = tail.removesuffix("\n"), ""
        else:
            last, newline, nxt = tail.rpartition("\n")
            if not newline:
                log.error("%s rows do not line up at row %d; reading only the rows before it: %r",
                          what, len(out) + 1, tail[:200])  # fmt: skip
                return out
        out.append([first.lstrip("\n"), *middle, last])
        first = nxt
    return out


def parse_squeue(stdout: str, sep: Separators = PLAIN) -> list[SlurmJob]:
    """Output of ``squeue -h -O <long_format(SQUEUE_FIELDS, sep)>``."""
    jobs: list[SlurmJob] = []
    # The array fields came last, later: a listing without them (a recording) reads as plain jobs.
    for f in _records(stdout, len(SQUEUE_FIELDS), "squeue", sep.rs + "\n", optional=len(ARRAY_FIELDS), fs=sep.fs):
        (jid, name, user, account, part, state_raw, reason, nodelist,
         restarts, submit, start, limit, comment, array_jid, array_task) = f  # fmt: skip
        try:
            job_id = int(jid.strip())
        except ValueError:
            log.warning("skipping squeue record with job id %r", jid)
            continue
        state_raw = state_raw.strip()
        jobs.append(
            SlurmJob(
                job_id=job_id,
                name=name,
                user=user.strip(),
                account=_text(account),
                partition=part.strip(),
                state_raw=state_raw,
                state=statemap.job_state(state_raw),
                reason=_text(reason),
                nodes=hostlist.expand(nodelist.strip()),
                restarts=int(restarts.strip() or 0),
                comment="" if comment.strip() == "(null)" else comment,
                submit_time=parse_time(submit),
                start_time=parse_time(start),
                time_limit_s=parse_duration_s(limit),
                **array_fields(array_jid, array_task),
            )
        )
    return jobs


_ARRAY_TASKS = re.compile(r"\[?([0-9,:-]+)(?:%\d+)?\]?")


def array_fields(array_jid: str, array_task: str) -> dict[str, Any]:
    """squeue's ArrayJobID and ArrayTaskID: the array and the index of a task (or the indices of
    its tasks not started yet, ``5-29:2``); nothing for a plain job (ArrayTaskID N/A)."""
    task, jid = array_task.strip(), array_jid.strip()
    if task.isdigit() and jid.isdigit():
        return {"array_job_id": int(jid), "array_task": int(task)}
    m = _ARRAY_TASKS.fullmatch(task)
    if m is not None and jid.isdigit():
        return {"array_job_id": int(jid), "array_tasks": m.group(1)}
    return {}


def parse_sacct(stdout: str, fs: str = FS) -> list[SacctRow]:
    """Output of ``sacct -n -P --delimiter=<fs> -o <SACCT_FIELDS>`` (one row per attempt)."""
    return sacct_rows(delimited_rows(stdout, len(SACCT_FIELDS), "sacct", fs))


def sacct_rows(records: list[list[str]]) -> list[SacctRow]:
    """``SACCT_FIELDS`` records as rows, numbered per job (``number_attempts``)."""
    rows: list[SacctRow] = []
    for f in records:
        (jid, name, user, account, part, state_raw, nodelist, submit, start, end,
         elapsed, tres, exit_code, comment) = f  # fmt: skip
        try:
            job_id = int(jid.strip())
        except ValueError:
            log.debug("skipping sacct row for job id %r (array/het step)", jid)
            continue
        code, sig = parse_exit_code(exit_code)
        rows.append(
            SacctRow(
                job_id=job_id,
                name=name,
                user=user.strip(),
                account=_text(account),
                partition=part.strip(),
                state_raw=state_raw.strip(),
                state=statemap.job_state(state_raw),
                nodelist=hostlist.expand(nodelist.strip()),
                submit=parse_time(submit),
                start=parse_time(start),
                end=parse_time(end),
                elapsed_s=int(elapsed.strip() or 0),
                alloc_gpus=parse_tres_gpus(tres),
                exit_code=code,
                exit_signal=sig,
                comment="" if comment.strip() == "(null)" else comment,
            )
        )
    return number_attempts(rows)


def number_attempts(rows: list[SacctRow]) -> list[SacctRow]:
    """Set ``restarts`` to each row's index among the rows of its job id."""
    from dataclasses import replace

    epoch = datetime.min.replace(tzinfo=UTC)

    def key(r: SacctRow) -> tuple[int, datetime, datetime]:
        return (r.job_id, r.submit or epoch, r.start or epoch)

    seen: dict[int, int] = {}
    out: list[SacctRow] = []
    for row in sorted(rows, key=key):
        n = seen.get(row.job_id, 0)
        seen[row.job_id] = n + 1
        out.append(replace(row, restarts=n))
    return out


def parse_sinfo(stdout: str) -> list[NodeInfo]:
    """Output of ``sinfo -N -h -O <long_format(SINFO_FIELDS)>``, merged per node."""
    merged: dict[str, NodeInfo] = {}
    for f in _records(stdout, len(SINFO_FIELDS), "sinfo", RS + "\n"):
        name, state_raw, part, features, gres, reason = (x.strip() for x in f)
        parsed = statemap.parse_node_state(state_raw)
        part = part.rstrip("*")
        prev = merged.get(name)
        if prev is not None:
            if part and part not in prev.partitions:
                prev.partitions.append(part)
            continue
        merged[name] = NodeInfo(
            name=name,
            state_raw=state_raw,
            state=parsed.state,
            partitions=[part] if part else [],
            features=[x for x in _text(features).split(",") if x],
            gpus=parse_gres_gpus(gres),
            reason=_text(reason),
            flags=parsed.flags,
        )
    return list(merged.values())


def parse_gres_used(stdout: str) -> dict[str, int]:
    """Output of ``sinfo -N -h -O <long_format(GRES_USED_FIELDS)>``: node -> GPUs allocated now."""
    out: dict[str, int] = {}
    for f in _records(stdout, len(GRES_USED_FIELDS), "sinfo", RS + "\n"):
        name, used = (x.strip() for x in f)
        out[name] = max(out.get(name, 0), parse_gres_gpus(used))
    return out


def parse_sbatch_parsable(stdout: str) -> int:
    """``sbatch --parsable`` prints ``<jobid>`` or ``<jobid>;<cluster>``."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    head = line.split(";", 1)[0].strip()
    if not head.isdigit():
        raise ValueError(f"sbatch printed no job id: {stdout!r}")
    return int(head)


def parse_partitions(stdout: str) -> list[PartitionInfo]:
    """``scontrol --oneliner show partition``: one partition a line, ``Key=Value`` pairs.

    Only what an admin wrote in slurm.conf is there (no user's text), and no value has a
    space. A line without a name, or with a limit that does not read, is skipped with a warning.
    """
    out = []
    for line in stdout.splitlines():
        fields = dict(pair.partition("=")[::2] for pair in line.split())
        name = fields.get("PartitionName", "").strip()
        if not name:
            continue
        try:
            out.append(PartitionInfo(
                name=name,
                max_time_s=parse_duration_s(fields.get("MaxTime", "UNLIMITED")),
                max_nodes=_count(fields.get("MaxNodes", "UNLIMITED")),
                min_nodes=_count(fields.get("MinNodes", "0")) or 0,
                state=fields.get("State", "UP").strip().upper(),
            ))
        except ValueError as exc:
            log.warning("unreadable partition %s (%s); its limits are not used", name, exc)
    return out


def _count(value: str) -> int | None:
    """A node count of ``scontrol show partition``; UNLIMITED -> None."""
    v = value.strip()
    if v.upper() in ("UNLIMITED", "INFINITE") or v.lower() in _NO_VALUE:
        return None
    return int(v)
