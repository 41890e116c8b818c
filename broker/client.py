"""The socket client the CLI uses, and the typed Python client (``Client``).

Standard library only (the CLI must start fast). ``call`` sends one operation
and returns its plain answer; ``Client`` wraps the operations the CLI uses
(submit, status, history, show, cancel, logs, report) and returns dataclasses
(``Job``, ``Attempt``, ``Event``, ``SubmitResult``, ``Cancelled``, ``Report``:
immutable typed records), each keeping the daemon's answer in ``raw``.

Wire format: one JSON object per line. Request ``{"op": NAME, "args": {...}}``;
answer ``{"ok": true, "result": ...}`` or ``{"ok": false, "error": {...}}``.
The daemon learns who is calling from the kernel (SO_PEERCRED), so the request
carries no identity.

Two kinds of retry, both safe:

* a "busy" answer (the daemon serves as many of this user's requests as it
  allows) is retried for any request: it was not looked at;
* a lost answer (the connection closed, or the daemon restarted, after the
  request was sent) is retried only for requests that are safe to repeat:
  reads, and a submission, which carries its own idempotency key, so the
  repeat returns the job the first one made instead of a second job.
"""

from __future__ import annotations

import _socket  # the C module: socket.py's enum set-up costs the CLI milliseconds it need not spend
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, ClassVar

from broker.errors import BrokerError, DaemonUnavailable, SpecError

MAX_MESSAGE_BYTES = 2 * 1024 * 1024
"""The daemon's limit on one request (a job script is at most 1 MiB)."""
DEFAULT_TIMEOUT_SECONDS = 60.0
BUSY_RETRY_SECONDS = 30.0
"""How long a "busy" daemon is retried."""
LOST_ANSWER_RETRY_SECONDS = 90.0
"""How long a request that is safe to repeat is retried after its answer was lost."""


class RemoteError(BrokerError):
    """An error the daemon reported; keeps the daemon's exit code."""

    def __init__(self, kind: str, message: str, hint: str, exit_code: int) -> None:
        super().__init__(message, hint=hint or None)
        self.kind = kind
        self.exit_code = exit_code


class _LostAnswer(Exception):
    """The request was sent (or may have been); no answer came back."""


def call(
    socket_path: str,
    op: str,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    *,
    repeatable: bool = False,
    **args: Any,
) -> Any:
    """Send one request to the daemon and return its result (or raise its error).

    ``repeatable``: the request may be sent again when its answer was lost
    (reads; submissions with an idempotency key).
    """
    payload = (json.dumps({"op": op, "args": args}) + "\n").encode()
    if len(payload) > MAX_MESSAGE_BYTES:
        raise BrokerError(
            f"request too large ({len(payload)} bytes, at most {MAX_MESSAGE_BYTES})",
            hint="keep job scripts under 1 MiB; put large inputs in files",
        )
    start = time.monotonic()
    pause = 0.05
    sent_once = False
    while True:
        try:
            msg = _exchange(socket_path, payload, timeout, sent_once, op)
        except _LostAnswer as lost:
            sent_once = True
            if not repeatable or time.monotonic() - start > LOST_ANSWER_RETRY_SECONDS:
                raise DaemonUnavailable(
                    f"the gbroker daemon did not answer ({lost})",
                    hint="check `journalctl -u gbroker` or the daemon's log; the request may still "
                    "complete — run `gbroker status` before trying again",
                ) from None
        else:
            if msg.get("ok"):
                return msg.get("result")
            err = msg.get("error") or {}
            if err.get("type") != "Busy" or time.monotonic() - start > BUSY_RETRY_SECONDS:
                raise RemoteError(
                    err.get("type", "BrokerError"),
                    err.get("message", "unknown error"),
                    err.get("hint", ""),
                    int(err.get("exit_code", 1)),
                )
        import random

        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 2, 2.0)


