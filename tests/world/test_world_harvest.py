"""The real source adapters harvest and resolve the served world as they do real platforms."""

from __future__ import annotations

from datetime import timedelta

from futureworld.domain import OutcomeStatus
from futureworld.sources import manifold, rss
from futureworld.sources.base import ResolveResult
from futureworld.sources.http import HttpConfig, SourceClient
from futureworld.world import (
    MarketResolution,
    SimClock,
    World,
    WorldConfig,
    serve_world,
    true_probability,
)


def test_adapters_harvest_open_markets_and_articles_then_resolve_them_later() -> None:
    world = World(WorldConfig(seed=13, questions_per_day=10, cancel_rate=0.2))
    clock = SimClock(world.day_start(3) + timedelta(hours=8))
    client = SourceClient(HttpConfig(default_rate_per_s=0, max_retries=0))
    with serve_world(world, clock) as server, client:
        now = clock.now()
        harvest = manifold.harvest_open(client, server.manifold_base_url, now=now, page_size=7)
        assert harvest.errors == []
        expected = {q.external_id: q for q in world.questions_posed_by(now) if q.close_at > now}
        assert {q.external_id for q in harvest.questions} == set(expected)
        for question in harvest.questions:
            sim = expected[question.external_id]
            assert question.title == sim.title
            assert question.domain == sim.topic.value
            assert question.close_at == sim.close_at
            assert question.crowd_probability == sim.crowd_probability
            assert true_probability(question) == sim.p_yes

        feeds = rss.fetch_feeds(client, [server.feed_urls["all"]], now=now)
        assert feeds[0].errors == []
        served = {a.guid: a for a in world.articles_published_by(now)}
        assert {a.guid for a in feeds[0].articles} == set(served)
        for article in feeds[0].articles:
            assert article.published_at == served[article.guid].published_at

        ids = list(expected)
        assert manifold.fetch_resolutions(client, server.manifold_base_url, ids, now=now) == (
            ResolveResult(resolutions=[], errors=[])
        )
        clock.advance(days=8)
        later = manifold.fetch_resolutions(client, server.manifold_base_url, ids, now=clock.now())
        assert later.errors == []
        assert {r.external_id for r in later.resolutions} == set(ids)
        for resolution in later.resolutions:
            truth = world.resolution_as_of(resolution.external_id, clock.now())
            assert resolution.resolved_at == truth.resolved_at
            if truth.resolution is MarketResolution.CANCEL:
                assert resolution.status is OutcomeStatus.ANNULLED
            else:
                assert resolution.status is OutcomeStatus.RESOLVED
                assert resolution.value == truth.value
