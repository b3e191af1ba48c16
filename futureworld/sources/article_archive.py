"""A news archive (JSONL or CSV rows of title, body, url, published_at, source) to Articles:
parsing and validation only, with one clear error per bad row while the other rows load.

Decisions:
- Format: `.jsonl`/`.ndjson` is one JSON object a line, `.csv` a CSV file with a header row;
  any other name is JSONL when its first non-blank character is `{`, else CSV. Extra fields are
  ignored; a CSV without the url, published_at or title column is refused whole.
- Keys: an article is keyed by its canonical link (its guid, as the feed reader keys an entry
  without one), so a URL stored by a harvest or an earlier import is the same article.
- Times: `published_at` is ISO 8601 or RFC 2822 with a time zone. A date alone (`2025-10-01`)
  is taken as the end of that day in UTC (23:59:59): the article may have come out at any hour,
  and the end of the day is the earliest time it is sure to have. A time without a zone is
  refused (ambiguous by hours). A date before 1990 or more than a day past the import is
  refused (futureworld.sources.publication_dates). `fetched_at` is the import time; the store
  makes an archive article visible at its stated time (storage.repositories.articles).
- `source` becomes the article's feed (`archive` when empty); `body` may be empty when the
  title is not (flag `empty_body`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

from futureworld.domain import Article, require_utc
from futureworld.sources.base import ARTICLE_TEXT_FIELDS, fields_with_nul
from futureworld.sources.publication_dates import implausible_date_reason
from futureworld.sources.rss import canonical_link, is_web_link
from futureworld.sources.tabular import Row, csv_rows, jsonl_rows

DEFAULT_FEED = "archive"
"""The feed of an archive row without a source."""
REQUIRED_FIELDS = ("url", "published_at", "title")
OPTIONAL_FIELDS = ("body", "source")


class ArchiveFormat(StrEnum):
    JSONL = "jsonl"
    """One JSON object a line; blank lines skipped."""
    CSV = "csv"
    """A header row, then one article a row (RFC 4180 quoting, so bodies may span lines)."""


class ArchiveFormatError(ValueError):
    """The file as a whole cannot be read (no row can load)."""


@dataclass(frozen=True, kw_only=True)
class ArchiveParse:
    """What one archive file gave: the articles to store and one line per refused row."""

    articles: list[Article]
    errors: list[str] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)
    """rows, articles, refused, duplicate (a url repeated within the file) …"""


class _RowError(ValueError):
    def __init__(self, field_name: str, problem: str) -> None:
        super().__init__(f"{field_name}: {problem}")


def detect_format(name: str, text: str) -> ArchiveFormat:
    """The archive's format from its name, else from its first non-blank character."""
    lowered = name.lower()
    if lowered.endswith((".jsonl", ".ndjson")):
        return ArchiveFormat.JSONL
    if lowered.endswith(".csv"):
        return ArchiveFormat.CSV
    return ArchiveFormat.JSONL if text.lstrip().startswith("{") else ArchiveFormat.CSV


def parse_published_at(value: Any) -> datetime:
    """A stated publication time as tz-aware UTC (see the module docstring for a bare date)."""
    if not isinstance(value, str) or not value.strip():
        raise _RowError("published_at", "missing")
    text = value.strip()
    try:
        day = date.fromisoformat(text)
    except ValueError:
        pass
    else:
        return datetime.combine(day, time(23, 59, 59), tzinfo=UTC)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        try:
            parsed = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            problem = f"{text!r} is not an ISO 8601 or RFC 2822 time"
            raise _RowError("published_at", problem) from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise _RowError("published_at", f"{text!r} has no time zone")
    return require_utc(parsed, "published_at")


def _text(row: dict[str, Any], name: str, *, required: bool) -> str:
    value = row.get(name)
    if value is None:
        if required:
            raise _RowError(name, "missing")
        return ""
    if not isinstance(value, str):
        raise _RowError(name, f"must be text, got {type(value).__name__}")
    return value.strip()


def _row_article(row: dict[str, Any], imported_at: datetime) -> Article:
    url = _text(row, "url", required=True)
    if not is_web_link(url):
        raise _RowError("url", f"{url!r} is not an http(s) URL")
    published_at = parse_published_at(row.get("published_at"))
    if reason := implausible_date_reason(published_at, imported_at):
        raise _RowError("published_at", f"implausible date: {reason}")
    title = _text(row, "title", required=True)
    body = _text(row, "body", required=False)
    if not title and not body:
        raise _RowError("title", "empty, and so is the body")
    key = canonical_link(url)
    return Article(
        feed=_text(row, "source", required=False) or DEFAULT_FEED,
        guid=key,
        link=url,
        title=title,
        body=body,
        published_at=published_at,
        fetched_at=imported_at,
        flags=() if body else ("empty_body",),
    )


def _csv_rows(text: str, name: str) -> list[Row]:
    rows, missing = csv_rows(text, REQUIRED_FIELDS)
    if missing:
        raise ArchiveFormatError(f"{name}: the CSV header lacks {', '.join(missing)}")
    return rows


def parse_article_archive(
    text: str, name: str, *, imported_at: datetime, archive_format: ArchiveFormat | None = None
) -> ArchiveParse:
    """Articles of an archive file; each refused row is one error line naming its line number
    and field, and the other rows still load. Raises ArchiveFormatError only when no row can."""
    imported_at = require_utc(imported_at, "imported_at")
    archive_format = archive_format or detect_format(name, text)
    jsonl = archive_format is ArchiveFormat.JSONL
    rows = jsonl_rows(text) if jsonl else _csv_rows(text, name)
    articles: list[Article] = []
    errors: list[str] = []
    counts: Counter[str] = Counter()
    seen: set[str] = set()
    for number, row in rows:
        counts["rows"] += 1
        try:
            if isinstance(row, str):
                raise _RowError("row", row)
            article = _row_article(row, imported_at)
        except _RowError as error:
            counts["refused"] += 1
            errors.append(f"{name} line {number}: {error}")
            continue
        if article.guid in seen:
            counts["duplicate"] += 1
            continue
        seen.add(article.guid)
        if held := fields_with_nul(article, ARTICLE_TEXT_FIELDS):
            counts["nul_replaced"] += 1
            errors.append(f"{name} line {number}: {', '.join(held)}: NUL (U+0000) stored as U+FFFD")
        articles.append(article)
    counts["articles"] = len(articles)
    return ArchiveParse(articles=articles, errors=errors, counts=counts)
