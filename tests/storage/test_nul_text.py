"""NUL at the storage boundary: every text and JSON column stores NUL as U+FFFD on Postgres
and SQLite alike, whether a row goes in by INSERT or by COPY (storage.types.SafeText,
SafeJSON; storage.repositories._sql.copy_rows)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import JSON, Boolean, Float, Integer, LargeBinary, String, Table, insert, select
from sqlalchemy.orm import Session

from storage.repositories._sql import copy_rows
from storage.tables import SQLModel
from storage.types import SafeJSON, SafeText, UTCDateTime

_counter = itertools.count()

# Text with at least one NUL somewhere, in any script (no lone surrogates: not text).
nul_text = st.tuples(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
    st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
).map(lambda parts: parts[0] + "\x00" + parts[1])


def _tables() -> list[Table]:
    return [
        t
        for t in SQLModel.metadata.sorted_tables
        if any(isinstance(c.type, SafeText | SafeJSON) for c in t.columns)
    ]


def test_every_text_and_json_column_has_the_nul_safe_type():
    for table in SQLModel.metadata.sorted_tables:
        for column in table.columns:
            assert not isinstance(column.type, String | JSON), (
                f"{table.name}.{column.name} is {column.type!r}: declare it SafeText/SafeJSON"
            )


def _value(column: Any, text: str, parents: dict[str, int]) -> Any:
    if column.foreign_keys:
        (fk,) = column.foreign_keys
        return parents[fk.column.table.name]
    kind = column.type
    if isinstance(kind, SafeText):
        return text
    if isinstance(kind, SafeJSON):
        return {text: [text, {"nested": text}]}
    if isinstance(kind, UTCDateTime):
        return datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    if isinstance(kind, Boolean):
        return False
    if isinstance(kind, Float):
        return 0.5
    if isinstance(kind, LargeBinary):
        return b""
    if isinstance(kind, Integer):
        return next(_counter)
    raise AssertionError(f"no test value for {column!r}")


def _scrubbed(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_scrubbed(k): _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


def _write_every_table(session: Session, text: str, *, by_copy: bool) -> None:
    parents: dict[str, int] = {}
    for table in _tables():
        pk = next(iter(table.primary_key.columns))
        unique = f"{text}#{next(_counter)}"  # unique constraints see a new value per write
        row = {
            c.name: _value(c, unique, parents)
            for c in table.columns
            if not (c.primary_key and isinstance(c.type, Integer) and not c.foreign_keys)
        }
        if by_copy:
            if pk.name not in row:  # COPY has no RETURNING: choose the key
                row[pk.name] = 1_000_000 + next(_counter)
            copy_rows(session, table, list(row), [row])
            key = row[pk.name]
        else:
            key = session.execute(insert(table).values(row).returning(pk)).scalar_one()
        stored = session.execute(select(table).where(pk == key)).one()
        parents[table.name] = stored._mapping[pk.name]
        for name, written in row.items():
            got = stored._mapping[name]
            if isinstance(table.c[name].type, SafeText | SafeJSON):
                assert got == _scrubbed(written), f"{table.name}.{name}"
                assert "\x00" not in repr(got)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=nul_text)
def test_nul_in_any_text_column_is_stored_as_the_replacement_character(engine, text):
    with Session(engine) as session, session.begin():
        _write_every_table(session, text, by_copy=False)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=nul_text)
def test_copy_stores_nul_as_insert_does(postgres_url, text):
    from storage.engine import make_engine

    engine = make_engine(postgres_url)
    try:
        with Session(engine) as session, session.begin():
            _write_every_table(session, text, by_copy=True)
    finally:
        engine.dispose()
