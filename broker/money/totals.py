"""Running totals for admission: what an account's jobs hold and their GPUs in flight, kept in memory.

Admission asks at every submission for the money the group's jobs still hold
(``budgets.holdings``) and their GPUs queued or running (``budgets.in_flight``).
Asked of the database, both add up every live job of the group, so each
submission cost more the longer the queue. Here they are asked once, kept, and
each plain submission adds its own job to them when its transaction commits:
an admission costs the same with 10,000 jobs queued as with 100.

The totals stay exact because they are the database's own figures plus only
what this process knows it wrote:

- every transaction of this process that writes and commits (or rolls back)
  makes all kept totals of its database stale (a generation count), unless it
  was declared one of two kinds: ``expect_job`` (the submit's intent: the
  totals gain exactly that job at commit) or ``unchanged`` (the submit's record
  of the Slurm id: admitted -> pending, nothing counted changes);
- totals read in a transaction are kept under the generation at its BEGIN, so a
  commit by anyone in between leaves them stale;
- a new process (a daemon restart) starts with none: they are read again from
  the database, which is the ledger's truth.

Only one daemon writes a database at a time (the lease, broker/daemon.py); a
writer in another process would not be seen here.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import Pool

from broker.money import budgets as B

_READS = ("SELECT", "BEGIN", "SAVEPOINT", "RELEASE")
"""Statements that change nothing (the BEGIN is the SQLite engine's own, broker/db/engine.py)."""


@dataclass
class _Kept:
    generation: int
    holdings: list[tuple[Any, ...]]
    flight: B.InFlight


@dataclass
class _Database:
    generation: int = 0
    """Made higher by every commit that changes what is kept otherwise than it was told."""
    committing: int = 0
    """Commits told of and not yet known to be made: nothing read meanwhile is kept."""
    kept: dict[str, _Kept] = field(default_factory=dict)


_lock = threading.Lock()
_databases: dict[str, _Database] = {}


def _db(conn: Connection) -> _Database:
    key = str(conn.engine.url)
    with _lock:
        return _databases.setdefault(key, _Database())


# -- what a transaction did -------------------------------------------------------
# SQLAlchemy tells of a commit just before the database makes it: what a reader that began
# meanwhile read may lack it. So a commit that changes the totals makes them stale twice: at
# the commit, and once it is made (when the connection goes back to the pool, or begins again).
_FLAGS = ("totals_gen", "totals_wrote", "totals_unchanged", "totals_job")


@event.listens_for(Engine, "begin")
def _on_begin(conn: Connection) -> None:
    _made(conn.info)
    db = _db(conn)
    conn.info["totals_gen"] = db.generation


@event.listens_for(Engine, "after_cursor_execute")
def _on_execute(conn: Connection, _cursor: Any, statement: str, *_: Any) -> None:
    if not statement.lstrip()[:9].upper().startswith(_READS):
        conn.info["totals_wrote"] = True


@event.listens_for(Engine, "commit")
def _on_commit(conn: Connection) -> None:
    info = conn.info
    db = _db(conn)
    job = info.get("totals_job")
    with _lock:
        db.committing += 1
        if job is not None and _add_job(db, *job):
            info["totals_made"] = (db, False)
        else:
            stale = job is not None or (info.get("totals_wrote") and not info.get("totals_unchanged"))
            if stale:
                db.generation += 1
            info["totals_made"] = (db, bool(stale))
    _end(info)


@event.listens_for(Engine, "rollback")
def _on_rollback(conn: Connection) -> None:
    info = conn.info
    if info.get("totals_wrote") or "totals_job" in info:
        db = _db(conn)
        with _lock:
            db.generation += 1
    _end(info)


@event.listens_for(Pool, "checkin")
def _on_checkin(_dbapi: Any, record: Any) -> None:
    if record is not None:
        _made(record.info)


def _made(info: dict[Any, Any]) -> None:
    """The commit told of at ``_on_commit`` is made: readers that began before now are stale."""
    made = info.pop("totals_made", None)
    if made is None:
        return
    db, stale = made
    with _lock:
        db.committing -= 1
        if stale:
            db.generation += 1


def _end(info: dict[Any, Any]) -> None:
    for flag in _FLAGS:
        info.pop(flag, None)


def _add_job(db: _Database, account: str, capacity: Any, partition: str, gpus: int, reserved: int) -> bool:
    """Add the committed submission's job to its account's kept totals; False when there are
    none, or they are stale (then the caller makes everything kept stale)."""
    kept = db.kept.get(account)
    if kept is None or kept.generation != db.generation:
        return False
    if any(row[0] is None for row in kept.holdings):
        kept.holdings = [(None, p, c, t, int(v) + reserved) if k is None else (k, p, c, t, v)
                         for k, p, c, t, v in kept.holdings]
    else:
        kept.holdings = [*kept.holdings, (None, None, None, None, reserved)]
    kept.flight = _with_gpus(kept.flight, capacity, partition, gpus)
    return True


def _with_gpus(flight: B.InFlight, capacity: Any, partition: str, gpus: int) -> B.InFlight:
    """``flight`` with ``gpus`` more at (capacity, partition): one row per place, as the database sums them."""
    rows: list[tuple[Any, str | None, int]] = []
    added = False
    for c, p, g in flight.rows:
        if not added and c == capacity and p == partition:
            rows.append((c, p, g + gpus))
            added = True
        else:
            rows.append((c, p, g))
    if not added:
        rows.append((capacity, partition, gpus))
    return B.InFlight(tuple(rows), flight.moving_off_ondemand)


# -- what admission asks ------------------------------------------------------------
def _kept(s: Session, account: str) -> _Kept:
    conn = s.connection()
    db = _db(conn)
    with _lock:
        kept = db.kept.get(account)
        if kept is not None and kept.generation == db.generation:
            return kept
    began_at = conn.info.get("totals_gen")
    fresh = _Kept(-1, B.holdings(s, account), B.in_flight(s, account))
    if began_at is None or conn.info.get("totals_wrote"):
        return fresh  # read with this transaction's own writes, or outside a known transaction
    with _lock:
        kept = db.kept.get(account)
        # Kept only when what was read is the committed state now: no commit since the BEGIN,
        # none under way, and no fresher totals kept meanwhile.
        if began_at == db.generation and not db.committing and (kept is None or kept.generation != began_at):
            fresh.generation = began_at
            db.kept[account] = fresh
    return fresh


def holdings(s: Session, account: str) -> list[tuple[Any, ...]]:
    """``budgets.holdings`` of the account, kept (see the module docstring)."""
    return _kept(s, account).holdings


def in_flight(s: Session, account: str) -> B.InFlight:
    """``budgets.in_flight`` of the account, kept (see the module docstring)."""
    return _kept(s, account).flight


def expect_job(s: Session, account: str, capacity: Any, partition: str, gpus: int, reserved_micros: int) -> None:
    """This transaction stores one plain job of the account, queued or running, holding
    ``reserved_micros`` and nothing charged, and writes nothing else that the totals count."""
    s.connection().info["totals_job"] = (account, capacity, partition, gpus, reserved_micros)


def unchanged(s: Session) -> None:
    """What this transaction writes changes none of the totals (a job admitted -> pending)."""
    s.connection().info["totals_unchanged"] = True
