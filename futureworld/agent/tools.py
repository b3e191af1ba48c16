"""The agent's tools: the corpus protocol and how results are shown to the model.

Storage implements `Corpus` over Postgres/SQLite full-text search; `InMemoryCorpus` is a
small reference implementation for tests, benchmarks and the simulated world.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Protocol, runtime_checkable

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
    """The full article; the loop truncates long ones to the observation budget."""
    text = article.body or article.summary
    return (
        f"[id {article.id}] {article.title}\n"
        f"Published {article.published_at:%Y-%m-%d %H:%M} UTC ({article.feed})\n\n{text.strip()}"
    )


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


_WORD = re.compile(r"\w+")


class InMemoryCorpus:
    """Word-overlap search over a list of articles, filtered by `published_at <= as_of`."""

    def __init__(self, articles: Iterable[Article]) -> None:
        self._articles = {a.id: a for a in articles}
        if None in self._articles:
            raise ValueError("InMemoryCorpus needs articles with ids")
        self._words = {
            i: set(_WORD.findall(f"{a.title} {a.summary} {a.body}".lower()))
            for i, a in self._articles.items()
        }

    def search(self, query: str, as_of: datetime, k: int) -> list[Article]:
        as_of = require_utc(as_of, "as_of")
        terms = set(_WORD.findall(query.lower()))
        scored = [
            (len(terms & self._words[i]), a.published_at, i)
            for i, a in self._articles.items()
            if a.published_at <= as_of
        ]
        scored = [s for s in scored if s[0] > 0]
        scored.sort(key=lambda s: (-s[0], -s[1].timestamp(), s[2]))
        return [self._articles[i] for _, _, i in scored[:k]]

    def open(self, article_id: int, as_of: datetime) -> Article | None:
        as_of = require_utc(as_of, "as_of")
        article = self._articles.get(article_id)
        if article is None or article.published_at > as_of:
            return None
        return article
