"""Column types shared by the tables: tz-aware UTC datetimes, text and JSON that work alike on
Postgres and SQLite. SQLite stores naive datetimes (normalised to UTC on the way in and out);
Postgres text and jsonb refuse NUL, so every text and JSON column stores it as U+FFFD, on both
databases, whichever path wrote it (ORM, Core, COPY through `storage.repositories._sql`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeDecorator

NUL_REPLACEMENT = "\ufffd"
"""What a NUL (U+0000) is stored as: Postgres text and jsonb cannot hold it."""


def scrub_nul(value: Any) -> Any:
    """`value` with every NUL in its strings (dict keys and nested values too) as U+FFFD."""
    if isinstance(value, str):
        return value.replace("\x00", NUL_REPLACEMENT) if "\x00" in value else value
    if isinstance(value, dict):
        return {scrub_nul(k): scrub_nul(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub_nul(v) for v in value]
    return value


class UTCDateTime(TypeDecorator[datetime]):
    """Stores tz-aware datetimes as UTC; always returns tz-aware UTC datetimes."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class SafeText(TypeDecorator[str]):
    """Text with NUL stored as U+FFFD: the one type of every text column of the tables."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return scrub_nul(value)


JSONType = JSON().with_variant(JSONB(), "postgresql")
"""The DDL type of JSON columns (JSONB on Postgres); the migrations create columns with it."""


class SafeJSON(TypeDecorator[Any]):
    """JSON (JSONB on Postgres) whose strings store NUL as U+FFFD: the one type of every JSON
    column of the tables."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Any) -> Any:
        return dialect.type_descriptor(JSONB() if dialect.name == "postgresql" else JSON())

    def process_bind_param(self, value: Any, dialect: Any) -> Any:
        return scrub_nul(value)


def copy_value(column_type: Any, value: Any, dialect: Any) -> Any:
    """`value` as COPY writes it into a column of `column_type`: the type's own bind
    processing (NUL scrubbing, UTC), then JSON text for JSON columns."""
    if isinstance(column_type, TypeDecorator):
        value = column_type.process_bind_param(value, dialect)
    if isinstance(column_type, SafeJSON) and value is not None:
        return json.dumps(value)
    return value
