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
   matches visible at the cut-off counted up to TERM_WINDOW (a word with TERM_WINDOW matches
   or more weighs ln 2), then counts headline words; SQLite ranks by bm25 (title 3,
   summary 2, body 1), whose inverse document frequency weighs words in the same spirit.
Remaining ties go to the more recently visible article, then the higher id.

Why not ts_rank_cd (or bm25 among articles matching every word): both count occurrences, and
stemming makes "Local reporters" a second "report" and "Industry watchers" a second
"industries", so an older article outranks the question's own evidence; bm25's length
normalisation puts a short resolution report of an earlier question first. On 50 questions of
the research world (tests/storage/test_search.py) "<entity> <event>" finds the question's own
evidence first for 0.80 of them with this rule (both databases), 0.74 with ts_rank_cd after
the word count (Postgres), 0.46 with bm25 alone (SQLite).

Cost on Postgres, bounded whatever the corpus: the candidates are the RANKED_WINDOW newest
articles matching every word and, for each word alone, its TERM_WINDOW newest matches, so a
frequent word ("2026" from a date, "new") cannot crowd out a rare one's matches (an entity's
name brings its recent articles). Each window is one part of the statement the planner runs
either as a GIN bitmap (rare words) or as a backward scan of the (visible_at, id) index
(migration 0006) that stops once the window is full (frequent words), choosing from the search
vector's statistics (target 1000, migration 0003); plan_cache_mode = force_custom_plan keeps it
from reusing a generic plan that knows no word. At most RANKED_WINDOW + MAX_TERMS x TERM_WINDOW
candidates are ranked, but filling a window of a word (or of all words) in a fraction f of the
articles visits about window / f rows, or all f x N of them through the GIN bitmap, whichever
the planner finds cheaper: a search costs about twice what the former ranking of the 50 newest
matches of any word cost, which ignored the rarer words (benchmarks/search_latency.py).
SQLite's FTS5 reads every match of the query's words (its corpora are smaller).
"""

from __future__ import annotations

import re
from datetime import datetime

from sqlalchemy import Connection, Engine, TextClause, bindparam, text
from sqlalchemy.orm import Session

from futureworld.domain import Article, require_utc
from storage.repositories.articles import article_from_row
from storage.tables import ArticleRow
from storage.types import UTCDateTime

RANKED_WINDOW = 50
"""Postgres ranks the RANKED_WINDOW newest articles matching every word of the query (all of
them where there are fewer)..."""
TERM_WINDOW = 10
"""...and, for each of its words, the TERM_WINDOW newest articles matching it."""
MAX_TERMS = 16
"""Words of a query beyond the first MAX_TERMS are ignored."""
MAX_QUERY_CHARS = 1000
"""Text of a query beyond its first MAX_QUERY_CHARS characters is ignored."""
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# Bound through the column type so SQLite compares its stored (naive UTC) format exactly.
_AS_OF = bindparam("as_of", type_=UTCDateTime())
_COLUMNS = ", ".join(f"a.{column.name}" for column in ArticleRow.__table__.columns)
_NEWEST = "a.visible_at DESC, a.id DESC"


def _sqlite_tier(order: str) -> TextClause:
    """One tier of the SQLite search: the articles matching an FTS5 query, visible at the
    cut-off, in `order`, typed by the article table's columns. Built once, so SQLAlchemy's
    compiled form and sqlite3's prepared statement are reused by every search."""
    return (
        text(
            f"SELECT {_COLUMNS} FROM article_fts JOIN article a ON a.id = article_fts.rowid "
            f"WHERE article_fts MATCH :q AND a.visible_at <= :as_of ORDER BY {order} LIMIT :k"
        )
        .bindparams(_AS_OF)
        .columns(*ArticleRow.__table__.columns)
    )


