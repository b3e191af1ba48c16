"""The world server on loopback: RSS feeds read by feedparser, the Manifold v0 market API."""

from __future__ import annotations

import calendar
from collections.abc import Iterator
from datetime import timedelta

import feedparser
import httpx
import pytest

from futureworld.world import MarketResolution, SimClock, Topic, World, WorldConfig, serve_world
from futureworld.world.server import FEED_WINDOW, WorldServer


@pytest.fixture
def world() -> World:
    return World(WorldConfig(seed=9, questions_per_day=8, cancel_rate=0.15))


@pytest.fixture
def clock(world: World) -> SimClock:
    return SimClock(world.day_start(2) + timedelta(hours=12))


@pytest.fixture
def server(world: World, clock: SimClock) -> Iterator[WorldServer]:
    with serve_world(world, clock) as running:
        yield running


def get(server: WorldServer, path: str, **params: object) -> httpx.Response:
    return httpx.get(f"{server.base_url}{path}", params=params, timeout=10)


def test_rss_feeds_parse_with_feedparser_and_show_only_published_items(
    server: WorldServer, world: World, clock: SimClock
) -> None:
    for topic in Topic:
        response = get(server, f"/feeds/{topic}.xml")
        assert response.headers["content-type"].startswith("application/rss+xml")
        feed = feedparser.parse(response.content)
        assert not feed.bozo, feed.get("bozo_exception")
        expected = {a.guid: a for a in world.articles_published_by(clock.now(), topic)}
        assert expected
        assert [e.id for e in feed.entries] == sorted(
            expected, key=lambda g: (expected[g].published_at, g), reverse=True
        )
        for entry in feed.entries:
            article = expected[entry.id]
            assert calendar.timegm(entry.published_parsed) == article.published_at.timestamp()
            assert article.published_at <= clock.now()
            assert entry.title == article.title
            assert entry.summary == article.summary
            assert entry.content[0].value == article.body
            assert entry.link == f"{server.base_url}{article.path}"

    before = {e.id for e in feedparser.parse(get(server, "/feeds/all.xml").content).entries}
    clock.advance(days=1)
    after = {e.id for e in feedparser.parse(get(server, "/feeds/all.xml").content).entries}
    assert before < after
    assert after == {a.guid for a in world.articles_published_by(clock.now())}


def test_a_feed_carries_only_its_recent_window(
    server: WorldServer, world: World, clock: SimClock
) -> None:
    clock.advance(days=12)
    now = clock.now()
    served = {e.id for e in feedparser.parse(get(server, "/feeds/all.xml").content).entries}
    published = world.articles_published_by(now)
    recent = {a.guid for a in published if a.published_at > now - FEED_WINDOW}
    assert served == recent
    assert len(recent) < len(published)  # older news has scrolled off the feed


def test_article_page_is_not_found_until_published(
    server: WorldServer, world: World, clock: SimClock
) -> None:
    upcoming = next(
        a for a in world.articles_published_by(clock.now() + timedelta(days=1))
        if a.published_at > clock.now()
    )  # fmt: skip
    assert get(server, upcoming.path).status_code == 404
    clock.set(upcoming.published_at)
    page = get(server, upcoming.path)
    assert page.status_code == 200
    assert upcoming.body in page.text


def test_manifold_markets_page_newest_first_by_before_id(
    server: WorldServer, world: World, clock: SimClock
) -> None:
    posed = world.questions_posed_by(clock.now())
    assert len(posed) == 2 * 8 + 8  # days 0 and 1, and day 2's were posed at 06:00
    seen: list[dict] = []
    before: str | None = None
    while True:
        params = {"limit": 5} | ({"before": before} if before else {})
        page = get(server, "/v0/markets", **params).json()
        seen.extend(page)
        if len(page) < 5:
            break
        before = page[-1]["id"]
    assert [m["id"] for m in seen] == [q.external_id for q in reversed(posed)]
    created = [m["createdTime"] for m in seen]
    assert created == sorted(created, reverse=True)
    assert get(server, "/v0/markets").json() == seen  # default limit 500 fits all


def test_markets_appear_only_once_created(
    server: WorldServer, world: World, clock: SimClock
) -> None:
    tomorrow = world.questions_posed_on(3)[0]
    assert get(server, f"/v0/market/{tomorrow.external_id}").status_code == 404
    listed = {m["id"] for m in get(server, "/v0/markets", limit=1000).json()}
    assert tomorrow.external_id not in listed
    clock.set(tomorrow.created_at)
    assert get(server, f"/v0/market/{tomorrow.external_id}").status_code == 200
    assert get(server, "/v0/markets", limit=1).json()[0]["id"] == tomorrow.external_id


