from datetime import UTC, datetime, timedelta

from futureworld.domain import OutcomeStatus
from futureworld.sources import manifold
from futureworld.sources.http import SourceClient
from tests.sources.loopback_server import Reply, Request, ScriptedServer

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


def lite_market(i: int, **overrides) -> dict:
    market = {
        "id": f"m{i:03d}",
        "question": f"Will event {i} happen by June?",
        "url": f"https://manifold.markets/u/event-{i}",
        "createdTime": ms(NOW - timedelta(days=i + 1)),
        "closeTime": ms(NOW + timedelta(days=30)),
        "outcomeType": "BINARY",
        "mechanism": "cpmm-1",
        "probability": 0.25,
        "isResolved": False,
        "textDescription": f"Resolves YES if event {i} happens.",
        "groupSlugs": ["politics"],
    }
    market.update(overrides)
    return market


def paged_markets(markets: list[dict]):
    """Serve /v0/markets like Manifold: newest first, `before` = id of the last one seen."""

    def handler(request: Request) -> Reply:
        limit = int(request.query["limit"])
        start = 0
        if "before" in request.query:
            start = [m["id"] for m in markets].index(request.query["before"]) + 1
        return Reply(200, markets[start : start + limit])

    return handler


def test_harvest_pages_with_before_and_keeps_only_open_markets_of_known_kinds(
    server: ScriptedServer, client
):
    markets = [lite_market(i) for i in range(7)]
    markets[1]["outcomeType"] = "POLL"
    markets[2]["isResolved"] = True
    markets[3]["closeTime"] = ms(NOW - timedelta(hours=1))
    server.route("/v0/markets", paged_markets(markets))
    result = manifold.harvest_open(client, server.base_url, now=NOW, page_size=3)
    ids = [q.external_id for q in result.questions]
    assert ids == ["m000", "m004", "m005", "m006"]
    assert result.errors == []
    assert result.counts["pages"] == 3
    assert result.counts["skipped_unsupported_kind"] == 1
    assert result.counts["skipped_resolved"] == 1
    assert result.counts["skipped_closed"] == 1
    befores = [r.query.get("before") for r in server.requests_to("/v0/markets")]
    assert befores == [None, "m002", "m005"]
    q = result.questions[0]
    assert q.source == "manifold" and q.crowd_probability == 0.25 and q.domain == "politics"
    assert q.close_at == NOW + timedelta(days=30) and q.info_cutoff_at == NOW
    assert q.resolution_criteria.startswith("Resolves YES")


def test_reharvest_returns_the_same_external_ids(server, client):
    server.route("/v0/markets", paged_markets([lite_market(i) for i in range(5)]))
    first = manifold.harvest_open(client, server.base_url, now=NOW, page_size=2)
    second = manifold.harvest_open(client, server.base_url, now=NOW, page_size=2)
    assert [q.external_id for q in first.questions] == [q.external_id for q in second.questions]
    assert len({q.external_id for q in first.questions}) == 5


def test_market_missing_fields_is_reported_and_the_rest_kept(server, client):
    broken = lite_market(1)
    del broken["question"]
    server.route("/v0/markets", [Reply(200, [lite_market(0), broken, lite_market(2)])])
    result = manifold.harvest_open(client, server.base_url, now=NOW, page_size=10)
    assert [q.external_id for q in result.questions] == ["m000", "m002"]
    assert result.counts["skipped_malformed"] == 1
    assert len(result.errors) == 1 and "m001" in result.errors[0]


def test_malformed_json_page_keeps_earlier_pages_and_reports(server, client):
    pages = [Reply(200, [lite_market(0), lite_market(1)]), Reply(200, "[{oops")]
    server.route("/v0/markets", pages)
    result = manifold.harvest_open(client, server.base_url, now=NOW, page_size=2)
    assert [q.external_id for q in result.questions] == ["m000", "m001"]
    assert result.counts["failed_pages"] == 1
    assert "malformed JSON" in result.errors[0]


def test_429_then_500_then_success_harvests_everything(server, client):
    ok = Reply(200, [lite_market(0)])
    server.route("/v0/markets", [Reply(429, "", {"Retry-After": "0"}), Reply(500, ""), ok])
    result = manifold.harvest_open(client, server.base_url, now=NOW, page_size=5)
    assert [q.external_id for q in result.questions] == ["m000"] and result.errors == []


