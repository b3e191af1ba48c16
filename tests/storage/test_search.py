"""Corpus search on real Postgres and SQLite: articles matching every word of a query rank
first however many recent articles share one frequent word of it, nothing visible after the
as-of is returned, and the research world's evidence is found from its question's words."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text

from futureworld.domain import Article
from futureworld.world import ArticleKind, SimQuestion, World, WorldConfig
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.articles import Visibility, insert_articles
from storage.search import RANKED_WINDOW, ArticleCorpus, tsquery_literal
from tests.conftest import POSTGRES_ADMIN_URL

AS_OF = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
BASE_URL = "http://127.0.0.1:9"


def article(guid: str, title: str, summary: str, at: datetime, **kwargs: object) -> Article:
    values: dict[str, object] = dict(
        feed="f",
        guid=guid,
        link=f"https://news.test/{guid}",
        title=title,
        summary=summary,
        body=f"{summary} More to follow.",
        published_at=at,
        fetched_at=at,
    )
    values.update(kwargs)
    return Article(**values)  # type: ignore[arg-type]


def recent_chatter(n: int, words: str) -> list[Article]:
    """n articles of the last n minutes before AS_OF that share `words` and nothing else."""
    return [
        article(
            f"chatter-{i}",
            f"{words} roundup number {i}",
            f"Item {i} of the {words} roundup for 2026: markets and weather.",
            AS_OF - timedelta(minutes=i + 1),
        )
        for i in range(n)
    ]


def relevant(hours_old: list[float]) -> list[Article]:
    return [
        article(
            f"relevant-{h}",
            f"Analysts see high odds that Farrow Holdings will raise its prices (note {j})",
            "Analysts rate the chance that Farrow Holdings will raise its prices by "
            "2026-03-20 as high.",
            AS_OF - timedelta(hours=h),
        )
        for j, h in enumerate(hours_old)
    ]


def guids(found: list[Article]) -> list[str]:
    return [a.guid for a in found]


def test_articles_with_every_word_outrank_many_recent_ones_sharing_a_frequent_word(engine) -> None:
    # Far more recent "2026 new" articles than any window: the old newest-50-matches ranking
    # saw none of the relevant articles for a query holding either word.
    chatter = recent_chatter(3 * RANKED_WINDOW, "new 2026")
    evidence = relevant([1.5, 12.0, 36.0])
    with session_scope(engine) as session:
        insert_articles(session, [*chatter, *evidence])
    corpus = ArticleCorpus(engine)
    newest_first = [a.guid for a in evidence]
    for query in (
        "Will Farrow Holdings raise its prices by 2026-03-20?",
        "new Farrow Holdings prices 2026",
        "Farrow Holdings raise its prices",
    ):
        assert guids(corpus.search(query, AS_OF, k=3)) == newest_first, query
    # With k past the relevant ones, what follows are the articles matching fewer words.
    found = guids(corpus.search("new Farrow Holdings prices 2026", AS_OF, k=5))
    assert found[:3] == newest_first and all(g.startswith("chatter-") for g in found[3:])
    # A query of the frequent words alone still returns the newest of their matches.
    assert guids(corpus.search("new 2026 roundup", AS_OF, k=2)) == ["chatter-0", "chatter-1"]


def test_more_of_the_query_words_outrank_newer_articles_with_fewer(engine) -> None:
    chatter = recent_chatter(2 * RANKED_WINDOW, "2026")
    older = [
        article(
            "two-words",
            "Farrow Holdings profit warning",
            "Farrow said 2026 looks weak.",
            AS_OF - timedelta(hours=30),
        ),
        article(
            "one-word",
            "Farrow Holdings hires",
            "A new chief of staff.",
            AS_OF - timedelta(hours=20),
        ),
    ]
    with session_scope(engine) as session:
        insert_articles(session, [*chatter, *older])
    found = guids(ArticleCorpus(engine).search("Farrow merger talks 2026", AS_OF, k=3))
    # No article holds every word; "farrow" and "2026" beat "farrow" alone, then newest first.
    assert found[:2] == ["two-words", "one-word"]


def test_words_in_the_headline_rank_before_the_same_words_in_the_body(engine) -> None:
    at = AS_OF - timedelta(hours=5)
    with session_scope(engine) as session:
        insert_articles(
            session,
            [
                article("body", "Market wrap", "Glacier dam inspection passed.", at),
                article(
                    "headline",
                    "Glacier dam inspection passed",
                    "Engineers said.",
                    at - timedelta(hours=3),
                ),
            ],
        )
    found = guids(ArticleCorpus(engine).search("glacier dam inspection", AS_OF, k=2))
    assert found == ["headline", "body"]


def test_the_as_of_hides_every_article_visible_after_it(engine) -> None:
    chatter = recent_chatter(RANKED_WINDOW + 20, "new 2026")
    evidence = relevant([2.0, 30.0])
    later = [
        article("after", evidence[0].title, evidence[0].summary, AS_OF + timedelta(seconds=1)),
        # Stated an hour before the as-of but first fetched a minute after it: a live harvest
        # makes it visible at its fetch.
        article(
            "fetched-after",
            evidence[0].title,
            evidence[0].summary,
            AS_OF - timedelta(hours=1),
            fetched_at=AS_OF + timedelta(minutes=1),
        ),
    ]
    with session_scope(engine) as session:
        insert_articles(session, [*chatter, *evidence, *later], visibility=Visibility.FIRST_SEEN)
    corpus = ArticleCorpus(engine)
    query = "Will Farrow Holdings raise its prices by 2026-03-20?"
    assert guids(corpus.search(query, AS_OF, k=3))[:2] == [a.guid for a in evidence]
    assert not {"after", "fetched-after"} & set(guids(corpus.search(query, AS_OF, k=50)))
    later_found = guids(corpus.search(query, AS_OF + timedelta(minutes=1), k=4))
    assert later_found[:3] == ["fetched-after", "after", evidence[0].guid]
    # Earlier than every relevant article: only chatter older than the cut-off is left.
    early = AS_OF - timedelta(hours=40)
    assert corpus.search(query, early, k=5) == []


def test_query_syntax_and_quotes_are_words_not_operators(engine) -> None:
    with session_scope(engine) as session:
        insert_articles(session, relevant([3.0]))
    corpus = ArticleCorpus(engine)
    for query in (
        "Farrow's (prices) & | ! <-> : * \\ \" NEAR OR AND",
        "farrow\x00prices",
        "'farrow' -prices:*",
    ):
        assert guids(corpus.search(query, AS_OF, k=2)) == ["relevant-3.0"], query
    assert corpus.search("!!! '' :*", AS_OF, k=2) == []


def test_tsquery_literals_keep_quotes_and_backslashes_of_a_lexeme(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    lexemes = ["o'brien", "back\\slash", "a:b", "-01", "x&y|z"]
    with engine.connect() as c:
        for lexeme in lexemes:
            matches = c.execute(
                text(
                    "SELECT array_to_tsvector(CAST(:mine AS text[])) @@ CAST(:q AS tsquery), "
                    "array_to_tsvector(CAST(:other AS text[])) @@ CAST(:q AS tsquery)"
                ),
                {
                    "mine": [lexeme],
                    "other": ["brien", "slash", "a", "01", "x"],
                    "q": tsquery_literal([lexeme], "&"),
                },
            ).one()
            assert tuple(matches) == (True, False), lexeme
        every = c.execute(
            text("SELECT array_to_tsvector(CAST(:lex AS text[])) @@ CAST(:q AS tsquery)"),
            {"lex": lexemes, "q": tsquery_literal(lexemes, "&")},
        ).scalar_one()
    engine.dispose()
    assert every is True


# -- the research world ------------------------------------------------------------------------

RESEARCH_LAST_DAY = 11
"""The corpus holds what the research world published by the start of this day; the questions
are the first 50 posed on the three days before it."""


@dataclass(frozen=True)
class Retrieval:
    questions: list[SimQuestion]
    evidence: dict[str, set[str]]
    found: dict[tuple[str, str, str], list[str]]
    """(database, query form, external id) -> the top five guids as of the question's cut-off."""

    def share(self, database: str, form: str, k: int) -> float:
        hits = [
            bool(self.evidence[q.external_id] & set(self.found[database, form, q.external_id][:k]))
            for q in self.questions
        ]
        return sum(hits) / len(hits)


