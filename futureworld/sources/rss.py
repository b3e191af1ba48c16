"""RSS/Atom feeds to Articles: conditional GET, feedparser, HTML to text, dedup, quality flags.

It owns fetching and parsing only; the caller stores the articles and the returned FeedState
(ETag / Last-Modified) and passes the state back next time, so unchanged feeds cost a 304.

Keys (the store deduplicates articles by guid and by link, both unique): an entry's guid is
its own `<guid>`/`<id>`, else its canonical link, else `sha1:` of a content hash of its link,
title, description and stated date (never the fetch time, so a refetch keys the same). An entry
without a link is keyed by that guid alone: its link becomes `urn:guid:<guid>`
(LINKLESS_PREFIX), which is not a web address and is never shown as one.

Dates: an entry without one is dated by the fetch (flag `date_from_fetch_time`); a stated date
before 1990 or more than a day past the fetch keeps its value, is flagged `implausible_date` and
reported as the feed's problem (futureworld.sources.publication_dates).

Errors are isolated: whatever fetching or parsing one feed raises is recorded with the feed's
URL and the other feeds go on; whatever one entry raises skips that entry alone.
"""

from __future__ import annotations

import calendar
import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from html.parser import HTMLParser
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import feedparser

from futureworld.domain import Article, utc_now
from futureworld.sources.base import ARTICLE_TEXT_FIELDS, fields_with_nul
from futureworld.sources.http import SourceClient, SourceError
from futureworld.sources.publication_dates import IMPLAUSIBLE_DATE, implausible_date_reason

ENCODING_ERRORS = (feedparser.CharacterEncodingOverride, feedparser.CharacterEncodingUnknown)
LINKLESS_PREFIX = "urn:guid:"
"""The stand-in link of an entry without one: this prefix and the entry's guid."""


@dataclass(frozen=True, kw_only=True)
class FeedState:
    """What the caller keeps between fetches of one feed."""

    url: str
    """The feed URL as configured."""
    etag: str | None = None
    """The last ETag, sent back as If-None-Match."""
    last_modified: str | None = None
    """The last Last-Modified, sent back as If-Modified-Since."""
    fetched_at: datetime | None = None
    """When the feed last answered 200 or 304."""


@dataclass(frozen=True, kw_only=True)
class FeedResult:
    """One feed fetch: new articles, the state to store, and what went wrong."""

    feed: str
    articles: list[Article]
    state: FeedState
    not_modified: bool = False
    """The server answered 304: nothing new, nothing parsed."""
    counts: Counter[str] = field(default_factory=Counter)
    """entries, articles, duplicate_guid, duplicate_link, date_from_fetch_time, empty_body,
    bozo, wrong_encoding, fetch_failed, truncated, not_modified …"""
    errors: list[str] = field(default_factory=list)


class _TextExtractor(HTMLParser):
    """Collects text, drops script/style, and breaks words at block-level tags."""

    _SKIP = frozenset({"script", "style", "noscript", "template"})
    _BLOCK = frozenset({"p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "tr", "td"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag in self._SKIP:
            self._skipping += 1
        elif tag in self._BLOCK:
            self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self._skipping:
            self._skipping -= 1
        elif tag in self._BLOCK:
            self.parts.append(" ")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """Plain text of an HTML fragment, whitespace collapsed."""
    if not html:
        return ""
    extractor = _TextExtractor()
    extractor.feed(html)
    extractor.close()
    return " ".join("".join(extractor.parts).split())


def canonical_link(url: str) -> str:
    """The link used for dedup: lowercase scheme/host, no fragment, no utm_* params, no
    trailing slash."""
    parts = urlsplit(url.strip())
    query = [
        (k, v)
        for k, v in parse_qsl(parts.query, keep_blank_values=True)
        if not k.lower().startswith("utm_")
    ]
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, urlencode(query), ""))


def read_feed_list(text: str) -> list[str]:
    """Feed URLs, one per line; blank lines and `#` comments skipped, duplicates dropped.

    Raises ValueError naming the line of anything that is not an http(s) URL.
    """
    urls: dict[str, None] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
        if not entry:
            continue
        parts = urlsplit(entry)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"feed list line {number}: {entry!r} is not an http(s) URL")
        urls[entry] = None
    return list(urls)


