"""What every table shares: the declarative base with its naming convention, name lengths, the
append-only refusal. The table modules (models, ledger_models, node_models, ...) import this, never
each other's tables for it; ``broker.db.schema`` gathers them all on one metadata."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

from broker.db.types import UTCDateTime

# Stable constraint names, so later migrations (and SQLite batch moves) can name them.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

NAME_LEN = 64


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime()}  # noqa: RUF012 (SQLAlchemy reads it)


class AppendOnlyError(RuntimeError):
    """An append-only row (an event, a ledger line) was about to be changed or deleted."""