QUERY_FORMS = {
    "entity_event": lambda q: f"{q.entity} {q.event}",
    "title": lambda q: q.title,
}


def _search_research_world(engine: Engine, world: World, asked: list[SimQuestion], database: str):
    published = world.articles_published_by(world.day_start(RESEARCH_LAST_DAY))
    with session_scope(engine) as session:
        # As a live harvest stores them, each fetched when it was published.
        fetched = [a.to_domain(base_url=BASE_URL, fetched_at=a.published_at) for a in published]
        insert_articles(session, fetched, visibility=Visibility.FIRST_SEEN)
    corpus = ArticleCorpus(engine)
    found = {}
    for form, make_query in QUERY_FORMS.items():
        for q in asked:
            top = corpus.search(make_query(q), q.created_at, k=5)
            assert all(a.published_at <= q.created_at for a in top)
            found[database, form, q.external_id] = guids(top)
    return found


@pytest.fixture(scope="module")
def research_retrieval() -> Iterator[Retrieval]:
    """The same research-world corpus on a Postgres database of its own and on SQLite."""
    world = World(WorldConfig(research=True, seed=0))
    asked = [
        q
        for day in range(RESEARCH_LAST_DAY - 3, RESEARCH_LAST_DAY)
        for q in world.questions_posed_on(day)
    ][:50]
    evidence = {
        q.external_id: {
            a.guid
            for a in world.articles_published_by(q.created_at)
            if a.question_id == q.external_id and a.kind is ArticleKind.EVIDENCE
        }
        for q in asked
    }
    found = {}
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"fw_test_search_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        engine = make_engine(POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}")
        upgrade_database(engine)
        found |= _search_research_world(engine, world, asked, "postgres")
        engine.dispose()
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    with tempfile.TemporaryDirectory(prefix="fw-search-") as folder:
        engine = make_engine(f"sqlite:///{Path(folder) / 'search.db'}")
        upgrade_database(engine)
        found |= _search_research_world(engine, world, asked, "sqlite")
        engine.dispose()
    yield Retrieval(asked, evidence, found)