def _check_server(sock: Any, socket_path: str) -> None:
    """The daemon is root's (the lab's) or the caller's own, as the kernel says (SO_PEERCRED):
    a socket someone else put in the caller's way (``/tmp/gbroker-UID`` made first by another
    user, while the lab's daemon was down) gets nothing, not a job script, not a command."""
    raw = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # struct ucred: pid, uid, gid
    uid = int.from_bytes(raw[4:8], sys.byteorder)
    if uid not in (0, os.geteuid()):
        raise DaemonUnavailable(
            f"{socket_path} is served by uid {uid}, neither root nor you; nothing was sent to it",
            hint="someone else's program may be listening there: use the lab's daemon "
            "(--socket /run/gbroker/gbroker.sock) and tell your admin",
        )


def _exchange(socket_path: str, payload: bytes, timeout: float, sent_before: bool, op: str) -> dict[str, Any]:
    """One connection: send, read the answer line. _LostAnswer once the request may have left."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        try:
            sock.connect(socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if sent_before:
                raise _LostAnswer(f"no daemon on {socket_path} after a restart") from None
            raise DaemonUnavailable(
                f"the gbroker daemon is not running (no answer on {socket_path}: {exc.strerror})",
                hint="start it with `gbroker daemon` (or `systemctl start gbroker`), "
                "or point --socket / GBROKER_SOCKET at the right socket. "
                + ("Nothing was submitted." if op == "submit" else "Nothing was sent to it."),
            ) from None
        except PermissionError:
            raise DaemonUnavailable(
                f"no permission to connect to {socket_path}",
                hint="ask an admin to make the socket world-connectable (mode 0666)",
            ) from None
        _check_server(sock, socket_path)
        try:
            try:
                sock.sendall(payload)
            except (BrokenPipeError, ConnectionResetError):
                # The daemon closed before reading: it refuses a connection over its limits
                # with an answer ("busy") and no read. That answer is still in our queue.
                sock.settimeout(1.0)
                if not (reply := _read_line(sock)):
                    raise
            else:
                reply = _read_line(sock)
        except TimeoutError:
            raise _LostAnswer(f"no answer within {timeout:.0f} s") from None
        except OSError as exc:
            raise _LostAnswer(f"connection lost: {exc.strerror or exc}") from None
    finally:
        sock.close()
    if not reply:
        raise _LostAnswer("it closed the connection without answering")
    try:
        msg = json.loads(reply)
    except json.JSONDecodeError:
        raise DaemonUnavailable("the daemon sent a malformed answer", hint="check the daemon log") from None
    if not isinstance(msg, dict):
        raise DaemonUnavailable("the daemon sent a malformed answer", hint="check the daemon log")
    return msg


def _read_line(sock: _socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n") or size > 64 * MAX_MESSAGE_BYTES:
            break
    return b"".join(chunks)


# -- the typed client ----------------------------------------------------------------------
# What the daemon answers, as small typed records. Each keeps the answer it was read from in
# ``raw`` (the CLI prints that for --json, so its JSON output is the daemon's own).


class _RecordType(type):
    """Makes a record class: its annotated fields become ``__slots__``, their values defaults.

    A dataclass or a NamedTuple generates and compiles code for each class, which
    every CLI command would pay at its start (about 0.3 ms a class); this costs none.
    """

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> _RecordType:
        fields = tuple(f for f in ns.get("__annotations__", {}) if not f.startswith("_"))
        ns["_defaults"] = {f: ns.pop(f) for f in fields if f in ns}
        ns["__slots__"] = fields
        ns["_fields"] = fields
        return super().__new__(mcs, name, bases, ns)


class Record(metaclass=_RecordType):
    """An immutable record: fields by keyword, compared and shown without ``raw``."""

    _fields: ClassVar[tuple[str, ...]]
    _defaults: ClassVar[dict[str, Any]]

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - set(self._fields)
        if unknown:
            raise TypeError(f"{type(self).__name__}: no field {', '.join(sorted(unknown))}")
        for name in self._fields:
            if name in values:
                value = values[name]
            elif name in self._defaults:
                value = self._defaults[name]
            else:
                raise TypeError(f"{type(self).__name__}: {name} is missing")
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, f) for f in self._fields if f != "raw")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields if f != "raw")
        return f"{type(self).__name__}({shown})"


def _malformed(what: str) -> DaemonUnavailable:
    return DaemonUnavailable(f"the daemon sent a malformed {what}",
                             hint="client and daemon versions may differ; check the daemon log")


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _malformed(what)
    return value


def _int(d: dict[str, Any], name: str, what: str) -> int:
    value = d.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _malformed(f"{what} ({name}: {str(value)[:40]!r})")
    return value


def _opt_int(d: dict[str, Any], name: str) -> int | None:
    value = d.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(d: dict[str, Any], name: str, default: str = "") -> str:
    value = d.get(name)
    return value if isinstance(value, str) else default


def _opt_str(d: dict[str, Any], name: str) -> str | None:
    value = d.get(name)
    return value if isinstance(value, str) else None


class Event(Record):
    """One entry of a job's event log."""

    at: str
    kind: str
    message: str
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, data: Any) -> Event:
        d = _dict(data, "event")
        return cls(at=_str(d, "at"), kind=_str(d, "kind"), message=_str(d, "message"), raw=d)


