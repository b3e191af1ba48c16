"""Per-item error isolation in the sources, over real HTTP on loopback: a redirect loop, a body
with a bad Content-Encoding and a JSON body nested 200,000 deep each fail their own feed or
market, with its URL, and never the batch; spec-valid RSS items without a link or a guid are
kept; non-finite numbers reject their item; Kalshi combo markets are skipped."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from futureworld.domain import OutcomeStatus
from futureworld.sources import kalshi, manifold, polymarket
from futureworld.sources.http import SourceClient, SourceError
from futureworld.sources.rss import LINKLESS_PREFIX, fetch_feed, fetch_feeds
from tests.sources.loopback_server import Reply, Request, ScriptedServer
from tests.sources.test_kalshi import market as kalshi_market
from tests.sources.test_manifold import lite_market, ms

NOW = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
DEPTH = 200_000
inf = float("inf")
DEEP_JSON = "[" * DEPTH + "]" * DEPTH
RSS_TYPE = {"Content-Type": "application/rss+xml"}
BAD_GZIP = Reply(200, b"this is not gzip at all", {**RSS_TYPE, "Content-Encoding": "gzip"})


def _rss(items: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="utf-8"?><rss version="2.0"><channel><title>T</title>'
        f"<link>https://wire.example/</link>{items}</channel></rss>"
    ).encode()


GOOD_FEED = _rss(
    "<item><guid>g-ok</guid><title>Council approves budget</title>"
    "<link>https://wire.example/ok</link><description>Approved.</description></item>"
)
# RSS 2.0: an item needs a title or a description; link and guid are optional.
GUID_ONLY = _rss(
    "".join(
        f'<item><guid isPermaLink="false">tag:wire.example,2026:{i}</guid>'
        f"<title>Bulletin {i}</title><description>Bulletin number {i}.</description></item>"
        for i in range(4)
    )
)
DESCRIPTION_ONLY = _rss(
    "".join(
        f"<item><description>Short note {i}: the port reopened at dawn.</description>"
        f"<pubDate>Sat, 28 Feb 2026 1{i}:00:00 GMT</pubDate></item>"
        for i in range(3)
    )
    + "<item><description>Undated note.</description></item>"
)


def _self_redirect(request: Request) -> Reply:
    return Reply(302, b"", {"Location": request.path})


def test_a_redirect_loop_bad_gzip_and_deep_json_are_final_source_errors(
    server: ScriptedServer, client: SourceClient
) -> None:
    server.route("/loop", _self_redirect)
    server.route("/gzip", [BAD_GZIP])
    server.route("/deep", [Reply(200, DEEP_JSON, {"Content-Type": "application/json"})])
    failures = {}
    for path in ("/loop", "/gzip", "/deep"):
        with pytest.raises(SourceError) as caught:
            client.get_json("test", server.base_url + path)
        failures[path] = caught.value
    assert failures["/loop"].kind == "redirects"
    assert failures["/gzip"].kind == "decoding"
    assert failures["/deep"].kind == "bad_json"
    for path, error in failures.items():
        assert server.base_url + path in str(error)
    # Not retried: another attempt would get the same answer.
    assert len(server.requests_to("/gzip")) == 1 and len(server.requests_to("/deep")) == 1


def test_one_broken_feed_never_aborts_the_others(server: ScriptedServer, client) -> None:
    server.route("/good", [Reply(200, GOOD_FEED, RSS_TYPE)])
    server.route("/loop", _self_redirect)
    server.route("/gzip", [BAD_GZIP])
    server.route("/guids", [Reply(200, GUID_ONLY, RSS_TYPE)])
    urls = [server.base_url + p for p in ("/loop", "/good", "/gzip", "/guids")]
    results = {r.feed: r for r in fetch_feeds(client, urls, now=NOW)}
    loop, good, gzip, guids = (results[u] for u in urls)
    assert [a.guid for a in good.articles] == ["g-ok"] and good.errors == []
    assert len(guids.articles) == 4
    for failed, kind in ((loop, "redirects"), (gzip, "decoding")):
        assert failed.articles == [] and failed.counts["fetch_failed"] == 1
        assert failed.counts[kind] == 1
        assert len(failed.errors) == 1 and failed.feed in failed.errors[0]


def test_items_without_link_are_keyed_by_guid_and_without_guid_by_content(
    server: ScriptedServer, client
) -> None:
    server.route("/guids", [Reply(200, GUID_ONLY, RSS_TYPE)])
    server.route("/notes", [Reply(200, DESCRIPTION_ONLY, RSS_TYPE)])
    guids = fetch_feed(client, server.base_url + "/guids", now=NOW)
    assert [a.guid for a in guids.articles] == [f"tag:wire.example,2026:{i}" for i in range(4)]
    assert [a.link for a in guids.articles] == [LINKLESS_PREFIX + a.guid for a in guids.articles]
    assert guids.counts["keyed_by_guid"] == 4 and guids.errors == []

    notes = fetch_feed(client, server.base_url + "/notes", now=NOW)
    assert len(notes.articles) == 4
    assert len({a.guid for a in notes.articles}) == len({a.link for a in notes.articles}) == 4
    assert all(a.guid.startswith("sha1:") for a in notes.articles)
    assert notes.counts["duplicate_guid"] == 0
    # The keys come from the content, not the fetch time: a later fetch keys them alike.
    again = fetch_feed(client, server.base_url + "/notes", now=NOW + timedelta(days=1))
    assert [a.guid for a in again.articles] == [a.guid for a in notes.articles]


def test_one_market_in_a_resolve_batch_fails_alone(server: ScriptedServer, client) -> None:
    resolved = lite_market(1, isResolved=True, resolution="YES", resolutionTime=ms(NOW))
    server.route("/v0/market/m001", [Reply(200, resolved)])
    server.route("/v0/market/m002", [Reply(200, DEEP_JSON, {"Content-Type": "application/json"})])
    server.route("/v0/market/m003", _self_redirect)
    server.route("/v0/market/m004", [BAD_GZIP])
    server.route(
        "/v0/market/m005",
        [
            Reply(
                200, lite_market(5, isResolved=True, resolution="MKT", resolutionProbability=1e999)
            )
        ],
    )
    ids = ["m002", "m003", "m001", "m004", "m005"]
    result = manifold.fetch_resolutions(client, server.base_url, ids, now=NOW)
    assert [(r.external_id, r.value) for r in result.resolutions] == [("m001", 1.0)]
    assert len(result.errors) == 4
    for external_id, error in zip(["m002", "m003", "m004", "m005"], result.errors, strict=True):
        assert f"{server.base_url}/v0/market/{external_id}" in error
    assert "nested too deep" in result.errors[0] and "not a finite number" in result.errors[3]


def test_non_finite_numbers_reject_their_item_only(server: ScriptedServer, client) -> None:
    # json.dumps writes float("inf") as Infinity, as a broken upstream would.
    markets = [
        lite_market(0),
        lite_market(1, probability=float("inf")),
        lite_market(2, probability=float("nan")),
        lite_market(3, closeTime=float("-inf")),
        lite_market(4),
    ]
    server.route("/v0/markets", [Reply(200, json.dumps(markets))])
    result = manifold.harvest_open(client, server.base_url, now=NOW)
    assert [q.external_id for q in result.questions] == ["m000", "m004"]
    assert result.counts["skipped_malformed"] == 3
    assert sum("not a finite number" in e for e in result.errors) == 2  # m001, m002
    assert all(server.base_url + "/v0/markets" in e for e in result.errors)

    yes_no = '["Yes", "No"]'
    gamma = [
        {"id": "1", "question": "Yes?", "outcomes": yes_no, "outcomePrices": '["0.3", "0.7"]'},
        {"id": "2", "question": "Inf?", "outcomes": yes_no, "outcomePrices": '["Infinity", "0"]'},
    ]
    server.route("/markets/keyset", [Reply(200, {"markets": gamma})])
    result = polymarket.harvest_open(client, server.base_url, now=NOW)
    assert [q.external_id for q in result.questions] == ["1"]
    assert result.counts["skipped_malformed"] == 1

    settled = {**gamma[1], "closed": True, "umaResolutionStatus": "resolved"}
    server.route("/markets/2", [Reply(200, settled)])
    resolved = polymarket.fetch_resolutions(client, server.base_url, ["2"], now=NOW)
    assert resolved.resolutions == [] and "not a finite number" in resolved.errors[0]


def test_kalshi_multivariate_markets_are_skipped_as_not_forecastable(
    server: ScriptedServer, client
) -> None:
    legs = [
        {"event_ticker": "KXNBA-A", "market_ticker": "KXNBA-A-MIL", "side": "yes"},
        {"event_ticker": "KXNBA-B", "market_ticker": "KXNBA-B-NYK", "side": "yes"},
    ]
    markets = [
        kalshi_market(0),
        kalshi_market(
            1,
            ticker="KXMVESPORTS-26MAR-ABC",
            title="yes Milwaukee,yes New York",
            mve_collection_ticker="KXMVESPORTS",
            mve_selected_legs=legs,
        ),
        kalshi_market(2, mve_collection_ticker="KXMVECROSSCATEGORY"),
        kalshi_market(3, yes_bid_dollars="Infinity", yes_ask_dollars="Infinity"),
    ]
    server.route("/trade-api/v2/markets", [Reply(200, {"markets": markets, "cursor": ""})])
    result = kalshi.harvest_open(client, server.base_url, now=NOW)
    assert [q.external_id for q in result.questions] == ["KXCPI-26MAR-T0"]
    assert result.counts["skipped_multivariate"] == 2
    assert result.counts["skipped_malformed"] == 1
    (request,) = server.requests_to("/trade-api/v2/markets")
    assert request.query["mve_filter"] == "exclude"
    settled = kalshi.market_to_resolution(
        kalshi_market(0, status="finalized", result="yes"), now=NOW
    )
    assert settled is not None and settled.status is OutcomeStatus.RESOLVED
