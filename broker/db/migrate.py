"""Bring a database to the newest schema. The daemon calls ``upgrade_to_head`` at start.

Alembic is driven from Python (no alembic.ini needed); the URL goes to env.py
through ``Config.attributes`` so passwords with '%' survive. Two daemons
starting at once are safe: env.py takes a lock first (an advisory lock on
PostgreSQL, BEGIN IMMEDIATE on SQLite).
"""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL

from broker.db.engine import make_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Alembic's ``context`` and ``op`` are process-wide proxies: one migration run per process at a time.
_ALEMBIC_LOCK = threading.Lock()


def alembic_config(url: str | URL) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = url
    return cfg


def upgrade_to_head(url: str | URL) -> str:
    """Apply every migration not yet applied; returns the head revision."""
    cfg = alembic_config(url)
    with _ALEMBIC_LOCK:
        command.upgrade(cfg, "head")
    return head_revision()


def head_revision() -> str:
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None, "no migrations found"
    return head


def current_revision(url: str | URL) -> str | None:
    """The revision the database is at (None: never migrated)."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
