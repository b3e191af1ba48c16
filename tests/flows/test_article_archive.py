"""The news archive import and the leakage guard, on Postgres and SQLite: archive rows load
visible at their stated time with one error per bad row, a harvested article is visible only
once fetched, and implausible dates are flagged and reported."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select
from typer.testing import CliRunner

from flows.cli import app
from flows.stages.harvesting import harvest
from flows.stages.importing import import_articles
from futureworld.sources import publication_dates
from storage.engine import session_scope
from storage.repositories.articles import IMPLAUSIBLE_DATE as STORE_FLAG
from storage.repositories.articles import articles_between
from storage.search import ArticleCorpus
from storage.tables import ArticleRow
from tests.flows.conftest import make_context
from tests.sources.loopback_server import Reply, ScriptedServer

NOW = datetime(2026, 3, 1, 8, tzinfo=UTC)
RSS_TYPE = {"Content-Type": "application/rss+xml"}


def _rss(items: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel><title>T</title>'
        f"<link>https://wire.example/</link>{items}</channel></rss>"
    ).encode()


def _item(slug: str, title: str, pub_date: str) -> str:
    return (
        f"<item><guid>{slug}</guid><title>{title}</title>"
        f"<link>https://wire.example/{slug}</link><description>{title}.</description>"
        f"<pubDate>{pub_date}</pubDate></item>"
    )


def _stored(engine) -> dict[str, ArticleRow]:
    with session_scope(engine) as session:
        rows = session.scalars(select(ArticleRow)).all()
        session.expunge_all()
        return {row.link: row for row in rows}


def _titles(corpus: ArticleCorpus, query: str, as_of: datetime) -> list[str]:
    return sorted(a.title for a in corpus.search(query, as_of, k=20))


GOOD_ROWS = [
    {
        "title": "Glacier dam breach floods valley",
        "body": "The glacier dam gave way overnight.",
        "url": "https://news.example/glacier",
        "published_at": "2025-10-01T06:30:00Z",
        "source": "wire",
    },
    {
        "title": "Glacier melt record announced",
        "body": "",
        "url": "https://news.example/melt?utm_source=x",
        "published_at": "2025-10-03",
        "source": "",
    },
]


def test_archive_import_loads_good_rows_reports_bad_ones_and_is_idempotent(
    engine, tmp_path
) -> None:
    bad_rows = [
        '{"title": "Glacier no date", "url": "https://news.example/a", "published_at": ""}',
        json.dumps(
            {
                "title": "Glacier 1900",
                "url": "https://news.example/b",
                "published_at": "1900-01-01T00:00:00Z",
            }
        ),
        json.dumps(
            {
                "title": "Glacier 9999",
                "url": "https://news.example/c",
                "published_at": "9999-12-31T00:00:00+00:00",
            }
        ),
        json.dumps(
            {
                "title": "Glacier naive",
                "url": "https://news.example/d",
                "published_at": "2025-10-02T10:00:00",
            }
        ),
        json.dumps(
            {
                "title": "Glacier garbage",
                "url": "https://news.example/e",
                "published_at": "next tuesday",
            }
        ),
        json.dumps(
            {
                "title": "Glacier ftp",
                "url": "ftp://news.example/f",
                "published_at": "2025-10-02T10:00:00Z",
            }
        ),
        "{not json",
    ]
    lines = [json.dumps(GOOD_ROWS[0]), *bad_rows, "", json.dumps(GOOD_ROWS[1])]
    archive = tmp_path / "news.jsonl"
    archive.write_text("\n".join(lines) + "\n", encoding="utf-8")
    ctx = make_context(engine, tmp_path, as_of=NOW)

    report = import_articles(ctx, archive)

    assert (report.rows, report.inserted, report.existing) == (9, 2, 0)
    assert report.errors == [
        f"{archive} line 2: published_at: missing",
        f"{archive} line 3: published_at: implausible date: "
        "1900-01-01T00:00:00+00:00 is before 1990-01-01",
        f"{archive} line 4: published_at: implausible date: 9999-12-31T00:00:00+00:00 is more "
        f"than a day after it was seen ({NOW.isoformat()})",
        f"{archive} line 5: published_at: '2025-10-02T10:00:00' has no time zone",
        f"{archive} line 6: published_at: 'next tuesday' is not an ISO 8601 or RFC 2822 time",
        f"{archive} line 7: url: 'ftp://news.example/f' is not an http(s) URL",
        f"{archive} line 8: row: not JSON (Expecting property name enclosed in double quotes "
        "at column 2)",
    ]
    stored = _stored(engine)
    glacier = stored["https://news.example/glacier"]
    melt = stored["https://news.example/melt?utm_source=x"]
    assert glacier.visible_at == glacier.published_at == datetime(2025, 10, 1, 6, 30, tzinfo=UTC)
    assert glacier.fetched_at == NOW and glacier.feed == "wire"
    # A bare date is the end of that day; an empty source is the archive feed.
    assert melt.visible_at == datetime(2025, 10, 3, 23, 59, 59, tzinfo=UTC)
    assert melt.feed == "archive" and melt.flags == ["empty_body"]
    assert melt.guid == "https://news.example/melt"

    corpus = ArticleCorpus(engine)
    assert _titles(corpus, "glacier", datetime(2025, 10, 1, 6, 29, tzinfo=UTC)) == []
    assert _titles(corpus, "glacier", datetime(2025, 10, 2, tzinfo=UTC)) == [
        "Glacier dam breach floods valley"
    ]
    assert len(_titles(corpus, "glacier", NOW)) == 2

    again = import_articles(ctx, archive)
    assert (again.inserted, again.existing, len(again.errors)) == (0, 2, 7)
    assert len(_stored(engine)) == 2


def test_import_articles_command_reads_csv_and_answers_in_one_line(
    engine, db_url: str, tmp_path: Path
) -> None:
    archive = tmp_path / "news.csv"
    archive.write_text(
        "title,body,url,published_at,source\n"
        'Harbour strike ends,"Dockers return,\nafter a week",https://news.example/strike,'
        "2025-09-30T12:00:00+02:00,wire\n"
        "Harbour reopens,,https://news.example/reopen,0001-01-01T00:00:00Z,wire\n"
        "Harbour strike ends again,,https://news.example/strike/,2025-09-30T13:00:00Z,wire\n",
        encoding="utf-8",
    )
    runner = CliRunner()
    first = runner.invoke(app, ["import", "articles", str(archive), "--db", db_url])
    assert first.exit_code == 0, first.output
    assert "articles: 1 new, 1 already stored; rows: 3, refused: 1" in first.output
    assert f"{archive} line 4: published_at: implausible date" in first.output
    second = runner.invoke(app, ["import", "articles", str(archive), "--db", db_url])
    assert "articles: 0 new, 2 already stored" in second.output
    [row] = _stored(engine).values()
    assert row.body == "Dockers return,\nafter a week"
    assert row.visible_at == datetime(2025, 9, 30, 10, tzinfo=UTC)

    headless = tmp_path / "headless.csv"
    headless.write_text("headline,link\nA,https://news.example/x\n", encoding="utf-8")
    refused = runner.invoke(app, ["import", "articles", str(headless), "--db", db_url])
    assert refused.exit_code == 2
    assert refused.output.strip().splitlines()[-1].endswith("lacks url, published_at, title")


def test_a_back_dated_harvested_article_is_invisible_before_it_was_fetched(
    engine, tmp_path
) -> None:
    """Over real HTTP: an item fetched at NOW but dated a month earlier is found by no search
    (and opened by no agent) as of before NOW; implausible dates are flagged, reported as the
    feed's problem, and visible from the fetch."""
    feed = _rss(
        _item("backdated", "Volcano erupts near airport", "Sun, 01 Feb 2026 09:00:00 GMT")
        + _item("year1", "Volcano ash advisory", "Mon, 01 Jan 0001 00:00:00 GMT")
        + _item("year1900", "Volcano monitoring budget", "Mon, 01 Jan 1900 00:00:00 GMT")
        + _item("year9999", "Volcano flights resume", "Fri, 31 Dec 9999 00:00:00 GMT")
        + _item("tomorrow", "Volcano quiet again", "Sun, 01 Mar 2026 20:00:00 GMT")
    )
    server = ScriptedServer()
    try:
        server.route("/feed", [Reply(200, feed, RSS_TYPE)])
        url = server.base_url + "/feed"
        report = harvest(make_context(engine, tmp_path, as_of=NOW), sources=[], feeds=[url])
    finally:
        server.close()

    assert report.articles_new == 5
    assert report.per_source[f"feed:{url}"]["implausible_date"] == 3
    implausible = [e for e in report.errors if "implausible date" in e]
    assert len(implausible) == 3 and all(url in e for e in implausible)
    stored = {link.rsplit("/", 1)[1]: row for link, row in _stored(engine).items()}
    backdated = stored["backdated"]
    assert backdated.published_at == datetime(2026, 2, 1, 9, tzinfo=UTC)
    assert backdated.visible_at == NOW and "implausible_date" not in backdated.flags
    for slug in ("year1", "year1900", "year9999"):
        assert "implausible_date" in stored[slug].flags
        assert stored[slug].visible_at == NOW  # the stated date is kept but never trusted
    assert stored["year9999"].published_at.year == 9999
    # Within a day of the fetch: plausible, and visible at the later stated time.
    assert stored["tomorrow"].flags == [] and stored["tomorrow"].visible_at == NOW.replace(hour=20)

    corpus = ArticleCorpus(engine)
    before = NOW - timedelta(seconds=1)
    assert _titles(corpus, "volcano", datetime(2026, 2, 15, tzinfo=UTC)) == []
    assert _titles(corpus, "volcano", before) == []
    assert corpus.open(backdated.id, before) is None
    assert _titles(corpus, "volcano", NOW) == [
        "Volcano ash advisory",
        "Volcano erupts near airport",
        "Volcano flights resume",
        "Volcano monitoring budget",
    ]
    assert corpus.open(backdated.id, NOW).title == "Volcano erupts near airport"
    with session_scope(engine) as session:
        assert articles_between(session, datetime(2026, 1, 1, tzinfo=UTC), before) == []
        assert len(articles_between(session, before, NOW)) == 4
        assert session.scalar(select(func.count()).select_from(ArticleRow)) == 5