@pytest.mark.parametrize("database", ["postgres", "sqlite"])
@pytest.mark.parametrize("form", list(QUERY_FORMS))
def test_research_world_evidence_is_in_the_top_five(research_retrieval, database, form) -> None:
    # Measured (50 questions of days 8-10, seed 0): top-5 1.00 for both forms on both
    # databases; top-1 0.98 for the title and 0.80 for entity and event, where the 0.20 is
    # another question's evidence about the same entity and event posed a little later.
    assert research_retrieval.share(database, form, k=5) >= 0.9
    assert research_retrieval.share(database, form, k=1) >= (0.9 if form == "title" else 0.7)


def test_postgres_and_sqlite_rank_the_research_world_alike(research_retrieval) -> None:
    same_first = overlap = 0
    for (database, form, external_id), pg in research_retrieval.found.items():
        if database != "postgres":
            continue
        lite = research_retrieval.found["sqlite", form, external_id]
        same_first += bool(pg) and bool(lite) and pg[0] == lite[0]
        overlap += len(set(pg) & set(lite)) / max(1, len(pg))
    n = len(research_retrieval.found) // 2
    # Measured: the same first article for 1.00 of the queries, 0.77 of the top five shared (the
    # tail of partial matches differs: Postgres ranks each word's newest few, SQLite all).
    assert same_first / n >= 0.9
    assert overlap / n >= 0.7
