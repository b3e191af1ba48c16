"""The agent's tools: the corpus protocol and how results are shown to the model.

Storage implements `Corpus` over Postgres/SQLite full-text search; `InMemoryCorpus` is a
small reference implementation for tests, benchmarks and the simulated world.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import numpy as np

from futureworld.domain import Article, require_utc


@runtime_checkable
class Corpus(Protocol):
    """Article search that never returns anything published after `as_of`."""

    def search(self, query: str, as_of: datetime, k: int) -> list[Article]:
        """Up to k articles matching `query`, best first, all published at or before as_of."""
        ...

    def open(self, article_id: int, as_of: datetime) -> Article | None:
        """The article with this id, or None if it does not exist or is later than as_of."""
        ...


def format_search_results(query: str, articles: Iterable[Article], snippet_chars: int = 240) -> str:
    """Numbered short snippets with article ids, dates and titles."""
    lines = [f"Search results for: {query}"]
    for rank, article in enumerate(articles, start=1):
        snippet = _squash(article.summary or article.body)[:snippet_chars]
        lines.append(
            f"{rank}. [id {article.id}] {article.published_at:%Y-%m-%d} {article.title}"
            + (f" — {snippet}" if snippet else "")
        )
    if len(lines) == 1:
        lines.append("No articles found.")
    return "\n".join(lines)


def format_article(article: Article) -> str:
    """The full article and its publisher (the host of its feed); the loop truncates long ones
    to the observation budget. The host, not the feed's URL: a reader needs the publisher, and
    a URL can carry what says nothing about the news (the demo's world is served on a free
    port, different on every run, which made two runs of one seed part at the first article
    opened)."""
    text = article.body or article.summary
    return (
        f"[id {article.id}] {article.title}\n"
        f"Published {article.published_at:%Y-%m-%d %H:%M} UTC ({publisher(article.feed)})\n\n"
        f"{text.strip()}"
    )


def publisher(feed: str) -> str:
    """The host of a feed's URL (lower case, without port or path); a feed named otherwise,
    as given."""
    return urlsplit(feed).hostname or feed


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


_WORD = re.compile(r"\w+")


class InMemoryCorpus:
    """Word-overlap search over a list of articles, filtered by `published_at <= as_of`.

    Ranking: more of the query's distinct words first, then the more recently published, then
    the lower id. The words index their articles (arrays of positions), so a search counts
    only the articles that share a word with the query, in numpy: the research demo's panel
    and warm start search corpora of thousands of articles with queries whose common words
    ("will", "by") each name most of them."""

    def __init__(self, articles: Iterable[Article]) -> None:
        self._articles = {a.id: a for a in articles}
        if None in self._articles:
            raise ValueError("InMemoryCorpus needs articles with ids")
        self._by_position = list(self._articles.values())
        self._ids = np.array([a.id for a in self._by_position], dtype=np.int64)
        self._published = np.array(
            [a.published_at.timestamp() for a in self._by_position], dtype=np.float64
        )
        postings: dict[str, list[int]] = {}
        for position, a in enumerate(self._by_position):
            for word in set(_WORD.findall(f"{a.title} {a.summary} {a.body}".lower())):
                postings.setdefault(word, []).append(position)
        self._postings = {w: np.array(p, dtype=np.intp) for w, p in postings.items()}

    def search(self, query: str, as_of: datetime, k: int) -> list[Article]:
        as_of = require_utc(as_of, "as_of")
        lists = [
            self._postings[term]
            for term in set(_WORD.findall(query.lower()))
            if term in self._postings
        ]
        if not lists or k < 1:
            return []
        shared = np.bincount(np.concatenate(lists), minlength=len(self._by_position))
        shared[self._published > as_of.timestamp()] = 0
        best: list[int] = []
        for level in range(int(shared.max()), 0, -1):  # most shared words first
            tied = np.flatnonzero(shared == level)
            # lexsort's last key is its first: the newest, then the lowest id
            best += tied[np.lexsort((self._ids[tied], -self._published[tied]))].tolist()
            if len(best) >= k:
                break
        return [self._by_position[p] for p in best[:k]]

    def open(self, article_id: int, as_of: datetime) -> Article | None:
        as_of = require_utc(as_of, "as_of")
        article = self._articles.get(article_id)
        if article is None or article.published_at > as_of:
            return None
        return article
