"""Articles of the news corpus (deduplicated by guid and by link) and per-feed fetch state.

An article's visible time (`visible_at`, what search filters on) is decided here, when it is
stored, by its Visibility: a live harvest's article is visible at the later of its stated
publication time and its fetch time (the first time this system saw it), so a back-dated item
never reaches a forecast made before it was fetched; an archive import's at its stated time.
Either way an article flagged IMPLAUSIBLE_DATE (a stated date before 1990 or more than a day
past its fetch, futureworld.sources.publication_dates) is visible from its fetch time: its
stated date says nothing about when it was published. Deduplication keeps the first stored
copy and its visible time: an archive row already harvested live stays visible at its fetch.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session

from futureworld.domain import Article
from storage.repositories._sql import insert_new
from storage.tables import ArticleRow, FeedStateRow

IMPLAUSIBLE_DATE = "implausible_date"
"""The flag futureworld.sources.publication_dates puts on an implausible stated date."""


class Visibility(StrEnum):
    """From when a stored article may be found by search."""

    FIRST_SEEN = "first_seen"
    """Live harvest: the later of its stated publication time and its fetch time."""
    STATED = "stated"
    """Archive import: its stated publication time."""


def visible_from(article: Article, visibility: Visibility) -> datetime:
    """The instant from which search may return `article` (see the module docstring)."""
    if IMPLAUSIBLE_DATE in article.flags:
        return article.fetched_at
    if visibility is Visibility.STATED:
        return article.published_at
    return max(article.published_at, article.fetched_at)


def article_from_row(row: ArticleRow | Row[Any]) -> Article:
    """An article from its table's row (an ORM object, or a Core row of its columns)."""
    return Article(
        id=row.id,
        feed=row.feed,
        guid=row.guid,
        link=row.link,
        title=row.title,
        summary=row.summary,
        body=row.body,
        published_at=row.published_at,
        fetched_at=row.fetched_at,
        flags=tuple(row.flags or ()),
    )


def _article_values(article: Article, visibility: Visibility) -> dict[str, Any]:
    return {
        "feed": article.feed,
        "guid": article.guid,
        "link": article.link,
        "title": article.title,
        "summary": article.summary,
        "body": article.body,
        "published_at": article.published_at,
        "fetched_at": article.fetched_at,
        "visible_at": visible_from(article, visibility),
        "flags": list(article.flags),
    }


def insert_articles(
    session: Session,
    articles: Sequence[Article],
    *,
    visibility: Visibility = Visibility.FIRST_SEEN,
) -> int:
    """Insert articles not seen before (by guid or by link); returns how many were new."""
    inserted = insert_new(
        session,
        ArticleRow,
        articles,
        lambda article: _article_values(article, visibility),
        chunk_size=500,
        returning=[ArticleRow.id],
    )
    return len(inserted)


def articles_between(
    session: Session, start: datetime | None, end: datetime, *, limit: int | None = None
) -> list[Article]:
    """Articles that became visible in (start, end], oldest first."""
    statement = select(ArticleRow).where(ArticleRow.visible_at <= end)
    if start is not None:
        statement = statement.where(ArticleRow.visible_at > start)
    statement = statement.order_by(ArticleRow.visible_at, ArticleRow.id).limit(limit)
    return [article_from_row(row) for row in session.scalars(statement)]


def get_feed_state(session: Session, url: str) -> tuple[str | None, str | None]:
    row = session.get(FeedStateRow, url)
    return (row.etag, row.last_modified) if row else (None, None)


def set_feed_state(
    session: Session, url: str, *, etag: str | None, last_modified: str | None, fetched_at: datetime
) -> None:
    row = session.get(FeedStateRow, url) or FeedStateRow(url=url)
    row.etag, row.last_modified, row.last_fetched_at = etag, last_modified, fetched_at
    session.add(row)
