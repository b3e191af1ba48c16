"""Harvest and resolve through the real source adapters against the simulated world served
on loopback (RSS + Manifold API), on Postgres and SQLite."""

from __future__ import annotations

import socket
from datetime import timedelta

from sqlalchemy import func, select

from flows.settings import Settings
from flows.stages.harvesting import harvest, resolve, resolve_manually
from futureworld.domain import QuestionStatus
from futureworld.world import SimClock, World, WorldConfig, serve_world
from storage.engine import session_scope
from storage.repositories.events import event_counts
from storage.repositories.questions import list_questions
from storage.tables import ArticleRow, OutcomeRow, QuestionRow


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
        settings = Settings(
            data_dir=tmp_path,
            manifold_base_url=server.manifold_base_url,
            polymarket_base_url=_dead_url(),
            http_max_retries=0,
            http_timeout_s=2,
        )
        feeds = [server.feed_urls["all"]]
        first = harvest(
            engine,
            settings,
            sources=["manifold", "polymarket"],
            feeds=feeds,
            now=clock.now(),
            run_key="day-2",
        )
        assert first.questions_new == len(world.questions_posed_by(clock.now())) > 0
        assert first.articles_new > 0
        assert any(e.startswith("polymarket:") for e in first.errors)
        again = harvest(
            engine, settings, sources=["manifold"], feeds=feeds, now=clock.now(), run_key="day-2"
        )
        assert again.questions_new == 0 and again.articles_new == 0
        assert _count(engine, QuestionRow) == first.questions_new
        assert _count(engine, ArticleRow) == first.articles_new
        with session_scope(engine) as session:
            failures = event_counts(session, "day-2")
        assert sum(n for (stage, source, _), n in failures.items() if source == "polymarket") >= 1

        clock.advance(days=9)
        report = resolve(engine, settings, now=clock.now(), run_key="day-11")
        assert report.checked == first.questions_new
        assert report.outcomes_recorded == report.checked
        assert report.annulled >= 1
        assert resolve(engine, settings, now=clock.now(), run_key="day-11").outcomes_recorded == 0
        assert _count(engine, OutcomeRow) == report.outcomes_recorded

    with session_scope(engine) as session:
        questions = list_questions(session)
    by_id = {q.external_id: q for q in questions}
    for external_id, question in by_id.items():
        truth = world.resolution_as_of(external_id, clock.now())
        expected = QuestionStatus.ANNULLED if truth.value is None else QuestionStatus.RESOLVED
        assert question.status is expected
    first_id = questions[0].id
    manual = resolve_manually(engine, first_id, "annul", now=clock.now())
    assert manual is None or manual.revision == 2