class Attempt(Record):
    """One run of a job on Slurm (a job has one per submission, retry, reclaim or move)."""

    number: int
    state: str
    slurm_job_id: int | None
    partition: str | None
    capacity: str | None
    nodes: str | None
    submitted_at: str | None
    started_at: str | None
    ended_at: str | None
    exit_code: int | None
    lost_s: int | None
    """Seconds of work lost since the last checkpoint (a reclaim, a failure)."""
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, data: Any) -> Attempt:
        d = _dict(data, "attempt")
        return cls(
            number=_int(d, "number", "attempt"), state=_str(d, "state"),
            slurm_job_id=_opt_int(d, "slurm_job_id"), partition=_opt_str(d, "partition"),
            capacity=_opt_str(d, "capacity"), nodes=_opt_str(d, "nodes"),
            submitted_at=_opt_str(d, "submitted_at"), started_at=_opt_str(d, "started_at"),
            ended_at=_opt_str(d, "ended_at"), exit_code=_opt_int(d, "exit_code"), lost_s=_opt_int(d, "lost_s"),
            raw=d,
        )


class Job(Record):
    """A job as ``status``/``history`` list it; ``show`` fills in attempts, events, log and array."""

    id: int
    key: str
    name: str
    kind: str
    owner: str
    owner_uid: int | None
    group: str
    state: str
    reason: str
    capacity: str | None
    partition: str | None
    policy: str | None
    reclaims: int
    failures: int
    attempt_count: int
    slurm_job_id: int | None
    """The latest attempt's Slurm job id."""
    deadline: str | None
    created_at: str | None
    finished_at: str | None
    age_s: int | None
    pieces: dict[str, Any] | None
    """An array's progress (``total``, ``counts``, ``line``); None for a plain job."""
    attempts: tuple[Attempt, ...] = ()
    """Every attempt, oldest first (``show`` only)."""
    events: tuple[Event, ...] = ()
    """The job's events, oldest first (``show`` only)."""
    log: str | None = None
    """The job's log file (``show`` only); read it as yourself (``Client.read_log``)."""
    array: dict[str, Any] | None = None
    """An array's pieces, each with its state and log (``show`` only)."""
    raw: dict[str, Any] = {}  # noqa: RUF012  (a default only; from_dict always passes the answer)

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @classmethod
    def from_dict(cls, data: Any) -> Job:
        d = _dict(data, "job")
        listed = d.get("attempts")
        detail = isinstance(listed, list)
        attempts = tuple(Attempt.from_dict(a) for a in listed) if isinstance(listed, list) else ()
        events = d.get("events")
        pieces, array = d.get("pieces"), d.get("array")
        return cls(
            id=_int(d, "id", "job"), key=_str(d, "key"), name=_str(d, "name"), kind=_str(d, "kind"),
            owner=_str(d, "owner"), owner_uid=_opt_int(d, "owner_uid"), group=_str(d, "group"),
            state=_str(d, "state"), reason=_str(d, "reason"), capacity=_opt_str(d, "capacity"),
            partition=_opt_str(d, "partition"), policy=_opt_str(d, "policy"),
            reclaims=_opt_int(d, "reclaims") or 0, failures=_opt_int(d, "failures") or 0,
            attempt_count=len(attempts) if detail else (_opt_int(d, "attempts") or 0),
            slurm_job_id=_opt_int(d, "slurm_job_id"), deadline=_opt_str(d, "deadline"),
            created_at=_opt_str(d, "created_at"), finished_at=_opt_str(d, "finished_at"),
            age_s=_opt_int(d, "age_s"), pieces=pieces if isinstance(pieces, dict) else None,
            attempts=attempts,
            events=tuple(Event.from_dict(e) for e in events) if isinstance(events, list) else (),
            log=_opt_str(d, "log"), array=array if isinstance(array, dict) else None, raw=d,
        )

    def log_for(self, piece: int | None = None) -> str:
        """Where the job's output is (``piece``: that array piece's); SpecError when none is recorded."""
        path = self.log if piece is None else self.piece_log(piece)
        if not path:
            raise SpecError(f"job {self.id} has no log recorded", hint="it was submitted before gbroker kept logs")
        return path

    def piece_log(self, piece: int) -> str:
        """The log of an array's piece (its GBROKER_PIECE); SpecError when there is no such piece."""
        if self.array is None:
            raise SpecError(f"job {self.id} is not an array", hint=f"gbroker logs {self.id} (without --piece)")
        for p in self.array.get("pieces") or []:
            if isinstance(p, dict) and p.get("piece") == piece and isinstance(p.get("log"), str):
                return str(p["log"])
        known = self.array.get("by_state") or {}
        raise SpecError(f"job {self.id} has no piece {piece}",
                        hint="its pieces: " + "; ".join(f"{k} {v}" for k, v in known.items()))


