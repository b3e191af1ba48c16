"""Harvest and resolve through the real source adapters against the simulated world served
on loopback (RSS + Manifold API), on Postgres and SQLite."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from flows.context import build_context
from flows.settings import Settings
from flows.stages.harvesting import harvest
from flows.stages.resolving import ManualVerdict, resolve, resolve_manually
from futureworld.domain import QuestionStatus
from futureworld.world import SimClock, World, WorldConfig, serve_world
from storage.engine import session_scope
from storage.repositories.events import event_counts
from storage.repositories.questions import list_questions
from storage.tables import ArticleRow, OutcomeRow, QuestionRow
from tests.flows.conftest import make_context


def _count(engine, table) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_harvest_and_resolve_the_served_world_idempotently(engine, tmp_path) -> None:
    world = World(WorldConfig(seed=3, questions_per_day=6, cancel_rate=0.2))
    clock = SimClock(world.day_start(2) + timedelta(hours=12))
    with serve_world(world, clock) as server:
        settings = dict(
            manifold_base_url=server.manifold_base_url,
            polymarket_base_url=_dead_url(),
            http_max_retries=0,
            http_timeout_s=2,
        )
        day2 = build_context(
            Settings(data_dir=tmp_path, **settings), engine, as_of=clock.now(), run_key="day-2"
        )
        feeds = [server.feed_urls["all"]]
        first = harvest(day2, sources=["manifold", "polymarket"], feeds=feeds)
        assert first.questions_new == len(world.questions_posed_by(clock.now())) > 0
        assert first.articles_new > 0
        assert any(e.startswith("polymarket:") for e in first.errors)
        again = harvest(day2, sources=["manifold"], feeds=feeds)
        assert again.questions_new == 0 and again.articles_new == 0
        assert _count(engine, QuestionRow) == first.questions_new
        assert _count(engine, ArticleRow) == first.articles_new
        with session_scope(engine) as session:
            failures = event_counts(session, "day-2")
        assert sum(n for (stage, source, _), n in failures.items() if source == "polymarket") >= 1

        clock.advance(days=9)
        day11 = day2.at(clock.now(), run_key="day-11")
        report = resolve(day11)
        assert report.checked == first.questions_new
        assert report.outcomes_recorded == report.checked
        assert report.annulled >= 1
        assert resolve(day11).outcomes_recorded == 0
        assert _count(engine, OutcomeRow) == report.outcomes_recorded

    with session_scope(engine) as session:
        questions = list_questions(session)
    by_id = {q.external_id: q for q in questions}
    for external_id, question in by_id.items():
        truth = world.resolution_as_of(external_id, clock.now())
        expected = QuestionStatus.ANNULLED if truth.value is None else QuestionStatus.RESOLVED
        assert question.status is expected
    first_id = questions[0].id
    manual = resolve_manually(day11, first_id, ManualVerdict.ANNUL)
    assert manual is None or manual.revision == 2


def test_generated_questions_resolve_through_the_judge_or_wait_for_a_person(
    engine, tmp_path
) -> None:
    import json
    import re
    from datetime import UTC, datetime

    from futureworld.domain import Article, Question
    from storage.repositories.articles import insert_articles
    from storage.repositories.questions import latest_outcomes, upsert_questions

    closed = datetime(2026, 4, 1, tzinfo=UTC)
    questions = [
        Question(
            source="rss",
            external_id=f"gen-{i}",
            title=title,
            created_at=closed,
            info_cutoff_at=closed - timedelta(days=5),
            close_at=closed,
        )
        for i, title in enumerate(
            [
                "Will Arden Bank announce a merger by April 1?",
                "Will the Lune bridge reopen by April 1?",
            ]
        )
    ]
    news = Article(
        feed="f",
        guid="after",
        link="https://news.test/after",
        title="Arden Bank announces merger",
        summary="The merger was announced.",
        published_at=closed + timedelta(hours=5),
        fetched_at=closed,
    )
    with session_scope(engine) as session:
        upsert_questions(session, questions)
        insert_articles(session, [news])
    now = closed + timedelta(days=1)
    waiting = resolve(make_context(engine, tmp_path, as_of=now))
    assert (waiting.checked, waiting.needs_manual, waiting.outcomes_recorded) == (2, 2, 0)

    def judge(prompt: str) -> str:
        """A scripted judge: sure about the merger (citing the article it was shown)."""
        if "Question: Will Arden Bank" in prompt:
            article_id = re.search(r"\[(\d+)\]|id[=: ]+(\d+)", prompt)
            cited = next(g for g in article_id.groups() if g) if article_id else "1"
            return json.dumps(
                {"verdict": "yes", "evidence": [cited], "confidence": 0.9, "rationale": "announced"}
            )
        return json.dumps({"verdict": "unknown", "evidence": [], "confidence": 0.2})

    scripted = build_context(Settings(data_dir=tmp_path), engine, as_of=now, judge=judge)
    report = resolve(scripted)
    assert (report.outcomes_recorded, report.needs_manual) == (1, 1)
    with session_scope(engine) as session:
        [outcome] = latest_outcomes(session).values()
        events = event_counts(session, scripted.run_key)
    assert outcome.value == 1.0
    assert outcome.raw["judge_verdict"] == "yes" and outcome.raw["confidence"] == 0.9
    assert outcome.raw["evidence_ids"]
    assert events[("resolve", "rss", "needs_manual")] == 1


def test_a_configured_judge_agent_reads_the_news_and_its_unusable_verdict_waits(
    engine, tmp_path
) -> None:
    """The judge is a registered agent's real model; an untrained tiny model cannot produce a
    usable verdict, so the question waits for a person and the verdict is kept as an event."""
    from datetime import UTC, datetime

    from futureworld.domain import Agent, Question
    from futureworld.policy.tiny import init_tiny_model
    from storage.repositories.agents import ensure_agent
    from storage.repositories.questions import upsert_questions

    closed = datetime(2026, 4, 1, tzinfo=UTC)
    model = init_tiny_model(tmp_path / "judge", seed=4)
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="rss",
                    external_id="gen-x",
                    title="Will the Lune bridge reopen by April 1?",
                    created_at=closed,
                    info_cutoff_at=closed,
                    close_at=closed,
                )
            ],
        )
        ensure_agent(session, Agent(name="judge", base_model=str(model), backend="local"))
    ctx = make_context(engine, tmp_path, as_of=closed + timedelta(days=1), judge_agent="judge")
    assert ctx.judge is not None and isinstance(ctx.judge("Say yes."), str)
    report = resolve(ctx)
    assert (report.checked, report.outcomes_recorded, report.needs_manual) == (1, 0, 1)
    with session_scope(engine) as session:
        assert event_counts(session, ctx.run_key)[("resolve", "rss", "needs_manual")] == 1
    assert make_context(engine, tmp_path).judge is None


def test_one_bad_feed_or_market_fails_alone_and_linkless_items_are_all_stored(
    engine, tmp_path
) -> None:
    """Over real HTTP: a feed that redirects to itself and one with a bad gzip body fail alone
    (the good feeds' items, guid-only and description-only ones included, are stored); in
    resolve, a 200,000-deep JSON body, a redirect loop and a bad gzip fail only their market."""
    from datetime import UTC, datetime

    from futureworld.domain import Question
    from storage.repositories.questions import latest_outcomes, upsert_questions
    from tests.sources.loopback_server import Reply, ScriptedServer
    from tests.sources.test_isolation import (
        BAD_GZIP,
        DEEP_JSON,
        DESCRIPTION_ONLY,
        GOOD_FEED,
        GUID_ONLY,
        RSS_TYPE,
        _self_redirect,
    )
    from tests.sources.test_manifold import lite_market, ms

    now = datetime(2026, 3, 1, 8, tzinfo=UTC)
    server = ScriptedServer()
    try:
        for path, body in (
            ("/good", GOOD_FEED),
            ("/guids", GUID_ONLY),
            ("/notes", DESCRIPTION_ONLY),
        ):
            server.route(path, [Reply(200, body, RSS_TYPE)])
        server.route("/loop", _self_redirect)
        server.route("/gzip", [BAD_GZIP])
        ctx = make_context(
            engine, tmp_path, as_of=now, manifold_base_url=server.base_url, http_max_retries=0
        )
        feeds = [server.base_url + p for p in ("/loop", "/good", "/gzip", "/guids", "/notes")]
        report = harvest(ctx, sources=[], feeds=feeds)
        assert report.articles_new == _count(engine, ArticleRow) == 1 + 4 + 4
        assert report.sources == {"rss": "partial"} and report.verdict.startswith("partial")
        assert sum(feeds[0] in e for e in report.errors) == 1
        assert sum(feeds[2] in e for e in report.errors) == 1
        assert harvest(ctx, sources=[], feeds=feeds).articles_new == 0  # same keys again

        closed = now - timedelta(days=1)
        ids = [f"m{i:03d}" for i in range(5)]
        with session_scope(engine) as session:
            upsert_questions(
                session,
                [
                    Question(
                        source="manifold",
                        external_id=external_id,
                        title=f"Will {external_id} happen?",
                        created_at=closed - timedelta(days=5),
                        info_cutoff_at=closed - timedelta(days=5),
                        close_at=closed,
                    )
                    for external_id in ids
                ],
            )
        for i in (0, 4):
            resolved = lite_market(i, isResolved=True, resolution="NO", resolutionTime=ms(now))
            server.route(f"/v0/market/m{i:03d}", [Reply(200, resolved)])
        server.route(
            "/v0/market/m001", [Reply(200, DEEP_JSON, {"Content-Type": "application/json"})]
        )
        server.route("/v0/market/m002", _self_redirect)
        server.route("/v0/market/m003", [BAD_GZIP])
        resolved = resolve(ctx)
    finally:
        server.close()
    assert (resolved.checked, resolved.outcomes_recorded) == (5, 2)
    assert resolved.sources == {"manifold": "partial"}
    for bad in ("m001", "m002", "m003"):
        assert sum(f"{server.base_url}/v0/market/{bad}" in e for e in resolved.errors) == 1
    with session_scope(engine) as session:
        by_id = {q.id: q.external_id for q in list_questions(session)}
        assert {by_id[qid] for qid in latest_outcomes(session)} == {"m000", "m004"}


def test_a_source_that_gives_nothing_is_a_failed_source(engine, tmp_path) -> None:
    ctx = make_context(engine, tmp_path, manifold_base_url=_dead_url(), http_max_retries=0)
    report = harvest(ctx, sources=["manifold", "nosuch"], feeds=[_dead_url() + "/rss"])
    assert report.sources == {"manifold": "failed", "nosuch": "failed", "rss": "failed"}
    assert report.verdict == "failed: nothing came through from manifold, nosuch, rss"


def test_the_request_rate_to_sources_is_a_setting(engine, tmp_path, monkeypatch) -> None:
    """FW_HTTP_RATE_PER_S sets every source's request rate (default 5 a second); 0 lifts the
    limit (the demo's world is on loopback); a negative rate is refused."""
    default = build_context(Settings(data_dir=tmp_path), engine, as_of=datetime.now(UTC))
    assert default.http.rate_for("manifold") == 5.0
    monkeypatch.setenv("FW_HTTP_RATE_PER_S", "0")
    lifted = build_context(Settings(data_dir=tmp_path), engine, as_of=datetime.now(UTC))
    assert lifted.http.rate_for("manifold") == lifted.http.rate_for("rss") == 0.0
    with pytest.raises(ValueError, match="http_rate_per_s"):
        Settings(data_dir=tmp_path, http_rate_per_s=-1)
