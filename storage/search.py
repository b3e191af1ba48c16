"""Full-text search over the article corpus, as of an instant: Postgres tsvector + GIN or
SQLite FTS5, behind one interface and one ranking rule. It owns the ranking; what an article
says and from when it is visible belong to storage.repositories.articles.

Nothing visible only after `as_of` is ever returned: the filter on `visible_at` (the later of
the stated and the fetch time for a live article, storage.repositories.articles) is part of
every query, so a back-dated article never reaches a forecast made before it was fetched.

The rule, on both databases. A word of the query is what the database's own tokenizer makes
of it (Postgres: the 'english' configuration the search vector was built with, stop words
dropped, words stemmed; SQLite: FTS5's porter tokenizer), at most MAX_TERMS of them.
1. Articles matching every word come first: those with more of the words in their headline
   first (SQLite: every word in the title, then the rest), then the more recently visible.
2. Then articles matching some of the words, the rarer the words they match the earlier:
   Postgres sums, over the words an article matches, ln(1 + TERM_WINDOW / n), n the word's
   matches visible at the cut-off counted up to TERM_WINDOW (a word in more than TERM_WINDOW
   articles weighs ln 2), then headline words; SQLite ranks by bm25 (title 3, summary 2,
   body 1), which weighs a word by its rarity the same way.
Remaining ties go to the more recently visible article, then the higher id.

Why not ts_rank_cd (or bm25 among articles matching every word): both count occurrences, and
stemming makes "Local reporters" a second "report" and "Industry watchers" a second
"industries", so an older article outranks the question's own evidence; bm25's length
normalisation puts a short resolution report of an earlier question first. On the research
world (tests/storage/test_search.py) entity-and-event queries find the evidence first for 0.80
of questions with this rule, 0.74 with ts_rank_cd after the word count, 0.46 with bm25.

Cost on Postgres, bounded whatever the corpus: the candidates are the ALL_TERMS_WINDOW newest
articles matching every word and, for each word alone, its TERM_WINDOW newest matches, so a
frequent word ("2026" from a date, "new") cannot crowd out a rare one's matches (an entity's
name brings all its recent articles). Each window is one statement the planner runs either as
a GIN bitmap (rare words) or as a backward scan of the (visible_at, id) index (migration 0006)
that stops after the window (frequent words), choosing from the search vector's statistics
(target 1000, migration 0003); plan_cache_mode = force_custom_plan keeps it from reusing a
generic plan that knows no word. A search visits at most ALL_TERMS_WINDOW + MAX_TERMS x
TERM_WINDOW rows (benchmarks/search_latency.py). SQLite's FTS5 reads every match of the
query's words (its corpora are smaller; the benchmark measures both).
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

ALL_TERMS_WINDOW = 500
"""Postgres ranks the newest ALL_TERMS_WINDOW articles matching every word of the query (all
of them when there are fewer)."""
TERM_WINDOW = 50
"""Postgres also ranks, for each word of the query, its newest TERM_WINDOW matches."""
MAX_TERMS = 16
"""Words of a query beyond the first MAX_TERMS are ignored."""
MAX_QUERY_CHARS = 1000
"""Text of a query beyond its first MAX_QUERY_CHARS characters is ignored."""
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Bound through the column type so SQLite compares its stored (naive UTC) format exactly.
_AS_OF = bindparam("as_of", type_=UTCDateTime())


def query_terms(query: str) -> list[str]:
    """Words of a free-text query, lower-cased and de-duplicated, FTS syntax stripped."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(query[:MAX_QUERY_CHARS].lower()):
        if len(word) > 1:
            seen.setdefault(word, None)
    return list(seen)[:MAX_TERMS]


