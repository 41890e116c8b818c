"""Database fixtures: every store test runs on SQLite and on a real PostgreSQL server.

The PostgreSQL server is started once per test session from the installed
binaries (initdb + pg_ctl into a temporary directory, as the ``postgres``
Unix user when the tests run as root), listens on a free port on 127.0.0.1,
and is stopped at the end. Each test gets a fresh database. If the server does
not start, the tests fail with its log: there is no skip.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

PG_USER = "postgres"
PG_START_TIMEOUT_S = 60


@dataclass
class PgServer:
    datadir: Path
    port: int
    run_as: dict[str, Any]
    bindir: Path

    def admin_url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg2://{PG_USER}@127.0.0.1:{self.port}/{dbname}"

    def admin_exec(self, sql: str) -> None:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user=PG_USER, dbname="postgres")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(sql)
        finally:
            conn.close()


def _pg_bindir() -> Path:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not candidates:
        pytest.fail("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin (apt-get install postgresql)")
    return Path(candidates[-1]).parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(argv: list[str], run_as: dict[str, Any], what: str, log: Path | None = None) -> None:
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=PG_START_TIMEOUT_S + 30, **run_as)
    if proc.returncode != 0:
        log_text = log.read_text(errors="replace") if log and log.exists() else "(no log)"
        pytest.fail(f"{what} failed ({proc.returncode}): {argv}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\n"
                    f"server log:\n{log_text}")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    bindir = _pg_bindir()
    root = Path(tempfile.mkdtemp(prefix="gbroker-pg-"))
    run_as: dict[str, Any] = {}
    if os.geteuid() == 0:  # postgres refuses to run as root
        pw = pwd.getpwnam(PG_USER)
        os.chown(root, pw.pw_uid, pw.pw_gid)
        run_as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [], "env": {"PATH": "/usr/bin:/bin"}}
    datadir, sockdir, log = root / "data", root / "sock", root / "server.log"
    server: PgServer | None = None
    try:
        _run([str(bindir / "initdb"), "-D", str(datadir), "-U", PG_USER, "-A", "trust", "-E", "UTF8",
              "--no-sync", "--no-instructions"], run_as, "initdb")
        _run(["mkdir", "-m", "0700", str(sockdir)], run_as, "mkdir socket dir")
        port = _free_port()
        with open(datadir / "postgresql.auto.conf", "a") as conf:
            conf.write(
                f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{sockdir}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 100\n"
            )
        _run([str(bindir / "pg_ctl"), "-D", str(datadir), "-l", str(log), "-w", "-t", str(PG_START_TIMEOUT_S),
              "start"], run_as, "pg_ctl start", log)
        server = PgServer(datadir=datadir, port=port, run_as=run_as, bindir=bindir)
        yield server
    finally:
        if server is not None:
            subprocess.run([str(bindir / "pg_ctl"), "-D", str(datadir), "-m", "immediate", "-w", "stop"],
                           check=False, capture_output=True, timeout=60, **run_as)
        shutil.rmtree(root, ignore_errors=True)


_db_numbers = itertools.count(1)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL to a fresh, empty database (no tables yet)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'state' / 'gbroker.db'}"
        return
    server: PgServer = request.getfixturevalue("pg_server")
    name = f"gbtest_{os.getpid()}_{next(_db_numbers)}"
    server.admin_exec(f'CREATE DATABASE "{name}"')
    yield server.admin_url(name)
    server.admin_exec(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def schema_templates() -> dict[str, str]:
    """Per backend, a database migrated to head once per session (filled when first needed)."""
    return {}


@pytest.fixture
def migrated_url(request: pytest.FixtureRequest, db_url: str, schema_templates: dict[str, str],
                 tmp_path_factory: pytest.TempPathFactory) -> str:
    """``db_url`` with every migration applied: a copy of a database migrated once per session
    (running the migrations costs a second or more a test; tests/unit/test_migrations.py runs
    them on fresh databases itself)."""
    from broker.db.migrate import upgrade_to_head

    if db_url.startswith("sqlite:///"):
        if "sqlite" not in schema_templates:
            template = tmp_path_factory.mktemp("schema") / "head.db"
            upgrade_to_head(f"sqlite:///{template}")
            with contextlib.closing(sqlite3.connect(template)) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            schema_templates["sqlite"] = str(template)
        path = Path(db_url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # private, as the engine makes it
        shutil.copyfile(schema_templates["sqlite"], path)
        return db_url
    server: PgServer = request.getfixturevalue("pg_server")
    if "postgres" not in schema_templates:
        template = f"gbtemplate_{os.getpid()}"
        server.admin_exec(f'CREATE DATABASE "{template}"')
        upgrade_to_head(server.admin_url(template))
        schema_templates["postgres"] = template
    template, name = schema_templates["postgres"], db_url.rsplit("/", 1)[1]
    server.admin_exec(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{template}'")
    server.admin_exec(f'DROP DATABASE "{name}"')
    server.admin_exec(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return db_url


@pytest.fixture
def engine(migrated_url: str) -> Iterator[Any]:
    from broker.db.engine import make_engine

    eng = make_engine(migrated_url)
    yield eng
    eng.dispose()


@pytest.fixture
def store(engine: Any) -> Any:
    """A sessionmaker on the migrated database; hand its sessions to ``broker.db.store`` functions."""
    from broker.db.engine import session_factory

    return session_factory(engine)


@pytest.fixture
def session(store: Any) -> Iterator[Any]:
    with store() as s:
        yield s


# --------------------------------------------------------------------------- lanes
LANE_ORDER = (
    # Measured seconds on 2 cores (--durations), longest first: xdist hands files out in
    # this order and the unit tests fill the gaps, so the lanes end close together. A file
    # missing here runs after these, before the unit tests.
    ("tests/integration/test_pools.py", 390),
    ("tests/integration/test_finetune_frameworks.py", 305),
    ("tests/integration/test_attacks.py", 300),
    ("tests/integration/test_broker_core.py", 290),
    ("tests/integration/test_budgets.py", 215),
    ("tests/integration/test_devcluster.py", 190),
    ("tests/integration/test_nodes.py", 160),
    ("tests/integration/test_array_jobs.py", 150),
    ("tests/integration/test_deadlines.py", 145),
    ("tests/integration/test_node_billing.py", 105),
    ("tests/integration/test_backend_contract.py", 95),
    ("tests/integration/test_operations.py", 95),
    ("tests/integration/test_dashboard.py", 50),
    ("tests/integration/test_job_resources.py", 30),
    ("tests/integration/test_http_api.py", 15),
    ("tests/frameworks/test_torchrun.py", 50),
    ("tests/frameworks/test_hf.py", 50),
    ("tests/frameworks/test_lightning.py", 40),
)
WHOLE_FILE_DIRS = ("tests/integration/", "tests/frameworks/")
"""Their files go first. Every file runs whole in one lane (``--dist loadfile``, in this
order: ``--no-loadscope-reorder``, else xdist puts the files with most tests first): its
module fixtures (a node daemon, switched cluster hooks, a moto server) and the cluster
state it changes belong to one lane's cluster."""


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Hand out the longest files first, then the unit tests (stable: file order is kept)."""
    rank = {path: i for i, (path, _seconds) in enumerate(LANE_ORDER)}
    whole = [i for i in items if _file_of(i).startswith(WHOLE_FILE_DIRS)]
    rest = [i for i in items if not _file_of(i).startswith(WHOLE_FILE_DIRS)]
    whole.sort(key=lambda i: rank.get(_file_of(i), len(rank)))
    items[:] = whole + rest
