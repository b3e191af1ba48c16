"""Column types shared by the tables: tz-aware UTC datetimes, text and JSON that work alike on
Postgres and SQLite. SQLite stores naive datetimes (normalised to UTC on the way in and out);
Postgres text and jsonb refuse NUL, so every text and JSON column stores it as U+FFFD, on both
databases, whichever path wrote it (ORM, Core, COPY through `storage.repositories._sql`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
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


def _copy_json(value: Any) -> str | None:
    """JSON text of `value` with NUL as U+FFFD: serialised once, and scrubbed and serialised
    again only when the text holds an escaped NUL (json.dumps writes NUL as \\u0000)."""
    if value is None:
        return None
    text = json.dumps(value)
    return json.dumps(scrub_nul(value)) if "\\u0000" in text else text


def copy_converter(column_type: Any, dialect: Any) -> Callable[[Any], Any] | None:
    """How COPY writes a value into a column of `column_type`, as an INSERT would bind it: the
    type's own bind processing (NUL scrubbing, UTC), JSON as text; None for a value written
    as it is. Chosen once per column, not per value (COPY is the bulk path)."""
    if isinstance(column_type, SafeJSON):
        return _copy_json
    if isinstance(column_type, TypeDecorator):
        return lambda value: column_type.process_bind_param(value, dialect)
    return None
