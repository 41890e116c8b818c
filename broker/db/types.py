"""Column types that keep Python values honest across SQLite and PostgreSQL.

SQLite has no time zones and no enums: ``UTCDateTime`` stores UTC and always
hands back an aware UTC datetime; ``EnumText`` stores an enum's value as text
and hands back the enum member, so state strings are never spelled outside
``broker.states``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from typing import Any, Generic, TypeVar

from sqlalchemy import DateTime, String
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

E = TypeVar("E", bound=Enum)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware datetime, stored as UTC. Naive datetimes are refused."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware time (clock.now())")
        value = value.astimezone(UTC)
        # SQLite stores text; drop the offset so every stored value sorts the same way.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class EnumText(TypeDecorator[E], Generic[E]):
    """An enum stored as its value in a VARCHAR (no native enum: adding a state needs no DDL)."""

    impl = String
    cache_ok = True

    def __init__(self, enum_cls: type[E], length: int = 20) -> None:
        super().__init__(length)
        self.enum_cls = enum_cls
        self.length = length

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        # Accept the member or its exact value; anything else is a bug upstream.
        return str(self.enum_cls(value).value)

    def process_result_value(self, value: Any, dialect: Dialect) -> E | None:
        if value is None:
            return None
        return self.enum_cls(value)

    def copy(self, **kw: Any) -> EnumText[E]:
        return EnumText(self.enum_cls, self.length)
