"""What every `futureworld` command shares: the console, the `--db` and `--as-of` options,
the run context (flows.context) on the migrated database, and the two errors a command raises
to end with one line: UserError (the caller's mistake, exit 2) and RunFailure (the work ran and
failed, exit 1). flows.cli turns them, and every other exception, into that one line.

Decisions: an unreachable or unusable database is the caller's to fix (exit 2), as are unknown
names, bad values and bad paths; a requested source that answered nothing fails the run (exit
1). Option values are checked before any work starts. A database URL must be postgresql or
sqlite, and a SQLite file's folder must exist (a mistyped path is refused rather than created
with an empty database), except the data dir's own database: that folder is made as needed.
The orchestration commands hand `--db` to the flows and timers through this process's
environment (FW_DB_URL), never as a Prefect parameter or a stored job argument."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from sqlalchemy import Engine
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from typer._click.globals import get_current_context  # typer vendors its own click

from flows.context import PipelineContext, build_context, open_engine
from flows.settings import Settings, parse_as_of, without_password
from storage.engine import sqlite_file

console = Console()


class UserError(Exception):
    """The caller's mistake (unknown name, bad value, unreachable service, bad path); the
    message names what was wrong and what to do. Exit code 2."""


class RunFailure(Exception):
    """The command ran and failed (e.g. a requested source gave nothing). Exit code 1."""


def _check_as_of(value: str | None) -> str | None:
    if value is not None:
        try:
            parse_as_of(value)
        except ValueError:
            raise typer.BadParameter(
                f"{value!r} is not a date; give YYYY-MM-DD or an ISO datetime"
            ) from None
    return value


DbOption = Annotated[
    str | None, typer.Option("--db", help="Database URL (sqlite:///…, postgresql://…).")
]
AsOfOption = Annotated[
    str | None,
    typer.Option(
        "--as-of", help="The run's instant (date or ISO); default now.", callback=_check_as_of
    ),
]


def load_settings(db: str | None = None) -> Settings:
    """The environment's settings with `--db` applied; UserError for a bad FW_* value."""
    try:
        settings = Settings()
    except ValidationError as error:
        first = error.errors()[0]
        name = "FW_" + "_".join(str(part) for part in first["loc"]).upper()
        raise UserError(f"{name}: {first['msg']}; fix or unset it") from None
    return settings.with_db(db)


def open_database(settings: Settings) -> Engine:
    """The engine of the configured database, migrated; UserError when it cannot be used."""
    shown = without_password(settings.database_url)
    try:
        _check_sqlite_folder(settings, shown)
        return open_engine(settings)
    except ArgumentError as error:
        raise UserError(
            f"--db {shown}: not a usable database URL ({_first_line(error)}); "
            "give sqlite:///PATH or postgresql://USER@HOST/NAME"
        ) from None
    except (DBAPIError, SQLAlchemyError, OSError) as error:
        raise UserError(
            f"cannot open the database at {shown}: {_first_line(error)}; start it, or point "
            "--db / FW_DB_URL at a running one"
        ) from None


def _check_sqlite_folder(settings: Settings, shown: str) -> None:
    """UserError for a SQLite file in a folder that does not exist, unless it is the data dir's
    own database (the folder is made for it); ArgumentError for a string that is not a URL."""
    path = sqlite_file(settings.database_url)
    if path is None or path.parent.is_dir():
        return
    if path.resolve() == (settings.data_dir / "futureworld.db").resolve():
        return
    raise UserError(
        f"--db {shown}: the folder {path.parent} does not exist; create it, or give a SQLite "
        "path in an existing folder"
    )


def _first_line(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error).strip()
    return " ".join(text.splitlines()[0].split()) if text else type(error).__name__


def use_database(db: str | None) -> Settings:
    """Check the database (reachable, migrated) and put `--db` into this process's
    environment, where the flows, their served runs and the timers read it."""
    settings = load_settings(db)
    open_database(settings).dispose()
    if db is not None:
        os.environ["FW_DB_URL"] = db
    return settings


@contextmanager
def cli_context(db: str | None, as_of: str | datetime | None = None) -> Iterator[PipelineContext]:
    """The run context of `--db` (else FW_DB_URL, else the SQLite default), migrated to head."""
    settings = load_settings(db)
    engine = open_database(settings)
    try:
        yield build_context(settings, engine, as_of=as_of)
    finally:
        engine.dispose()


def require_agent(ctx: PipelineContext, name: str) -> None:
    """UserError unless `name` is a registered agent or a built-in baseline."""
    try:
        ctx.agent(name)
    except LookupError as error:
        raise UserError(
            f"unknown agent: {error}; register it with "
            f"`futureworld agent add {name} --model DIR`, or use crowd, base-rate or uniform"
        ) from None


def writable_file(path: Path | None, option: str) -> Path | None:
    """Check an output path before the work starts: its folder can be made and it is not a
    folder itself; UserError otherwise."""
    if path is None:
        return None
    if path.is_dir():
        raise UserError(f"{option} {path}: is a folder; give a file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UserError(
            f"{option} {path}: cannot create its folder ({error.strerror}); choose a writable path"
        ) from None
    return path


def write_output(path: Path, option: str, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as error:
        raise UserError(
            f"{option} {path}: cannot write ({error.strerror}); choose a writable path"
        ) from None


def debugging() -> bool:
    """Whether this command runs with `--debug` (or FW_DEBUG=1): tracebacks are shown."""
    if os.environ.get("FW_DEBUG", "").strip().lower() in ("1", "true", "yes"):
        return True
    ctx = get_current_context(silent=True)
    return bool(ctx is not None and ctx.find_root().params.get("debug"))


class _WithoutTraceback(logging.Formatter):
    """Formats a record as `inner` does, leaving out its traceback. The record itself is put
    back as it was: Prefect's API handler gets the same record, complete."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def quiet_prefect_tracebacks() -> None:
    """Prefect's console handlers (on the root logger and a few of its own) print a failed
    run's traceback; without `--debug` the command line shows that failure as its own one
    line instead (the Prefect API keeps the full record)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [
        logger
        for logger in list(logging.Logger.manager.loggerDict.values())
        if isinstance(logger, logging.Logger)
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, PrefectConsoleHandler) and not isinstance(
                handler.formatter, _WithoutTraceback
            ):
                handler.setFormatter(_WithoutTraceback(handler.formatter or logging.Formatter()))
