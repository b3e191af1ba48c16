"""Articles of the news corpus (deduplicated by guid and by link) and per-feed fetch state."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from futureworld.domain import Article
from storage.repositories._sql import insert_new
from storage.tables import ArticleRow, FeedStateRow


def article_from_row(row: ArticleRow) -> Article:
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


def _article_values(article: Article) -> dict[str, Any]:
    return {
        "feed": article.feed,
        "guid": article.guid,
        "link": article.link,
        "title": article.title,
        "summary": article.summary,
        "body": article.body,
        "published_at": article.published_at,
        "fetched_at": article.fetched_at,
        "flags": list(article.flags),
    }


def insert_articles(session: Session, articles: Sequence[Article]) -> int:
    """Insert articles not seen before (by guid or by link); returns how many were new."""
    inserted = insert_new(
        session,
        ArticleRow,
        articles,
        _article_values,
        chunk_size=500,
        returning=[ArticleRow.id],
    )
    return len(inserted)


def articles_between(
    session: Session, start: datetime | None, end: datetime, *, limit: int | None = None
) -> list[Article]:
    """Articles published in (start, end], oldest first."""
    statement = select(ArticleRow).where(ArticleRow.published_at <= end)
    if start is not None:
        statement = statement.where(ArticleRow.published_at > start)
    statement = statement.order_by(ArticleRow.published_at, ArticleRow.id).limit(limit)
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