ENDED = frozenset({"completed", "failed", "cancelled", "timeout", "deadline_missed"})
JOB_STATES = ("admitted", "pending", "running", "completing", "recovering", "held", "unknown",
              "completed", "failed", "cancelled", "timeout", "deadline_missed")
"""Every state a job can be in (``broker.states.JobState``; a test keeps the two the same)."""
MAX_LIST = 10_000
"""The most jobs one ``list`` answers with."""
MAX_CANCEL = 1000
"""The most jobs one ``cancel`` request may name."""
"""Job states after which nothing more happens (``broker.states.TERMINAL``'s values)."""


class SubmitResult(Record):
    """What ``submit`` answered: the job as stored, its first Slurm job id (None: submitted later), a note,
    and cautions: values the request wrote that Slurm reads otherwise than people often mean
    (``time_limit = "1:30"`` is 90 seconds), taken as Slurm takes them."""

    job: Job
    slurm_job_id: int | None
    note: str | None
    cautions: tuple[str, ...] = ()
    raw: dict[str, Any]

    @property
    def id(self) -> int:
        return self.job.id

    @classmethod
    def from_dict(cls, data: Any) -> SubmitResult:
        d = _dict(data, "submit answer")
        said = d.get("cautions")
        cautions = tuple(c for c in said if isinstance(c, str)) if isinstance(said, list) else ()
        return cls(job=Job.from_dict(d), slurm_job_id=_opt_int(d, "slurm_job_id"), note=_opt_str(d, "note") or None,
                   cautions=cautions, raw=d)


class Plan(Record):
    """What ``plan`` answered (``gbroker submit --dry-run``): where the job would go and what it
    would cost, with the same checks as a submission; nothing was stored, reserved or queued.
    Money in integer micro-units: ``estimates_micros`` per capacity the job may run on (None: no
    price), ``budget_left_after_micros`` what the group's budget would have left (None: no budget)."""

    name: str
    pool: str
    partition: str
    capacity: str
    placed_by: str
    estimate_micros: int
    estimates_micros: dict[str, int | None]
    budget_left_after_micros: int | None
    slurm: str
    note: str | None
    cautions: tuple[str, ...] = ()
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        d = _dict(data, "plan answer")
        est = d.get("estimates_micros")
        estimates = {k: v for k, v in est.items() if isinstance(k, str) and (v is None or isinstance(v, int))} \
            if isinstance(est, dict) else {}
        budget = d.get("budget")
        said = d.get("cautions")
        return cls(
            name=_str(d, "name"), pool=_str(d, "pool"), partition=_str(d, "partition"),
            capacity=_str(d, "capacity"), placed_by=_str(d, "placed_by"),
            estimate_micros=_int(d, "estimate_micros", "plan answer"), estimates_micros=estimates,
            budget_left_after_micros=_opt_int(budget, "left_after_micros") if isinstance(budget, dict) else None,
            slurm=_str(d, "slurm"), note=_opt_str(d, "note") or None,
            cautions=tuple(c for c in said if isinstance(c, str)) if isinstance(said, list) else (), raw=d,
        )