def tsquery_literal(lexemes: list[str], operator: str) -> str:
    """A tsquery's text joining already normalised lexemes with `operator` (`&` or `|`):
    each quoted, embedded quotes and backslashes doubled, so none is parsed or stemmed again."""
    quoted = ("'" + lex.replace("\\", "\\\\").replace("'", "''") + "'" for lex in lexemes)
    return f" {operator} ".join(quoted)


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
                ids = self._search_postgres(session, query, as_of, k)
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
    def _search_postgres(session: Session, query: str, as_of: datetime, k: int) -> list[int]:
        lexemes = postgres_lexemes(session, query)
        if not lexemes:
            return []
        session.execute(text("SET LOCAL plan_cache_mode = force_custom_plan"))
        params: dict[str, object] = {"as_of": as_of, "k": k, "term_window": TERM_WINDOW}
        params["all"], params["all_window"] = tsquery_literal(lexemes, "&"), ALL_TERMS_WINDOW
        windows = [f"w_all AS {_newest_matches('all', 'all_window')}"]
        every, rarity, headline = [], [], []
        for i, lexeme in enumerate(lexemes):
            params[f"t{i}"] = tsquery_literal([lexeme], "&")
            params[f"h{i}"] = params[f"t{i}"] + ":A"
            windows.append(f"w{i} AS {_newest_matches(f't{i}', 'term_window')}")
            every.append(f"(SELECT id FROM w{i})")
            matched = f"(a.search_vector @@ CAST(:t{i} AS tsquery))"
            # The word's rarity: ln(1 + TERM_WINDOW / its matches, counted up to TERM_WINDOW).
            matches = f"greatest(1, (SELECT count(*) FROM w{i}))"
            rarity.append(f"{matched}::int * ln(1 + CAST(:term_window AS float8) / {matches})")
            headline.append(f"(a.search_vector @@ CAST(:h{i} AS tsquery))::int")
        rows = session.execute(
            text(
                f"WITH {', '.join(windows)}, "
                f"candidate AS (SELECT id FROM w_all UNION {' UNION '.join(every)}) "
                "SELECT a.id FROM article a JOIN candidate USING (id) "
                "ORDER BY (a.search_vector @@ CAST(:all AS tsquery)) DESC, "
                f"{' + '.join(rarity)} DESC, {' + '.join(headline)} DESC, "
                "a.visible_at DESC, a.id DESC LIMIT :k"
            ).bindparams(_AS_OF),
            params,
        ).all()
        return [r[0] for r in rows]

    @staticmethod
    def _search_sqlite(session: Session, terms: list[str], as_of: datetime, k: int) -> list[int]:
        quoted = [f'"{t}"' for t in terms]
        newest = "article.visible_at DESC, article.id DESC"
        tiers = [
            (" AND ".join(f"title : {q}" for q in quoted), newest),
            (" AND ".join(quoted), newest),
            (" OR ".join(quoted), f"bm25(article_fts, 3.0, 2.0, 1.0), {newest}"),
        ]
        ids: list[int] = []
        for match, order in tiers:
            if len(ids) >= k:
                break
            rows = session.execute(
                text(
                    "SELECT article.id FROM article_fts "
                    "JOIN article ON article.id = article_fts.rowid "
                    "WHERE article_fts MATCH :q AND article.visible_at <= :as_of "
                    f"AND article.id NOT IN :seen ORDER BY {order} LIMIT :k"
                ).bindparams(_AS_OF, bindparam("seen", expanding=True)),
                {"q": match, "as_of": as_of, "k": k - len(ids), "seen": ids},
            ).all()
            ids.extend(r[0] for r in rows)
        return ids


def postgres_lexemes(session: Session, query: str) -> list[str]:
    """The lexemes Postgres's 'english' configuration makes of `query`, in the order their
    words first appear, at most MAX_TERMS: the words a search vector would hold."""
    rows = session.execute(
        text(
            "SELECT lexeme FROM unnest(to_tsvector('english', :q)) "
            "ORDER BY positions[1], lexeme LIMIT :n"
        ),
        {"q": query[:MAX_QUERY_CHARS].replace("\x00", " "), "n": MAX_TERMS},
    ).all()
    return [r[0] for r in rows]


def _newest_matches(query_param: str, window_param: str) -> str:
    return (
        f"(SELECT id FROM article WHERE search_vector @@ CAST(:{query_param} AS tsquery) "
        f"AND visible_at <= :as_of ORDER BY visible_at DESC, id DESC LIMIT :{window_param})"
    )