def _entry_datetime(entry: Mapping[str, Any]) -> datetime | None:
    for key in ("published_parsed", "updated_parsed", "created_parsed"):
        parsed = entry.get(key)
        if parsed:
            return datetime.fromtimestamp(calendar.timegm(parsed), UTC)
    return None


def _entry_guid(entry: Mapping[str, Any], link: str, title: str) -> str:
    """The entry's own guid, else its canonical link, else a hash of what it says."""
    guid = str(entry.get("id") or entry.get("guid") or "").strip()
    if guid:
        return guid
    if link:
        return canonical_link(link)
    stated_date = str(entry.get("published") or entry.get("updated") or entry.get("created") or "")
    content = "\x1f".join((link, title, str(entry.get("summary") or ""), stated_date))
    return "sha1:" + hashlib.sha1(content.encode("utf-8")).hexdigest()


def is_web_link(link: str) -> bool:
    """An http(s) address, not the stand-in key of an entry without a link."""
    return urlsplit(link).scheme in ("http", "https")


def parse_feed(
    feed_url: str,
    content: bytes,
    *,
    fetched_at: datetime,
    content_type: str | None = None,
    seen_guids: set[str] | None = None,
    seen_links: set[str] | None = None,
) -> tuple[list[Article], Counter[str], list[str]]:
    """Articles from the downloaded bytes (feedparser detects the encoding).

    A bozo (malformed) feed keeps the entries feedparser could read; they are flagged
    `bozo_feed` and the problem is reported. `seen_*` sets dedup across calls.
    """
    counts: Counter[str] = Counter()
    errors: list[str] = []
    seen_guids = set() if seen_guids is None else seen_guids
    seen_links = set() if seen_links is None else seen_links
    if not content.strip():
        counts["empty_response"] += 1
        return [], counts, [f"{feed_url}: empty response body"]
    headers = {"content-type": content_type} if content_type else {}
    parsed = feedparser.parse(content, response_headers=headers)
    feed_flags: tuple[str, ...] = ()
    if parsed.get("bozo"):
        exc = parsed.get("bozo_exception")
        if isinstance(exc, ENCODING_ERRORS):
            counts["wrong_encoding"] += 1
            errors.append(f"{feed_url}: wrong or unknown character encoding: {exc}")
            feed_flags = ("wrong_encoding",)
        else:
            counts["bozo"] += 1
            errors.append(f"{feed_url}: malformed feed ({type(exc).__name__}: {exc})")
            feed_flags = ("bozo_feed",)
    if not parsed.entries and not parsed.get("version"):
        counts["not_a_feed"] += 1
        errors.append(f"{feed_url}: no RSS/Atom entries could be read")
        return [], counts, errors
    articles: list[Article] = []
    for number, entry in enumerate(parsed.entries, start=1):
        counts["entries"] += 1
        try:
            article = _entry_article(
                feed_url, entry, fetched_at, feed_flags, counts, seen_guids, seen_links, errors
            )
        except Exception as exc:  # one broken entry is skipped alone
            counts["skipped_malformed"] += 1
            errors.append(f"{feed_url}: entry {number} is malformed: {type(exc).__name__}: {exc}")
            continue
        if article is None:
            continue
        if held := fields_with_nul(article, ARTICLE_TEXT_FIELDS):
            counts["nul_replaced"] += 1
            errors.append(
                f"{feed_url}: entry {number} ({article.link}): NUL (U+0000) in "
                f"{', '.join(held)}, stored as U+FFFD"
            )
        articles.append(article)
    counts["articles"] = len(articles)
    return articles, counts, errors