def test_market_shows_its_resolution_only_after_the_resolution_time(
    server: WorldServer, world: World, clock: SimClock
) -> None:
    question = world.questions_posed_on(0)[0]
    clock.set(question.close_at + timedelta(minutes=1))
    closed = get(server, f"/v0/market/{question.external_id}").json()
    assert closed["isResolved"] is False
    assert "resolution" not in closed and "resolutionTime" not in closed
    assert closed["closeTime"] < int(clock.now().timestamp() * 1000)

    clock.set(question.resolve_at - timedelta(seconds=1))
    assert get(server, f"/v0/market/{question.external_id}").json()["isResolved"] is False

    clock.set(question.resolve_at)
    resolved = get(server, f"/v0/market/{question.external_id}").json()
    truth = world.resolution_as_of(question.external_id, question.resolve_at)
    assert resolved["isResolved"] is True
    assert resolved["resolution"] == truth.resolution.value
    assert resolved["resolutionTime"] == int(question.resolve_at.timestamp() * 1000)
    listed = get(server, "/v0/markets", limit=1000).json()
    assert next(m for m in listed if m["id"] == question.external_id)["isResolved"] is True


def test_some_markets_are_cancelled_and_served_as_cancel(
    server: WorldServer, world: World, clock: SimClock
) -> None:
    clock.set(world.day_start(30))
    markets = get(server, "/v0/markets", limit=1000).json()
    resolutions = {m.get("resolution") for m in markets if m["isResolved"]}
    assert resolutions == {"YES", "NO", "CANCEL"}
    for market in markets:
        if market["isResolved"]:
            truth = world.resolution_as_of(market["id"], clock.now())
            assert market["resolution"] == truth.resolution.value
            assert truth.resolution is not MarketResolution.MKT


def test_markets_follow_the_manifold_binary_shapes(server: WorldServer, world: World) -> None:
    market = get(server, "/v0/markets", limit=1).json()[0]
    for key, kind in {
        "id": str, "question": str, "url": str, "slug": str, "creatorUsername": str,
        "createdTime": int, "closeTime": int, "probability": float, "volume": float,
        "isResolved": bool, "pool": dict, "groupSlugs": list, "textDescription": str,
    }.items():  # fmt: skip
        assert isinstance(market[key], kind), key
    assert market["outcomeType"] == "BINARY" and market["mechanism"] == "cpmm-1"
    question = world.question(market["id"])
    assert market["question"] == question.title
    assert market["probability"] == question.crowd_probability
    assert market["url"].startswith(server.base_url)
    full = get(server, f"/v0/market/{market['id']}").json()
    assert full["textDescription"] == question.description
    assert full["description"]["type"] == "doc"
    assert full["groupSlugs"] == [question.topic.value]


def test_bad_requests_get_clear_errors(server: WorldServer) -> None:
    bad_limit = get(server, "/v0/markets", limit="many")
    assert bad_limit.status_code == 400 and "limit" in bad_limit.json()["message"]
    assert get(server, "/v0/markets", limit=1001).status_code == 400
    bad_before = get(server, "/v0/markets", before="w9d99q0")
    assert bad_before.status_code == 400 and "w9d99q0" in bad_before.json()["message"]
    assert get(server, "/v0/market/nope").status_code == 404
    missing_feed = get(server, "/feeds/weather.xml")
    assert missing_feed.status_code == 404 and "weather" in missing_feed.json()["message"]
    assert get(server, "/elsewhere").status_code == 404


def test_server_lists_its_feeds_and_stops_on_close(world: World, clock: SimClock) -> None:
    with serve_world(world, clock) as running:
        assert set(running.feed_urls) == {*Topic, "all"}
        assert running.manifold_base_url == running.base_url
        assert httpx.get(running.feed_urls["all"]).status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(running.feed_urls["all"], timeout=2)


def test_unchanged_feed_answers_not_modified_to_a_conditional_get(
    server: WorldServer, world: World, clock: SimClock
) -> None:
    first = get(server, "/feeds/sports.xml")
    etag = first.headers["ETag"]
    again = httpx.get(server.feed_urls["sports"], headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    published = world.articles_published_by(clock.now(), Topic.SPORTS)
    clock.advance(timedelta(seconds=1))
    assert world.articles_published_by(clock.now(), Topic.SPORTS) == published
    assert httpx.get(first.url, headers={"If-None-Match": etag}).status_code == 304
    clock.advance(days=1)
    changed = httpx.get(server.feed_urls["sports"], headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["ETag"] != etag