class Cancelled(Record):
    """One job of a ``cancel``: its number and the state it is in now."""

    id: int
    state: str
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, data: Any) -> Cancelled:
        d = _dict(data, "cancel answer")
        return cls(id=_int(d, "id", "cancel answer"), state=_str(d, "state"), raw=d)


class ReportRow(Record):
    """One row of a spend report; money both exact (``*_micros``, integer micro-units) and as text."""

    key: str
    spend_micros: int
    spend: str
    gpu_seconds: int
    gpu_hours: str
    spot_share_pct: str
    saved_micros: int
    saved: str
    lost_micros: int
    lost: str
    lines: int
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, data: Any) -> ReportRow:
        d = _dict(data, "report row")
        return cls(
            key=_str(d, "key"), spend_micros=_int(d, "spend_micros", "report row"), spend=_str(d, "spend"),
            gpu_seconds=_opt_int(d, "gpu_seconds") or 0, gpu_hours=_str(d, "gpu_hours"),
            spot_share_pct=_str(d, "spot_share_pct"), saved_micros=_opt_int(d, "saved_micros") or 0,
            saved=_str(d, "saved"), lost_micros=_opt_int(d, "lost_micros") or 0, lost=_str(d, "lost"),
            lines=_opt_int(d, "lines") or 0, raw=d,
        )


class Report(Record):
    """A spend report for one semester, rows per group, user, kind, partition, pool or GPU type."""

    semester: str
    starts_at: str | None
    ends_at: str | None
    by: str
    rows: tuple[ReportRow, ...]
    total: ReportRow
    budgets: tuple[dict[str, Any], ...]
    """Per visible group: budget, spend, forecast (as the daemon answers them)."""
    visible: str | tuple[str, ...]
    """"all groups" (an admin) or the groups the caller sees."""
    raw: dict[str, Any]

    @classmethod
    def from_dict(cls, data: Any) -> Report:
        d = _dict(data, "report")
        rows, budgets, visible = d.get("rows"), d.get("budgets"), d.get("visible")
        if not isinstance(rows, list):
            raise _malformed("report (rows)")
        return cls(
            semester=_str(d, "semester"), starts_at=_opt_str(d, "starts_at"), ends_at=_opt_str(d, "ends_at"),
            by=_str(d, "by"), rows=tuple(ReportRow.from_dict(r) for r in rows),
            total=ReportRow.from_dict(d.get("total")),
            budgets=tuple(b for b in budgets if isinstance(b, dict)) if isinstance(budgets, list) else (),
            visible=visible if isinstance(visible, str) else tuple(str(v) for v in visible or ()),
            raw=d,
        )


