"""Dialect-aware INSERT … ON CONFLICT for Postgres and SQLite (both support the same clause)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session


def insert(session: Session, table: Any) -> Any:
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database dialect {name!r}: use Postgres or SQLite")


def dialect(session: Session) -> str:
    return session.get_bind().dialect.name
