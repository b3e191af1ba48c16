"""run_transaction: a real serialization failure on Postgres is retried and the transaction
commits once; an error that is not transient (a constraint) is raised at the first try; the
backoff doubles up to its cap."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from storage.engine import RetryPolicy, is_transient, make_engine, normalise_url, run_transaction

FAST = RetryPolicy(attempts=4, first_delay_s=0.01, max_delay_s=0.05)


def test_a_serialization_failure_is_retried_and_commits_once(postgres_url: str) -> None:
    table = f"retry_{uuid.uuid4().hex[:8]}"
    engine = make_engine(postgres_url, isolation_level="REPEATABLE READ")
    other = create_engine(normalise_url(postgres_url), isolation_level="AUTOCOMMIT")
    with other.connect() as connection:
        connection.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, n int)"))
        connection.execute(text(f"INSERT INTO {table} VALUES (1, 0)"))
    attempts: list[int] = []

    def bump(session) -> int:
        attempts.append(1)
        n = session.execute(text(f"SELECT n FROM {table} WHERE id = 1")).scalar_one()
        if len(attempts) == 1:  # a concurrent writer commits after our snapshot was taken
            with other.connect() as connection:
                connection.execute(text(f"UPDATE {table} SET n = n + 1 WHERE id = 1"))
        session.execute(text(f"UPDATE {table} SET n = :n WHERE id = 1"), {"n": n + 10})
        return n

    try:
        seen = run_transaction(engine, bump, policy=FAST)
        with other.connect() as connection:
            final = connection.execute(text(f"SELECT n FROM {table}")).scalar_one()
    finally:
        with other.connect() as connection:
            connection.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()
        other.dispose()
    assert (len(attempts), seen, final) == (2, 1, 11)


def test_an_error_that_is_not_transient_is_raised_at_the_first_try(engine) -> None:
    attempts: list[int] = []

    def duplicate(session) -> None:
        attempts.append(1)
        session.execute(text("CREATE TEMP TABLE once (id int PRIMARY KEY)"))
        session.execute(text("INSERT INTO once VALUES (1), (1)"))

    with pytest.raises(IntegrityError) as raised:
        run_transaction(engine, duplicate, policy=FAST)
    assert attempts == [1]
    assert not is_transient(raised.value)


def test_the_backoff_doubles_up_to_its_cap() -> None:
    policy = RetryPolicy(attempts=6, first_delay_s=0.5, max_delay_s=3.0)
    assert list(policy.delays_s()) == [0.5, 1.0, 2.0, 3.0, 3.0]
    with pytest.raises(ValueError, match="bad retry policy"):
        RetryPolicy(attempts=0)
