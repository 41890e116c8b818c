"""Engines and sessions for SQLite (one host) and PostgreSQL (shared).

SQLite gets WAL (readers do not block the writer), a 20 s busy timeout (a
second process waits instead of failing at once), foreign keys on, and
real transactions: pysqlite would otherwise start them only at the first
write, which breaks SAVEPOINTs and makes read-then-write racy.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Engine, create_engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from broker.errors import ConfigError

SQLITE_BUSY_TIMEOUT_MS = 20_000
"""Writers queue behind each other; on a loaded 2-core machine twenty submissions and a tick
take more than 5 s to get through, and a submission should wait, not fail."""
SQLITE_BEGIN_OPTION = "gbroker_sqlite_begin"
"""Execution option naming the BEGIN a connection uses ("BEGIN IMMEDIATE" to take the write lock first)."""
ROOT_DB_PATH = Path("/var/lib/gbroker/gbroker.db")


def default_db_url(*, uid: int | None = None, env: Mapping[str, str] | None = None) -> str:
    """Where the database lives when nothing is configured.

    root: /var/lib/gbroker/gbroker.db; others: $XDG_STATE_HOME/gbroker/gbroker.db
    (XDG_STATE_HOME defaults to ~/.local/state), so a personal dev daemon needs no root.
    """
    uid = os.geteuid() if uid is None else uid
    env = os.environ if env is None else env
    if uid == 0:
        return f"sqlite:///{ROOT_DB_PATH}"
    state_home = env.get("XDG_STATE_HOME") or ""
    if not state_home.startswith("/"):  # the spec says: relative values are ignored
        state_home = str(Path(env.get("HOME") or Path.home()) / ".local" / "state")
    return f"sqlite:///{Path(state_home) / 'gbroker' / 'gbroker.db'}"


def sqlite_file(url: str | URL) -> Path | None:
    """The database file of a SQLite URL (None for memory databases and other backends)."""
    u = make_url(url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:" \
            or u.database.startswith("file:"):
        return None
    return Path(u.database).expanduser()


def check_private(url: str | URL) -> None:
    """Refuse a SQLite database (or its -wal/-shm) that every user may read or write.

    It holds every job's spec, environment included. Group access is the
    admin's choice (a group of lab admins); world access never is.
    """
    path = sqlite_file(url)
    if path is None:
        return
    for f in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        try:
            mode = f.stat().st_mode & 0o777
        except FileNotFoundError:
            continue
        if mode & 0o007:
            files = " ".join(str(x) for x in (path, f"{path}-wal", f"{path}-shm"))
            raise ConfigError(
                f"the database {f} is open to every user (mode {mode:04o}); it holds every job's "
                "spec and environment",
                hint=f"make it private, then start again: chmod 600 {files}",
            )


def make_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine for ``url``. A SQLite file is created private (0600, in a 0700 directory when
    the directory is new), whatever the umask; its -wal and -shm files take the same mode."""
    u = make_url(url)
    backend = u.get_backend_name()
    if backend == "sqlite":
        path = sqlite_file(u)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
            except FileExistsError:
                pass
        engine = create_engine(u, **kwargs)
        _sqlite_setup(engine)
        return engine
    if backend == "postgresql":
        if u.get_driver_name() not in ("psycopg2", ""):
            raise ValueError(f"unsupported PostgreSQL driver {u.drivername!r}; use postgresql+psycopg2://")
        kwargs.setdefault("pool_pre_ping", True)
        return create_engine(u.set(drivername="postgresql+psycopg2"), **kwargs)
    raise ValueError(f"unsupported database URL {u.render_as_string(hide_password=True)!r}: use sqlite:// or postgresql://")


def _sqlite_setup(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we emit BEGIN ourselves, below
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            _wal(cur)
            cur.execute("PRAGMA foreign_keys = ON")
            cur.execute("PRAGMA synchronous = NORMAL")  # safe with WAL; a crash loses at most the last commit
        finally:
            cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql(conn.get_execution_options().get(SQLITE_BEGIN_OPTION, "BEGIN"))


def _wal(cur: Any) -> None:
    """Switch the file to WAL (it stays so). SQLite does not call the busy handler
    for this switch, so two processes opening a new file at once retry here."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cur.execute("PRAGMA journal_mode")
            if str(cur.fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def session_factory(engine: Engine, *, readonly: bool = False) -> sessionmaker[Session]:
    """Sessions whose objects stay readable after commit (the daemon logs them afterwards).

    On SQLite a transaction that reads and then writes cannot wait for another
    writer (SQLite answers "database is locked" at once, in WAL mode), so
    write sessions take the write lock at BEGIN (BEGIN IMMEDIATE) and queue
    behind each other for up to the busy timeout. ``readonly=True`` sessions
    use a plain BEGIN and never block on a writer; do not write through them.
    """
    bind = engine
    if engine.dialect.name == "sqlite" and not readonly:
        bind = engine.execution_options(**{SQLITE_BEGIN_OPTION: "BEGIN IMMEDIATE"})
    return sessionmaker(bind=bind, expire_on_commit=False)