_SQLITE_NEWEST = _sqlite_tier(_NEWEST)
_SQLITE_BM25 = _sqlite_tier(f"bm25(article_fts, 3.0, 2.0, 1.0), {_NEWEST}")


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
        if self._dialect != "postgresql":
            with self._engine.connect() as connection:
                return _search_sqlite(connection, terms, as_of, k)
        with Session(self._engine) as session:
            return self._search_postgres(session, query, as_of, k)

    def open(self, article_id: int, as_of: datetime) -> Article | None:
        as_of = require_utc(as_of, "as_of")
        with Session(self._engine) as session:
            row = session.get(ArticleRow, article_id)
            if row is None or row.visible_at > as_of:
                return None
            return article_from_row(row)

    @staticmethod
    def _search_postgres(session: Session, query: str, as_of: datetime, k: int) -> list[Article]:
        lexemes = postgres_lexemes(session, query)
        if not lexemes:
            return []
        params: dict[str, object] = {
            "as_of": as_of,
            "k": k,
            "window": RANKED_WINDOW,
            "term_window": TERM_WINDOW,
        }
        params["all"] = tsquery_literal(lexemes, "&")
        windows, every, rarity, headline = [], [], [], []
        if len(lexemes) > 1:  # else the word's own window is the all-words window
            windows.append(f"w_all AS {_newest_matches('all', 'window')}")
            every.append("SELECT id FROM w_all")
        for i, lexeme in enumerate(lexemes):
            params[f"t{i}"] = tsquery_literal([lexeme], "&")
            params[f"h{i}"] = params[f"t{i}"] + ":A"
            windows.append(
                f"w{i} AS {_newest_matches(f't{i}', 'term_window' if windows else 'window')}"
            )
            every.append(f"SELECT id FROM w{i}")
            # The word's rarity: ln(1 + TERM_WINDOW / its matches, counted up to TERM_WINDOW).
            matches = f"greatest(1, (SELECT count(*) FROM w{i}))"
            rarity.append(
                f"(v @@ CAST(:t{i} AS tsquery))::int "
                f"* ln(1 + CAST(:term_window AS float8) / {matches})"
            )
            headline.append(f"(v @@ CAST(:h{i} AS tsquery))::int")
        # Each candidate's vector is decompressed once (`|| ''` makes a plain copy), not once
        # per word it is tested for; only the k best rows are read whole.
        statement = text(
            f"WITH {', '.join(windows)}, candidate AS MATERIALIZED ("
            "  SELECT id, visible_at, search_vector || ''::tsvector AS v FROM article"
            f"  WHERE id IN ({' UNION ALL '.join(every)})"
            "), best AS ("
            "  SELECT id, row_number() OVER (ORDER BY (v @@ CAST(:all AS tsquery)) DESC, "
            f"  {' + '.join(rarity)} DESC, {' + '.join(headline)} DESC, "
            "  visible_at DESC, id DESC) AS place FROM candidate"
            ") "
            f"SELECT {_COLUMNS} FROM article a JOIN best USING (id) "
            "WHERE best.place <= :k ORDER BY best.place"
        ).bindparams(_AS_OF)
        return _articles(session, statement, params)


def postgres_lexemes(session: Session, query: str) -> list[str]:
    """The lexemes Postgres's 'english' configuration makes of `query`, in the order their
    words first appear, at most MAX_TERMS: the words a search vector would hold.

    In the same round trip, the session's transaction is set to plan every later statement
    for its own parameter values (SET LOCAL plan_cache_mode = force_custom_plan)."""
    rows = session.execute(
        text(
            "SELECT lexeme FROM unnest(to_tsvector('english', :q)), "
            "set_config('plan_cache_mode', 'force_custom_plan', true) AS mode "
            "ORDER BY positions[1], lexeme LIMIT :n"
        ),
        {"q": query[:MAX_QUERY_CHARS].replace("\x00", " "), "n": MAX_TERMS},
    ).all()
    return [r[0] for r in rows]


def _articles(session: Session, statement: TextClause, params: dict[str, object]) -> list[Article]:
    """The articles a textual query selecting _COLUMNS returns, in its order."""
    typed = statement.columns(*ArticleRow.__table__.columns)
    return [article_from_row(row) for row in session.execute(typed, params)]


def _search_sqlite(
    connection: Connection, terms: list[str], as_of: datetime, k: int
) -> list[Article]:
    """The rule's tiers on FTS5, each asked only while fewer than k articles are found: every
    word in the title, every word anywhere (newest first), then any word (bm25). A tier adds
    the first k - n of its articles that are not among the n found before; at most n of its
    first k are, so its first k hold them, no statement has to exclude the found ones, and
    each tier is one statement, prepared once."""
    quoted = [f'"{t}"' for t in terms]
    tiers = [
        (" AND ".join(f"title : {q}" for q in quoted), _SQLITE_NEWEST),
        (" AND ".join(quoted), _SQLITE_NEWEST),
    ]
    if len(quoted) > 1:
        tiers.append((" OR ".join(quoted), _SQLITE_BM25))
    found: dict[int, Article] = {}
    for match, statement in tiers:
        if len(found) >= k:
            break
        for row in connection.execute(statement, {"q": match, "as_of": as_of, "k": k}):
            if len(found) < k and row.id not in found:
                found[row.id] = article_from_row(row)
    return list(found.values())


def _newest_matches(query_param: str, window_param: str) -> str:
    return (
        f"(SELECT id FROM article WHERE search_vector @@ CAST(:{query_param} AS tsquery) "
        f"AND visible_at <= :as_of ORDER BY visible_at DESC, id DESC LIMIT :{window_param})"
    )