def test_the_store_and_the_sources_name_the_implausible_date_flag_alike() -> None:
    assert STORE_FLAG == publication_dates.IMPLAUSIBLE_DATE


def test_nul_in_a_feed_item_or_an_archive_row_is_stored_as_u_fffd_and_reported(
    engine, tmp_path
) -> None:
    """Over real HTTP and from a file, on Postgres (whose text refuses NUL) and SQLite: an RSS
    item with `&#0;` or a raw 0x00 byte, and an archive row with NUL, are stored with U+FFFD and
    reported; the good feed and rows of the same run are stored too."""
    escaped = _item("nul-escaped", "Storm&#0;front nears coast", "Sun, 01 Mar 2026 06:00:00 GMT")
    raw = _item("nul-raw", "Storm\x00surge warning", "Sun, 01 Mar 2026 06:30:00 GMT")
    good = _item("calm", "Storm passes harmlessly", "Sun, 01 Mar 2026 07:00:00 GMT")
    server = ScriptedServer()
    try:
        server.route("/nul", [Reply(200, _rss(escaped + raw), RSS_TYPE)])
        server.route("/good", [Reply(200, _rss(good), RSS_TYPE)])
        ctx = make_context(engine, tmp_path, as_of=NOW, http_max_retries=0)
        report = harvest(
            ctx, sources=[], feeds=[server.base_url + "/nul", server.base_url + "/good"]
        )
        again = harvest(
            ctx, sources=[], feeds=[server.base_url + "/nul", server.base_url + "/good"]
        )
    finally:
        server.close()
    assert report.articles_new == 3 and again.articles_new == 0
    nul_lines = [e for e in report.errors if "NUL (U+0000)" in e]
    assert len(nul_lines) == 2, report.errors
    assert all("title" in line and server.base_url + "/nul" in line for line in nul_lines)
    stored = _stored(engine)
    assert stored["https://wire.example/nul-escaped"].title == "Storm\ufffdfront nears coast"
    assert stored["https://wire.example/nul-raw"].title == "Storm\ufffdsurge warning"
    assert stored["https://wire.example/calm"].title == "Storm passes harmlessly"

    archive = tmp_path / "nul.jsonl"
    rows = [
        {**GOOD_ROWS[0], "body": "The glacier\x00dam gave way."},
        GOOD_ROWS[1],
    ]
    archive.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    imported = import_articles(ctx, archive)
    assert (imported.rows, imported.inserted) == (2, 2)
    assert imported.errors == [f"{archive} line 1: body: NUL (U+0000) stored as U+FFFD"]
    assert _stored(engine)["https://news.example/glacier"].body == "The glacier\ufffddam gave way."
    assert ArticleCorpus(engine).search("glacier dam", NOW, k=5)
