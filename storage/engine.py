"""Engines, sessions and migrations for Postgres and the embedded SQLite default, and the
retry of a transaction that met a transient database error.

Nothing here runs at import time; flows build the engine from settings.

Transient errors (decided here, the design being silent): a lost or refused connection
(SQLAlchemy marks the connection invalidated, or psycopg reports a connection failure,
SQLSTATE class 08, or an administrator/crash shutdown 57P01–57P03), a serialization failure
(40001), a deadlock (40P01), and SQLite's "database is locked". Anything else, a constraint
or a bad value, is the caller's error and is raised at once. `run_transaction` retries the
whole transaction, so the work function must build its writes from values it holds in
memory (a generated group, computed rewards), never from state of the failed session.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)
T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
SUPPORTED_DATABASES = ("postgresql", "sqlite")
"""The databases the project runs on (one migration chain, one test suite for both)."""


class UnsupportedDatabase(ArgumentError):
    """A database URL whose scheme is none of SUPPORTED_DATABASES (checked before SQLAlchemy
    looks for a driver of it)."""


def normalise_url(url: str) -> str:
    """Accept `postgresql://` and route it through psycopg 3; keep other URLs as given."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL; None for another database or an in-memory one."""
    parsed = make_url(normalise_url(url))
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine of a Postgres or SQLite URL (a SQLite file's folder is created);
    ArgumentError for a string that is not a URL, UnsupportedDatabase for another scheme."""
    url = normalise_url(url)
    backend = make_url(url).get_backend_name()
    if backend not in SUPPORTED_DATABASES:
        raise UnsupportedDatabase(
            f"unsupported database scheme {backend!r}; the supported schemes are "
            + " and ".join(SUPPORTED_DATABASES)
        )
    if backend == "sqlite":
        path = sqlite_file(url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One transaction: commit on success, roll back on any error."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How long a stage waits out a transient database error before giving up."""

    attempts: int = 10
    """Tries of one transaction in all (the first included)."""
    first_delay_s: float = 0.2
    """Wait before the second try; each later wait doubles, up to `max_delay_s`."""
    max_delay_s: float = 5.0
    """Longest single wait (about 30 s in all with the defaults: a server restart)."""

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.first_delay_s < 0 or self.max_delay_s < self.first_delay_s:
            raise ValueError(f"bad retry policy: {self}")

    def delays_s(self) -> Iterator[float]:
        delay = self.first_delay_s
        for _ in range(self.attempts - 1):
            yield delay
            delay = min(delay * 2, self.max_delay_s)


DEFAULT_RETRY = RetryPolicy()

_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "57P01", "57P02", "57P03"})


def is_transient(error: BaseException) -> bool:
    """Whether `error` is a database error a retry of the transaction can cure."""
    if isinstance(error, DBAPIError):
        if error.connection_invalidated:
            return True
        error = error.orig if error.orig is not None else error
    try:
        import psycopg
    except ImportError:  # pragma: no cover - psycopg is a dependency
        psycopg = None  # type: ignore[assignment]
    if psycopg is not None and isinstance(error, psycopg.Error):
        sqlstate = error.sqlstate
        if sqlstate is None:  # raised by the client: the connection failed or was lost
            return isinstance(error, psycopg.OperationalError | psycopg.InterfaceError)
        return sqlstate in _TRANSIENT_SQLSTATES or sqlstate.startswith("08")
    import sqlite3

    if isinstance(error, sqlite3.OperationalError):
        message = str(error).lower()
        return "database is locked" in message or "database is busy" in message
    return False


def run_transaction(
    engine: Engine,
    work: Callable[[Session], T],
    *,
    policy: RetryPolicy = DEFAULT_RETRY,
    what: str = "transaction",
) -> T:
    """`work(session)` in one transaction (`session_scope`), retried with exponential
    backoff while it fails with a transient error; the last error is raised when the tries
    are spent. Each try gets a fresh session (the pool's dead connections are dropped)."""
    delays = policy.delays_s()
    while True:
        try:
            with session_scope(engine) as session:
                return work(session)
        except Exception as error:
            if not is_transient(error):
                raise
            delay = next(delays, None)
            if delay is None:
                raise
            log.warning(
                "%s: transient database error, retrying in %.1f s: %s",
                what,
                delay,
                str(error).splitlines()[0][:300] if str(error) else type(error).__name__,
            )
            if error_invalidates_pool(error):
                engine.dispose()
            time.sleep(delay)


def error_invalidates_pool(error: BaseException) -> bool:
    """A lost connection makes the pool's other connections suspect too (a restarted server
    dropped them all); a serialization failure or a lock does not."""
    return isinstance(error, DBAPIError) and bool(error.connection_invalidated)


def upgrade_database(engine: Engine, revision: str = "head") -> None:
    """Apply the Alembic chain (the same one on Postgres and SQLite)."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
