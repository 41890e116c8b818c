"""Alembic environment for gbroker: SQLite and PostgreSQL, online and offline.

The URL comes from ``config.attributes["url"]`` (``broker.db.migrate``), else
from ``sqlalchemy.url`` in an ini file, else from $GBROKER_DB_URL. The whole
upgrade runs in one transaction behind a lock, so two daemons starting at the
same moment cannot both create the tables.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import text

from broker.db.engine import SQLITE_BEGIN_OPTION, make_engine
from broker.db.schema import metadata

# Any constant; it only has to be the same for every gbroker process.
PG_MIGRATION_LOCK_KEY = 0x6762726F6B6572  # "gbroker"

config = context.config
target_metadata = metadata


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or os.environ.get("GBROKER_DB_URL")
    if not url:
        raise RuntimeError("no database URL: pass one to broker.db.migrate.upgrade_to_head or set GBROKER_DB_URL")
    return str(url)


def run_offline() -> None:
    url = _url()
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.startswith("sqlite"),
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            is_sqlite = connection.dialect.name == "sqlite"
            if is_sqlite:
                # Batch migrations rebuild tables (copy, drop, rename); with foreign keys on,
                # dropping a referenced table fails or cascades. The pragma is ignored inside
                # a transaction, so switch it off on the raw connection first and check the
                # references once at the end instead.
                raw = connection.connection.driver_connection
                assert raw is not None
                raw.execute("PRAGMA foreign_keys = OFF")
                # Take the write lock at BEGIN: a second daemon waits here, then sees the new version.
                connection.execution_options(**{SQLITE_BEGIN_OPTION: "BEGIN IMMEDIATE"})
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_MIGRATION_LOCK_KEY})
                context.configure(
                    connection=connection,
                    target_metadata=target_metadata,
                    render_as_batch=is_sqlite,  # SQLite cannot ALTER most things; batch copies the table
                    compare_type=True,
                    transactional_ddl=True,
                )
                context.run_migrations()
                if is_sqlite:
                    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    if broken:
                        raise RuntimeError(f"migration left broken references (rolled back): {broken[:5]}")
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
