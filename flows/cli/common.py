"""What every `futureworld` command shares: the console, the `--db` and `--as-of` options,
and the run context (flows.context) on the migrated database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console

from flows.context import PipelineContext, open_context

console = Console()
DbOption = Annotated[
    str | None, typer.Option("--db", help="Database URL (sqlite:///…, postgresql://…).")
]
AsOfOption = Annotated[
    str | None, typer.Option("--as-of", help="The run's instant (date or ISO); default now.")
]


@contextmanager
def cli_context(db: str | None, as_of: str | None = None) -> Iterator[PipelineContext]:
    """The run context of `--db` (else FW_DB_URL, else the SQLite default), migrated to head."""
    with open_context(db_url=db, as_of=as_of) as ctx:
        yield ctx
