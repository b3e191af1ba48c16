"""Full-text search over the article corpus, as of an instant: Postgres tsvector + GIN
(ranked with ts_rank_cd) or SQLite FTS5 (ranked with bm25), behind one interface.

Nothing visible only after `as_of` is ever returned: the filter on `visible_at` (the later of
the stated and the fetch time for a live article, storage.repositories.articles) is part of
every query, so a back-dated article never reaches a forecast made before it was fetched.

Decision (Postgres): a search ranks the RANKED_WINDOW newest matches before the cut-off, not
every match. Ranking every match costs a heap visit and a ts_rank_cd per match, and a query
with a frequent word matches a large share of a million-article corpus (hundreds of ms); the
newest matches come from a backward scan of the (visible_at, id) index (0006) that stops after
RANKED_WINDOW hits, or, for rare words, from the GIN index (migration 0003 gives the planner
the statistics to choose). For a forecaster the news nearest the cut-off is the most
informative, so the window costs little relevance. SQLite's FTS5 ranks every match with bm25
(its corpora are smaller; benchmarks/search_latency.py measures both).
"""

from __future__ import annotations

import re
from datetime import datetime

from sqlalchemy import Engine, bindparam, text
from sqlalchemy.orm import Session

from futureworld.domain import Article, require_utc
from storage.repositories.articles import article_from_row
from storage.tables import ArticleRow
from storage.types import UTCDateTime

RANKED_WINDOW = 50
"""Postgres ranks the most recent RANKED_WINDOW matches before the cut-off, not every match."""
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_MAX_TERMS = 16
# Bound through the column type so SQLite compares its stored (naive UTC) format exactly.
_AS_OF = bindparam("as_of", type_=UTCDateTime())


def query_terms(query: str) -> list[str]:
    """Words of a free-text query, lower-cased and de-duplicated, FTS syntax stripped."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query.lower()):
        if len(word) > 1:
            seen.setdefault(word, None)
    return list(seen)[:_MAX_TERMS]


class ArticleCorpus:
    """The search tool's backend: `search(query, as_of, k)` and `open(article_id, as_of)`."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._dialect = engine.dialect.name

    def search(self, query: str, as_of: datetime, k: int = 5) -> list[Article]:
        as_of = require_utc(as_of, "as_of")
        terms = query_terms(query)
        if not terms or k <= 0:
            return []
        with Session(self._engine) as session:
            if self._dialect == "postgresql":
                ids = self._search_postgres(session, terms, as_of, k)
            else:
                ids = self._search_sqlite(session, terms, as_of, k)
            rows = {row.id: row for row in session.query(ArticleRow).filter(ArticleRow.id.in_(ids))}
            return [article_from_row(rows[i]) for i in ids if i in rows]

    def open(self, article_id: int, as_of: datetime) -> Article | None:
        as_of = require_utc(as_of, "as_of")
        with Session(self._engine) as session:
            row = session.get(ArticleRow, article_id)
            if row is None or row.visible_at > as_of:
                return None
            return article_from_row(row)

    @staticmethod
    def _search_postgres(session: Session, terms: list[str], as_of: datetime, k: int) -> list[int]:
        tsquery = " | ".join(terms)
        rows = session.execute(
            text(
                "SELECT id FROM ("
                "  SELECT id, visible_at, search_vector FROM article"
                "  WHERE search_vector @@ to_tsquery('english', :q) AND visible_at <= :as_of"
                "  ORDER BY visible_at DESC, id DESC LIMIT :window"
                ") AS recent "
                "ORDER BY ts_rank_cd(search_vector, to_tsquery('english', :q)) DESC, "
                "visible_at DESC, id DESC LIMIT :k"
            ).bindparams(_AS_OF),
            {"q": tsquery, "as_of": as_of, "k": k, "window": max(k, RANKED_WINDOW)},
        ).all()
        return [r[0] for r in rows]

    @staticmethod
    def _search_sqlite(session: Session, terms: list[str], as_of: datetime, k: int) -> list[int]:
        match = " OR ".join(f'"{t}"' for t in terms)
        rows = session.execute(
            text(
                "SELECT article.id FROM article_fts JOIN article ON article.id = article_fts.rowid "
                "WHERE article_fts MATCH :q AND article.visible_at <= :as_of "
                "ORDER BY bm25(article_fts, 3.0, 2.0, 1.0), article.visible_at DESC, "
                "article.id DESC LIMIT :k"
            ).bindparams(_AS_OF),
            {"q": match, "as_of": as_of, "k": k},
        ).all()
        return [r[0] for r in rows]
