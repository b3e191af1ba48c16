"""Corpus search as of a cut-off at scale: `ArticleCorpus.search` latency on Postgres
(default 1,000,000 articles) and SQLite (default 100,000), p50/p95 over 1,000 queries.

The corpus is generated: a vocabulary of 50,000 made-up words drawn with Zipf frequencies
(s = 1.1, as in news text once stop words are gone), articles of a 6–10 word title, a 20–30
word summary and a 60–100 word body, published evenly over three years. A query is 2–3
words of one article's title (what an agent searching for a question's subject writes), as
of a cut-off drawn evenly over the time range, k = 5 (the agent's default). The same queries
run on both databases, after 50 warm-up queries.

For reference, the same queries also run, in the same process, through the queries
`ArticleCorpus` used before (each followed by reading the articles found, as it did): on
Postgres the ranked query of migration 0002 (ts_rank_cd over every match before the cut-off)
and the window of 0003 (ts_rank_cd over the 50 newest matches of any word), on SQLite bm25
over every match of any word; the report gives ArticleCorpus's p50 and p95 as ratios of each
reference's on the same queries (below 1: faster).
Target: p95 < 20 ms on Postgres.

Run: `python benchmarks/search_latency.py [--pg-articles N] [--sqlite-articles M]`; it
creates and drops its own database on the local Postgres (FW_BENCH_POSTGRES_URL) and a SQLite
file in a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import Engine, bindparam, create_engine, text
from sqlalchemy.orm import Session

from futureworld.domain import Article
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.articles import article_from_row, insert_articles
from storage.search import ArticleCorpus, query_terms
from storage.tables import ArticleRow
from storage.types import UTCDateTime

ADMIN = os.environ.get("FW_BENCH_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
START = datetime(2023, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=3 * 365)
SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")

RANK_ALL_MATCHES = (
    "SELECT id FROM article, to_tsquery('english', :q) AS q "
    "WHERE search_vector @@ q AND visible_at <= :as_of "
    "ORDER BY ts_rank_cd(search_vector, q) DESC, visible_at DESC, id DESC LIMIT :k"
)
"""ArticleCorpus's Postgres query as of migration 0002 (filtering on visible_at, 0006): every
match before the cut-off is ranked."""

NEWEST_WINDOW = (
    "SELECT id FROM ("
    "  SELECT id, visible_at, search_vector FROM article"
    "  WHERE search_vector @@ to_tsquery('english', :q) AND visible_at <= :as_of"
    "  ORDER BY visible_at DESC, id DESC LIMIT 50"
    ") AS recent "
    "ORDER BY ts_rank_cd(search_vector, to_tsquery('english', :q)) DESC, "
    "visible_at DESC, id DESC LIMIT :k"
)
"""ArticleCorpus's Postgres query from migration 0003 to the relevance ranking: the 50 newest
matches of any word before the cut-off are ranked."""

SQLITE_BM25_ANY_WORD = (
    "SELECT article.id FROM article_fts JOIN article ON article.id = article_fts.rowid "
    "WHERE article_fts MATCH :q AND article.visible_at <= :as_of "
    "ORDER BY bm25(article_fts, 3.0, 2.0, 1.0), article.visible_at DESC, "
    "article.id DESC LIMIT :k"
)
"""ArticleCorpus's SQLite query before the relevance ranking: bm25 over every match of any
word."""


@dataclass(frozen=True)
class Corpus:
    vocabulary: list[str]
    rng: np.random.Generator
    cdf: np.ndarray

    @classmethod
    def make(cls, seed: int, size: int = 50_000, zipf_s: float = 1.1) -> Corpus:
        rng = np.random.default_rng(seed)
        words: dict[str, None] = {}
        while len(words) < size:
            n = int(rng.integers(2, 5))
            words.setdefault("".join(rng.choice(SYLLABLES, n)), None)
        weights = 1.0 / np.arange(1, size + 1) ** zipf_s
        return cls(list(words), rng, np.cumsum(weights) / weights.sum())

    def text(self, n: int) -> list[str]:
        idx = np.searchsorted(self.cdf, self.rng.random(n))
        return [self.vocabulary[i] for i in idx]

    def articles(self, n: int, batch: int = 20_000) -> Iterator[list[Article]]:
        """n articles, oldest first, in batches."""
        step = SPAN / n
        for start in range(0, n, batch):
            out = []
            for i in range(start, min(n, start + batch)):
                published = START + step * i
                words = self.text(int(self.rng.integers(6, 11)) + 25 + 80)
                title, rest = words[:8], words[8:]
                out.append(
                    Article(
                        feed="bench",
                        guid=f"a{i}",
                        link=f"https://news.test/a{i}",
                        title=" ".join(title).capitalize(),
                        summary=" ".join(rest[:25]) + ".",
                        body=" ".join(rest[25:]) + ".",
                        published_at=published,
                        fetched_at=published,
                    )
                )
            yield out


@dataclass(frozen=True)
class Query:
    text: str
    as_of: datetime


def make_queries(seed: int, corpus: Corpus, n: int) -> list[Query]:
    """Title words of a random article (its title is regenerated from the same word
    distribution), cut-offs spread over the time range."""
    rng = np.random.default_rng(seed + 1)
    queries = []
    for _ in range(n):
        title = corpus.text(8)
        picked = rng.choice(len(title), size=int(rng.integers(2, 4)), replace=False)
        as_of = START + SPAN * float(rng.uniform(0.02, 1.0))
        queries.append(Query(" ".join(title[i] for i in sorted(picked)), as_of))
    return queries


def load_postgres(engine: Engine, corpus: Corpus, n: int) -> None:
    """COPY the articles (the search vector is generated by Postgres as for any insert)."""
    raw = engine.raw_connection()
    columns = "feed, guid, link, title, summary, body, published_at, fetched_at, visible_at, flags"
    try:
        for batch in corpus.articles(n):
            with (
                raw.cursor() as cursor,
                cursor.copy(f"COPY article ({columns}) FROM STDIN") as copy,
            ):
                for a in batch:
                    copy.write_row(
                        (a.feed, a.guid, a.link, a.title, a.summary, a.body, a.published_at,
                         a.fetched_at, max(a.published_at, a.fetched_at), "[]")
                    )  # fmt: skip
            raw.commit()
    finally:
        raw.close()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
        c.execute(text("VACUUM ANALYZE article"))


def load_sqlite(engine: Engine, corpus: Corpus, n: int) -> None:
    for batch in corpus.articles(n):
        with session_scope(engine) as session:
            insert_articles(session, batch)


def latencies(search: Callable[[Query], object], queries: Sequence[Query]) -> list[float]:
    for query in queries[:50]:
        search(query)
    out = []
    for query in queries:
        start = time.perf_counter()
        search(query)
        out.append((time.perf_counter() - start) * 1000)
    return out


def _report(label: str, ms: list[float]) -> None:
    q = statistics.quantiles(ms, n=100, method="inclusive")
    print(
        f"{label:52s} {q[49]:8.1f} {q[94]:8.1f} {q[98]:8.1f} {max(ms):8.1f} "
        f"{statistics.fmean(ms):8.1f}"
    )


def _reference(engine: Engine, sql: str) -> Callable[[Query], object]:
    """A former search of ArticleCorpus: one of its former queries (its words joined as the
    former code did), then the articles it found read by id, in one session as it did."""
    statement = text(sql).bindparams(bindparam("as_of", type_=UTCDateTime()))
    sqlite = engine.dialect.name == "sqlite"

    def search(query: Query) -> object:
        terms = query_terms(query.text)
        words = " OR ".join(f'"{t}"' for t in terms) if sqlite else " | ".join(terms)
        with Session(engine) as session:
            params = {"q": words, "as_of": query.as_of, "k": 5}
            ids = [r[0] for r in session.execute(statement, params)]
            rows = {r.id: r for r in session.query(ArticleRow).filter(ArticleRow.id.in_(ids))}
            return [article_from_row(rows[i]) for i in ids if i in rows]

    return search


def _compare(label: str, ms: list[float], reference: list[float]) -> None:
    """ArticleCorpus's p50 and p95 over the queries the reference ran, as ratios of its own."""
    mine = statistics.quantiles(ms[: len(reference)], n=100, method="inclusive")
    theirs = statistics.quantiles(reference, n=100, method="inclusive")
    print(
        f"  ratio to {label}: p50 {mine[49] / theirs[49]:.3f}, p95 {mine[94] / theirs[94]:.3f} "
        f"({len(reference)} queries)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pg-articles", type=int, default=1_000_000)
    parser.add_argument("--sqlite-articles", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rank-all-queries",
        type=int,
        default=100,
        help="queries timed through migration 0002's rank-every-match query (slow)",
    )
    args = parser.parse_args()
    queries = make_queries(args.seed, Corpus.make(args.seed), args.queries)
    print(f"{args.queries} queries, e.g. {queries[0].text!r} as of {queries[0].as_of:%Y-%m-%d}")
    print(f"{'ms':52s} {'p50':>8s} {'p95':>8s} {'p99':>8s} {'max':>8s} {'mean':>8s}")

    admin = create_engine(ADMIN, isolation_level="AUTOCOMMIT")
    name = f"fw_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        engine = make_engine(ADMIN.rsplit("/", 1)[0] + f"/{name}")
        upgrade_database(engine)
        start = time.perf_counter()
        load_postgres(engine, Corpus.make(args.seed), args.pg_articles)
        loaded = time.perf_counter() - start
        corpus = ArticleCorpus(engine)
        ms = latencies(lambda q: corpus.search(q.text, q.as_of, 5), queries)
        _report(f"Postgres, {args.pg_articles} articles (loaded in {loaded:.0f} s)", ms)
        pg_p95 = statistics.quantiles(ms, n=100, method="inclusive")[94]
        window = latencies(_reference(engine, NEWEST_WINDOW), queries)
        _report("  0003 query, ranks the 50 newest matches", window)
        _compare("the 0003 query", ms, window)
        if args.rank_all_queries:
            slow = latencies(_reference(engine, RANK_ALL_MATCHES), queries[: args.rank_all_queries])
            _report(f"  0002 query, ranks every match ({len(slow)} queries)", slow)
            _compare("the 0002 query", ms, slow)
        engine.dispose()
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    with tempfile.TemporaryDirectory(prefix="fw-bench-") as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'search.db'}")
        upgrade_database(engine)
        start = time.perf_counter()
        load_sqlite(engine, Corpus.make(args.seed), args.sqlite_articles)
        loaded = time.perf_counter() - start
        corpus = ArticleCorpus(engine)
        ms = latencies(lambda q: corpus.search(q.text, q.as_of, 5), queries)
        _report(f"SQLite, {args.sqlite_articles} articles (loaded in {loaded:.0f} s)", ms)
        bm25 = latencies(_reference(engine, SQLITE_BM25_ANY_WORD), queries)
        _report("  former query, bm25 over every match of any word", bm25)
        _compare("the former query", ms, bm25)
        engine.dispose()
    verdict = "met" if pg_p95 < 20.0 else "NOT met"
    print(f"target: p95 < 20 ms on Postgres: {verdict}")


if __name__ == "__main__":
    main()
