"""Migration 0006 on real Postgres and SQLite: articles stored before it (all harvested live)
get the later of their stated and fetch times as visible time, implausible dates are flagged
and visible from the fetch, and the search index moves to (visible_at, id); and back."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy import create_engine, inspect, text

from storage.engine import current_revision, make_engine, upgrade_database
from storage.types import JSONType, UTCDateTime
from tests.conftest import POSTGRES_ADMIN_URL

FETCHED = datetime(2026, 3, 1, 8, tzinfo=UTC)
STATED = {
    "ordinary": FETCHED - timedelta(hours=3),
    "skewed": FETCHED + timedelta(hours=5),
    "year1900": datetime(1900, 1, 1, tzinfo=UTC),
    "year9999": datetime(9999, 12, 31, tzinfo=UTC),
}
ARTICLE = sa.table(
    "article",
    sa.column("feed", sa.String()),
    sa.column("guid", sa.String()),
    sa.column("link", sa.String()),
    sa.column("title", sa.Text()),
    sa.column("summary", sa.Text()),
    sa.column("body", sa.Text()),
    sa.column("published_at", UTCDateTime()),
    sa.column("fetched_at", UTCDateTime()),
    sa.column("flags", JSONType),
)


def _downgrade(engine: sa.Engine, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    from storage.engine import MIGRATIONS_DIR

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def _check(url: str) -> None:
    engine = make_engine(url)
    try:
        upgrade_database(engine, "0005")
        with engine.begin() as connection:
            connection.execute(
                ARTICLE.insert(),
                [
                    {
                        "feed": "f",
                        "guid": slug,
                        "link": f"https://wire.example/{slug}",
                        "title": slug,
                        "summary": "",
                        "body": "",
                        "published_at": stated,
                        "fetched_at": FETCHED,
                        "flags": ["empty_body"],
                    }
                    for slug, stated in STATED.items()
                ],
            )
        upgrade_database(engine)
        assert current_revision(engine) == "0009"
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(
                    sa.column("guid"),
                    sa.column("visible_at", UTCDateTime()),
                    sa.column("flags", JSONType),
                ).select_from(sa.table("article"))
            ).all()
        by_guid = {guid: (visible_at, flags) for guid, visible_at, flags in rows}
        assert by_guid == {
            "ordinary": (FETCHED, ["empty_body"]),
            "skewed": (STATED["skewed"], ["empty_body"]),
            "year1900": (FETCHED, ["empty_body", "implausible_date"]),
            "year9999": (FETCHED, ["empty_body", "implausible_date"]),
        }
        indexes = {i["name"] for i in inspect(engine).get_indexes("article")}
        assert "ix_article_visible_at_id" in indexes
        assert "ix_article_published_at_id" not in indexes
        _downgrade(engine, "0005")
        columns = {c["name"] for c in inspect(engine).get_columns("article")}
        assert "visible_at" not in columns
        upgrade_database(engine)
        assert current_revision(engine) == "0009"
    finally:
        engine.dispose()


def test_0006_sets_visible_times_of_stored_articles_and_flags_implausible_dates(
    tmp_path,
) -> None:
    _check(f"sqlite:///{tmp_path / 'before.db'}")
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"fw_test_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        _check(POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}")
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