class Client:
    """The daemon's operations as Python calls, with typed answers.

    ``Client()`` finds the socket as the CLI does (``GBROKER_SOCKET``, else the
    config file's ``socket``). Who you are is what the kernel says of this
    process; nothing here names a user. Errors are ``BrokerError``s
    (``RemoteError`` for what the daemon refused, with its exit code).

        from broker.client import Client
        c = Client()
        r = c.submit({"group": "vision", "time_limit": "2h", "command": ["python", "train.py"]})
        print(r.id, r.job.partition, r.slurm_job_id)
        for job in c.status():
            print(job.id, job.state)
    """

    def __init__(self, socket_path: str | None = None, *, config_path: str | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS, transport: Callable[..., Any] | None = None) -> None:
        self._socket = socket_path
        self.config_path = config_path
        self.timeout = timeout
        self._transport = transport
        """``transport(op, repeatable=..., **args)`` instead of ``call`` on the socket (the CLI
        passes its own, which knows the socket from its flags and the config file)."""

    @property
    def socket_path(self) -> str:
        if not self._socket:
            self._socket = os.environ.get("GBROKER_SOCKET") or None
        if not self._socket:
            import warnings

            from broker.config import client_socket, env_notes  # only when no socket is named: it is the slow part

            self._socket = client_socket(self.config_path)
            for note in env_notes():  # as the CLI: a mistyped GBROKER_SOCKET would send the calls elsewhere
                warnings.warn(note, UserWarning, stacklevel=2)
        return self._socket

    def call(self, op: str, *, repeatable: bool = False, **args: Any) -> Any:
        """Any operation by name, its plain answer (``repeatable``: safe to send again when the answer is lost)."""
        if self._transport is not None:
            return self._transport(op, repeatable=repeatable, **args)
        return call(self.socket_path, op, self.timeout, repeatable=repeatable, **args)

    # -- jobs -----------------------------------------------------------------------------
    def submit(self, spec: dict[str, Any], key: str | None = None) -> SubmitResult:
        """Submit a job spec (the fields of a job file; the daemon checks them again).

        ``key`` makes the submission idempotent: sending it again returns the first job.
        Without one a key is made here, so a retry after a lost answer (a daemon restart)
        still names the same job.
        """
        if key is not None and not key.strip():
            raise SpecError("the idempotency key is empty (an unset variable in --key \"$KEY\"?)",
                            hint="give a key (gb- and 8-40 lower-case letters or digits), or leave --key out")
        log = _own_log(spec)
        try:
            answer = self.call("submit", repeatable=True, spec=spec, key=key or new_key(),
                               **({"log": log} if log else {}))
            result = SubmitResult.from_dict(answer)
        except BaseException:
            _remove(log)  # refused: no job, so no log
            raise
        if log and result.raw.get("log") != log:
            _remove(log)  # the key's first submission made the job, with its own log
        return result

    def plan(self, spec: dict[str, Any]) -> Plan:
        """A dry run of ``submit``: the pool the job would go to, its cost on each capacity, what the
        group's budget would have left, and Slurm's pre-flight, with the same refusals a submission
        would meet (raised as they would be). Nothing is stored, reserved or queued."""
        return Plan.from_dict(self.call("plan", repeatable=True, spec=spec))

    def status(self, *, all_users: bool = False, limit: int = 200) -> list[Job]:
        """Your jobs that have not ended, newest first (``all_users``: everyone's, admins only)."""
        return self.jobs(active=True, all_users=all_users, limit=limit)

    def history(self, *, all_users: bool = False, limit: int = 50) -> list[Job]:
        """Your jobs, newest first, ended ones included."""
        return self.jobs(active=False, all_users=all_users, limit=limit)

    def jobs(self, *, active: bool, all_users: bool = False, limit: int = 200, user: str | None = None,
             group: str | None = None, state: str | None = None, partitions: list[str] | None = None) -> list[Job]:
        """Newest first, at most ``limit``: active ones, or all; ``state`` instead of ``active``;
        ``user`` (another user's: admins only), ``group`` and ``partitions``: only those
        (filtered by the daemon, so ``limit`` counts the jobs that match)."""
        filters = {k: v for k, v in (("user", user), ("group", group), ("state", state), ("partitions", partitions))
                   if v is not None}
        answer = self.call("list", repeatable=True, active=active, all_users=all_users, limit=limit, **filters)
        if not isinstance(answer, list):
            raise _malformed("job list")
        return [Job.from_dict(j) for j in answer]

    def show(self, job_id: int) -> Job:
        """One job with its attempts, events, log path and (an array) pieces."""
        return Job.from_dict(self.call("show", repeatable=True, job_id=job_id))

    def cancel(self, job_ids: int | list[int]) -> list[Cancelled]:
        """Cancel jobs (your own; admins: any). Not repeated on a lost answer: check with ``show``."""
        ids = [job_ids] if isinstance(job_ids, int) else list(job_ids)
        out = []
        for first in range(0, len(ids), MAX_CANCEL):  # the daemon takes so many per request
            answer = self.call("cancel", job_ids=ids[first:first + MAX_CANCEL])
            if not isinstance(answer, list):
                raise _malformed("cancel answer")
            out += [Cancelled.from_dict(c) for c in answer]
        return out

    def log_path(self, job_id: int, piece: int | None = None) -> str:
        """Where a job's (or an array piece's) output is; the daemon says where, you read it."""
        return self.show(job_id).log_for(piece)

    def logs(self, job_id: int, *, piece: int | None = None, attempt: int | None = None) -> str:
        """A job's output so far, read as its owner (``broker.joblog.open_log``: only a regular
        file of theirs, never through a link); ``attempt``: only that attempt's lines.
        Empty while the log does not exist yet."""
        from broker import joblog

        job = self.show(job_id)
        path = job.log_for(piece)
        try:
            fd = joblog.open_log(path, job.owner, job.owner_uid)
        except joblog.Unreadable as exc:
            raise SpecError(f"job {job_id}: {exc}", hint="only the job's owner's own log file is shown") from None
        except OSError as exc:
            raise SpecError(f"cannot read {path}: {exc.strerror or exc}",
                            hint="only the job's owner may read its log") from None
        if fd is None:
            return ""
        with os.fdopen(fd, "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
        if attempt is None:
            return text
        return "".join(attempt_lines(text.splitlines(keepends=True), attempt, shown=False)[0])

    # -- money ----------------------------------------------------------------------------
    def report(self, *, semester: str | None = None, by: str = "group") -> Report:
        """Spend for a semester (default: the one in force) by group, user, kind, partition, pool or gpu."""
        return Report.from_dict(self.call("report", semester=semester, by=by))

    def burndown(self, *, semester: str | None = None) -> dict[str, Any]:
        """Per group, the semester's spend over time with the forecast (plain data, for charts)."""
        return _dict(self.call("burndown", semester=semester), "burn-down")


def _own_log(spec: dict[str, Any]) -> str | None:
    """The job's log, made by this process (so as the user who submits; ``broker.joblog``).

    None when the spec does not say plainly where and under what name (the daemon
    then checks the spec and makes the log as the user itself). A workdir the user
    cannot write to is refused here, with the daemon's words."""
    from broker import joblog

    name, workdir = spec.get("name"), spec.get("workdir")
    if workdir is None:  # the daemon's default: the owner's home, as the password database says
        import pwd

        try:
            workdir = pwd.getpwuid(os.getuid()).pw_dir
        except KeyError:
            return None
    if not (isinstance(name, str) and isinstance(workdir, str) and workdir.startswith("/")
            and NAME_CHARS.issuperset(name) and 0 < len(name) <= 64 and not name.startswith("-")):
        return None
    try:
        return joblog.create_own(workdir, name)
    except OSError as exc:
        user = os.environ.get("USER") or str(os.getuid())
        raise SpecError(
            f"workdir {workdir}: cannot create the job's log there as {user} ({exc.strerror or exc})",
            hint="submit from a directory of yours, or set workdir to one you can write",
        ) from None


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
"""The letters of a job name (``broker.spec.NAME_RE``)."""


def _remove(path: str | None) -> None:
    if path:
        try:
            os.unlink(path)
        except OSError:
            pass


def new_key() -> str:
    """A fresh idempotency key (``gb-`` and 12 hex digits), as the daemon would make
    (``os.urandom``, what ``secrets.token_hex`` reads, without importing hashlib)."""
    return "gb-" + os.urandom(6).hex()


def attempt_of(line: str) -> int | None:
    """The attempt a batch script's start line names (``=== gbroker: job 7 attempt 2 starts: ...``)."""
    prefix = "=== gbroker: job "
    if not line.startswith(prefix):
        return None
    words = line[len(prefix):].split(" ", 4)
    if len(words) >= 4 and words[1] == "attempt" and words[2].isdigit() and words[3].startswith("starts"):
        return int(words[2])
    return None


def attempt_lines(lines: list[str], attempt: int | None, shown: bool) -> tuple[list[str], bool]:
    """The lines of ``attempt`` (None: all), and whether the next line is still its (``shown`` is that
    state at the first line): a log holds every attempt, each after its start line."""
    if attempt is None:
        return lines, True
    out = []
    for line in lines:
        started = attempt_of(line)
        if started is not None:
            shown = started == attempt
        if shown:
            out.append(line)
    return out, shown
