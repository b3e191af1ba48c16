"""Shared fixtures: real databases (Postgres on 127.0.0.1 and SQLite files) with the
migrations applied. A missing Postgres is an error, never a skip."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text

# Prefect must never touch the user's home or phone home during tests.
_PREFECT_HOME = tempfile.mkdtemp(prefix="fw-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from storage.engine import make_engine, upgrade_database  # noqa: E402
from storage.tables import SQLModel  # noqa: E402

POSTGRES_ADMIN_URL = os.environ.get(
    "FW_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database for this test session on the local Postgres server."""
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"fw_test_{uuid.uuid4().hex[:10]}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as error:  # pragma: no cover - the failure message is the point
        raise RuntimeError(
            f"PostgreSQL is required for the tests ({POSTGRES_ADMIN_URL}): {error}. "
            "Start it with `bash infra/postgres/ensure.sh`."
        ) from error
    url = POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    upgrade_database(engine)
    engine.dispose()
    yield url
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _truncate_postgres(engine: Engine) -> None:
    tables = ", ".join(f'"{t.name}"' for t in SQLModel.metadata.sorted_tables)
    with engine.begin() as connection:
        connection.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


@pytest.fixture(params=["postgres", "sqlite"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A migrated, empty database: each test runs once on Postgres and once on SQLite."""
    if request.param == "postgres":
        url = request.getfixturevalue("postgres_url")
        engine = make_engine(url)
        _truncate_postgres(engine)
        engine.dispose()
        yield url
    else:
        url = f"sqlite:///{tmp_path / 'fw.db'}"
        engine = make_engine(url)
        upgrade_database(engine)
        engine.dispose()
        yield url


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = make_engine(db_url)
    yield engine
    engine.dispose()