def _entry_article(
    feed_url: str,
    entry: Mapping[str, Any],
    fetched_at: datetime,
    feed_flags: tuple[str, ...],
    counts: Counter[str],
    seen_guids: set[str],
    seen_links: set[str],
    errors: list[str],
) -> Article | None:
    """One entry's Article; None (counted) for a duplicate or an empty entry."""
    title = html_to_text(entry.get("title", ""))
    link = str(entry.get("link") or "").strip()
    guid = _entry_guid(entry, link, title)
    canonical = canonical_link(link) if link else ""
    duplicate = (
        "duplicate_guid"
        if guid in seen_guids
        else "duplicate_link"
        if canonical and canonical in seen_links
        else None
    )
    # Remember both keys even for a duplicate, so a later entry sharing either is caught.
    seen_guids.add(guid)
    if canonical:
        seen_links.add(canonical)
    if duplicate:
        counts[duplicate] += 1
        return None
    flags = list(feed_flags)
    published_at = _entry_datetime(entry)
    if published_at is None:
        published_at = fetched_at
        flags.append("date_from_fetch_time")
        counts["date_from_fetch_time"] += 1
    elif reason := implausible_date_reason(published_at, fetched_at):
        flags.append(IMPLAUSIBLE_DATE)
        counts[IMPLAUSIBLE_DATE] += 1
        errors.append(f"{feed_url}: entry {guid!r} has an implausible date: {reason}")
    summary = html_to_text(entry.get("summary", ""))
    contents = entry.get("content") or []
    body = html_to_text(" ".join(str(c.get("value", "")) for c in contents))
    if body == summary:
        body = ""
    if not summary and not body:
        flags.append("empty_body")
        counts["empty_body"] += 1
    if not title and not summary and not body:
        counts["skipped_empty"] += 1
        return None
    if not link:
        counts["keyed_by_guid"] += 1
    return Article(
        feed=feed_url,
        guid=guid,
        link=link or LINKLESS_PREFIX + guid,
        title=title,
        summary=summary,
        body=body,
        published_at=published_at,
        fetched_at=fetched_at,
        flags=tuple(flags),
    )


def fetch_feed(
    client: SourceClient,
    url: str,
    *,
    state: FeedState | None = None,
    now: datetime | None = None,
    seen_guids: set[str] | None = None,
    seen_links: set[str] | None = None,
) -> FeedResult:
    """Conditional GET of one feed; never raises for a feed's failure, reports it instead."""
    now = now or utc_now()
    state = state or FeedState(url=url)
    try:
        return _fetch_feed(client, url, state, now, seen_guids, seen_links)
    except Exception as exc:  # the feed's boundary: whatever it raises is this feed's error
        counts: Counter[str] = Counter({"fetch_failed": 1, "error": 1})
        error = f"{url}: feed failed: {type(exc).__name__}: {exc}"
        return FeedResult(feed=url, articles=[], state=state, counts=counts, errors=[error])


def _fetch_feed(
    client: SourceClient,
    url: str,
    state: FeedState,
    now: datetime,
    seen_guids: set[str] | None,
    seen_links: set[str] | None,
) -> FeedResult:
    headers: dict[str, str] = {}
    if state.etag:
        headers["If-None-Match"] = state.etag
    if state.last_modified:
        headers["If-Modified-Since"] = state.last_modified
    # One rate limit per host: feeds on different hosts do not slow each other down.
    source = f"rss:{urlsplit(url).netloc.lower()}"
    try:
        response = client.get(source, url, headers=headers)
        content = response.content
    except SourceError as exc:
        counts: Counter[str] = Counter({"fetch_failed": 1, exc.kind: 1})
        return FeedResult(feed=url, articles=[], state=state, counts=counts, errors=[str(exc)])
    if response.status_code == 304:
        return FeedResult(
            feed=url,
            articles=[],
            state=replace(state, fetched_at=now),
            not_modified=True,
            counts=Counter({"not_modified": 1}),
        )
    articles, counts, errors = parse_feed(
        url,
        content,
        fetched_at=now,
        content_type=response.headers.get("content-type"),
        seen_guids=seen_guids,
        seen_links=seen_links,
    )
    new_state = FeedState(
        url=url,
        etag=response.headers.get("ETag"),
        last_modified=response.headers.get("Last-Modified"),
        fetched_at=now,
    )
    return FeedResult(feed=url, articles=articles, state=new_state, counts=counts, errors=errors)


def fetch_feeds(
    client: SourceClient,
    urls: Iterable[str],
    *,
    states: Mapping[str, FeedState] | None = None,
    now: datetime | None = None,
) -> list[FeedResult]:
    """Fetch each feed once, deduplicating articles across feeds by guid and canonical link."""
    states = states or {}
    now = now or utc_now()
    seen_guids: set[str] = set()
    seen_links: set[str] = set()
    return [
        fetch_feed(
            client,
            url,
            state=states.get(url),
            now=now,
            seen_guids=seen_guids,
            seen_links=seen_links,
        )
        for url in dict.fromkeys(urls)
    ]