def resolved(market_id: str, resolution: str, when: datetime, **extra) -> dict:
    market = lite_market(0, id=market_id, isResolved=True, resolution=resolution)
    market.update(resolutionTime=ms(when), **extra)
    return market


def test_resolutions_yes_no_mkt_cancel_and_unresolved(server, client):
    when = NOW + timedelta(days=40)
    server.route("/v0/market/a", [Reply(200, resolved("a", "YES", when))])
    server.route("/v0/market/b", [Reply(200, resolved("b", "NO", when))])
    server.route(
        "/v0/market/c", [Reply(200, resolved("c", "MKT", when, resolutionProbability=0.62))]
    )
    server.route("/v0/market/d", [Reply(200, resolved("d", "CANCEL", when))])
    server.route("/v0/market/e", [Reply(200, lite_market(0, id="e"))])
    result = manifold.fetch_resolutions(client, server.base_url, ["a", "b", "c", "d", "e", "zz"])
    by_id = {r.external_id: r for r in result.resolutions}
    assert set(by_id) == {"a", "b", "c", "d"}
    assert by_id["a"].value == 1.0 and by_id["b"].value == 0.0 and by_id["c"].value == 0.62
    assert by_id["d"].status is OutcomeStatus.ANNULLED and by_id["d"].value is None
    assert all(r.final and r.resolved_at == when for r in by_id.values())
    assert len(result.errors) == 1 and "HTTP 404" in result.errors[0] and "/zz" in result.errors[0]


def test_re_resolved_market_reports_the_new_value(server, client):
    first, later = NOW + timedelta(days=1), NOW + timedelta(days=3)
    script = [Reply(200, resolved("r", "YES", first)), Reply(200, resolved("r", "NO", later))]
    server.route("/v0/market/r", script)
    before = manifold.fetch_resolutions(client, server.base_url, ["r"]).resolutions
    after = manifold.fetch_resolutions(client, server.base_url, ["r"]).resolutions
    assert [(r.value, r.resolved_at) for r in before] == [(1.0, first)]
    assert [(r.value, r.resolved_at) for r in after] == [(0.0, later)]


def test_unknown_resolution_is_an_error_not_a_value(server, client):
    server.route("/v0/market/x", [Reply(200, resolved("x", "MAYBE", NOW))])
    result = manifold.fetch_resolutions(client, server.base_url, ["x"])
    assert result.resolutions == [] and "MAYBE" in result.errors[0]


def test_api_key_is_sent_but_never_stored(server, client: SourceClient):
    server.route("/v0/market/a", [Reply(200, resolved("a", "YES", NOW))])
    result = manifold.fetch_resolutions(client, server.base_url, ["a"], token="k-secret")
    assert server.requests_to("/v0/market/a")[0].headers["authorization"] == "Key k-secret"
    assert "k-secret" not in repr(result)


def test_a_null_empty_or_wrongly_typed_question_or_id_is_refused_with_a_line_naming_it(
    server, client
):
    bad = {
        "m001": lite_market(1, question=None),
        "m002": lite_market(2, question="   "),
        "m003": lite_market(3, question=42),
        "m004": lite_market(4, id=["m004"]),
    }
    markets = [lite_market(0), *bad.values(), lite_market(5)]
    server.route("/v0/markets", [Reply(200, markets)])
    result = manifold.harvest_open(client, server.base_url, now=NOW, page_size=10)
    assert [q.external_id for q in result.questions] == ["m000", "m005"]
    assert all(q.title.startswith("Will event") for q in result.questions)
    assert result.counts["skipped_malformed"] == 4 and len(result.errors) == 4
    null, empty, number, listed_id = result.errors
    assert "market 'm001' is malformed: question is null" in null
    assert "market 'm002' is malformed: question is empty" in empty
    assert "market 'm003' is malformed: question is not text (got int 42)" in number
    assert "market ['m004'] is malformed: id is not a string or an integer" in listed_id
    assert all(server.base_url + "/v0/markets" in e for e in result.errors)
