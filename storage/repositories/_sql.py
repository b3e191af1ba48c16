"""The SQL the repositories share: the dialect's INSERT … ON CONFLICT (Postgres and SQLite
both support the clause), the chunked insert of rows not stored yet, COPY on Postgres through
the columns' own types, and `column IN ids` as one parameter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, Integer, Row, any_, bindparam
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from storage.types import copy_converter

T = TypeVar("T")


def insert(session: Session, table: Any) -> Any:
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database dialect {name!r}: use Postgres or SQLite")


def dialect(session: Session) -> str:
    return session.get_bind().dialect.name


def insert_new(
    session: Session,
    table: Any,
    items: Sequence[T],
    values: Callable[[T], dict[str, Any]],
    *,
    chunk_size: int,
    returning: Sequence[Any],
    conflict_columns: Sequence[str] | None = None,
) -> list[Row[Any]]:
    """INSERT `values(item)` for every item, `chunk_size` rows a statement, ON CONFLICT (on
    `conflict_columns`, else any unique constraint) DO NOTHING; returns the `returning`
    columns of the rows actually inserted, in statement order."""
    inserted: list[Row[Any]] = []
    for start in range(0, len(items), chunk_size):
        chunk = items[start : start + chunk_size]
        statement = (
            insert(session, table)
            .values([values(item) for item in chunk])
            .on_conflict_do_nothing(index_elements=conflict_columns)
            .returning(*returning)
        )
        inserted += session.execute(statement).all()
    return inserted


def among(session: Session, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
    """`column IN ids`: one array parameter on Postgres (`= ANY(:ids)`), where an IN list
    would be as many parameters as ids."""
    if dialect(session) == "postgresql":
        return column == any_(bindparam("ids", list(ids), type_=ARRAY(Integer)))
    return column.in_(list(ids))


def copy_rows(
    session: Session,
    table: Any,
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    *,
    into: str | None = None,
) -> int:
    """COPY `rows` (column → value) into `table` (a sqlalchemy Table) on Postgres, or into the
    table named `into` shaped like it. Every value goes through its column's type first, as an
    INSERT would bind it, so COPY stores NUL, JSON and datetimes exactly as the ORM does.
    Returns the number of rows copied."""
    pg = session.get_bind().dialect
    converters = [(c, copy_converter(table.c[c].type, pg)) for c in columns]
    raw = session.connection().connection.driver_connection
    column_list = ", ".join(f'"{c}"' for c in columns)
    target = into or table.name
    with raw.cursor() as cursor:
        with cursor.copy(f"COPY {target} ({column_list}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row([row[c] if f is None else f(row[c]) for c, f in converters])
        return cursor.rowcount
