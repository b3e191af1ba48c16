"""What every `futureworld` command shares: the console, the `--db` option and the engine
on a migrated database."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from sqlalchemy import Engine

from flows.settings import Settings

console = Console()
DbOption = Annotated[
    str | None, typer.Option("--db", help="Database URL (sqlite:///…, postgresql://…).")
]


def open_engine(db: str | None) -> Engine:
    """The engine of `--db` (else FW_DB_URL, else the SQLite default), migrated to head."""
    from storage.engine import make_engine, upgrade_database

    engine = make_engine(Settings().with_db(db).database_url)
    upgrade_database(engine)
    return engine
