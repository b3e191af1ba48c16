"""article.visible_at: from when a search may return an article, so nothing reaches a forecast
before this system could have read it

A live-harvested article becomes visible at the later of its stated publication time and its
fetch time (a back-dated item cannot reach earlier forecasts); an archive import at its stated
time; an article flagged `implausible_date` at its fetch time (storage.repositories.articles).
Every article stored before this revision was harvested live: it gets the later of the two
times, and one whose stated date is before 1990 or more than a day past its fetch is flagged
`implausible_date` and gets its fetch time.

The (published_at, id) index of revision 0003 becomes (visible_at, id): search scans the newest
visible matches backwards from the cut-off. On SQLite the column is added in place with a
constant default (ALTER TABLE … ADD COLUMN, which keeps the full-text triggers on `article`),
then filled; on Postgres it is added nullable, filled, and made NOT NULL.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 17:00:00
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

import storage.types

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EARLIEST_PLAUSIBLE_AT = datetime(1990, 1, 1, tzinfo=UTC)
_FUTURE_TOLERANCE = timedelta(days=1)
_IMPLAUSIBLE_DATE = "implausible_date"

_article = sa.table(
    "article",
    sa.column("id", sa.Integer()),
    sa.column("published_at", storage.types.UTCDateTime()),
    sa.column("fetched_at", storage.types.UTCDateTime()),
    sa.column("visible_at", storage.types.UTCDateTime()),
    sa.column("flags", storage.types.JSONType),
)


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        column = sa.Column("visible_at", storage.types.UTCDateTime(), nullable=True)
        op.add_column("article", column)
    else:
        op.add_column(
            "article",
            sa.Column(
                "visible_at",
                storage.types.UTCDateTime(),
                nullable=False,
                server_default=sa.text("'1970-01-01 00:00:00.000000'"),
            ),
        )
    op.execute(
        "UPDATE article SET visible_at = CASE WHEN published_at > fetched_at "
        "THEN published_at ELSE fetched_at END"
    )
    _flag_implausible_dates()
    if postgres:
        op.alter_column("article", "visible_at", nullable=False)
    op.drop_index("ix_article_published_at_id", table_name="article")
    op.create_index("ix_article_visible_at_id", "article", ["visible_at", "id"], unique=False)
    if postgres:
        op.execute("ANALYZE article")


def _flag_implausible_dates() -> None:
    bind = op.get_bind()
    suspects = bind.execute(
        sa.select(
            _article.c.id, _article.c.published_at, _article.c.fetched_at, _article.c.flags
        ).where(
            sa.or_(
                _article.c.published_at < _EARLIEST_PLAUSIBLE_AT,
                _article.c.published_at > _article.c.fetched_at,
            )
        )
    ).all()
    for article_id, published_at, fetched_at, flags in suspects:
        if _EARLIEST_PLAUSIBLE_AT <= published_at <= fetched_at + _FUTURE_TOLERANCE:
            continue
        bind.execute(
            sa.update(_article)
            .where(_article.c.id == article_id)
            .values(
                visible_at=fetched_at,
                flags=[*(f for f in flags or () if f != _IMPLAUSIBLE_DATE), _IMPLAUSIBLE_DATE],
            )
        )


def downgrade() -> None:
    op.drop_index("ix_article_visible_at_id", table_name="article")
    op.create_index("ix_article_published_at_id", "article", ["published_at", "id"], unique=False)
    op.drop_column("article", "visible_at")
