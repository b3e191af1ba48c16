import json
from datetime import UTC, datetime, timedelta

from futureworld.domain import OutcomeStatus
from futureworld.sources import polymarket
from tests.sources.loopback_server import Reply, Request

NOW = datetime(2026, 3, 1, tzinfo=UTC)


def gamma_market(i: int, outcomes=("Yes", "No"), prices=("0.3", "0.7"), **overrides) -> dict:
    market = {
        "id": str(500 + i),
        "question": f"Will team {i} win the cup?",
        "conditionId": f"0xabc{i}",
        "slug": f"team-{i}-cup",
        "description": f"This market resolves to Yes if team {i} wins.",
        "createdAt": "2026-02-01T10:00:00.000Z",
        "endDate": "2026-06-30T00:00:00Z",
        "outcomes": json.dumps(list(outcomes)),
        "outcomePrices": json.dumps(list(prices)),
        "active": True,
        "closed": False,
        "category": "Sports",
    }
    market.update(overrides)
    return market


def keyset(markets: list[dict]):
    """Serve /markets/keyset: the cursor is the index of the next market, absent at the end."""

    def handler(request: Request) -> Reply:
        start = int(request.query.get("after_cursor", "0"))
        limit = int(request.query["limit"])
        body: dict = {"markets": markets[start : start + limit]}
        if start + limit < len(markets):
            body["next_cursor"] = str(start + limit)
        return Reply(200, body)

    return handler


def test_keyset_paging_reads_every_page_once(server, client):
    markets = [gamma_market(i) for i in range(5)]
    server.route("/markets/keyset", keyset(markets))
    result = polymarket.harvest_open(client, server.base_url, now=NOW, page_size=2)
    assert [q.external_id for q in result.questions] == ["500", "501", "502", "503", "504"]
    cursors = [r.query.get("after_cursor") for r in server.requests_to("/markets/keyset")]
    assert cursors == [None, "2", "4"]
    assert result.counts["pages"] == 3 and result.errors == []
    assert all(r.query["closed"] == "false" for r in server.requests_to("/markets/keyset"))


def test_yes_price_is_read_by_outcome_name_not_position(server, client):
    flipped = gamma_market(0, outcomes=("No", "Yes"), prices=("0.8", "0.2"))
    server.route("/markets/keyset", [Reply(200, {"markets": [flipped]})])
    (question,) = polymarket.harvest_open(client, server.base_url, now=NOW).questions
    assert question.crowd_probability == 0.2
    assert question.domain == "Sports" and question.close_at == datetime(2026, 6, 30, tzinfo=UTC)


def test_non_binary_and_malformed_markets_are_counted(server, client):
    multi = gamma_market(1, outcomes=("Red", "Blue"))
    broken = gamma_market(2, outcomePrices="[0.5")
    markets = [gamma_market(0), multi, broken, gamma_market(3, closed=True)]
    server.route("/markets/keyset", [Reply(200, {"markets": markets})])
    result = polymarket.harvest_open(client, server.base_url, now=NOW)
    assert [q.external_id for q in result.questions] == ["500"]
    assert result.counts["skipped_not_binary"] == 1
    assert result.counts["skipped_malformed"] == 1 and "502" in result.errors[0]
    assert result.counts["skipped_closed"] == 1


def settled(i: int, prices, status="resolved", outcomes=("Yes", "No")) -> dict:
    return gamma_market(
        i,
        outcomes=outcomes,
        prices=prices,
        closed=True,
        umaResolutionStatus=status,
        closedTime="2026-07-01 12:00:00+00",
    )


def test_resolutions_yes_no_fifty_fifty_and_pending(server, client):
    server.route("/markets/1", [Reply(200, settled(1, ("1", "0")))])
    server.route("/markets/2", [Reply(200, settled(2, ("1", "0"), outcomes=("No", "Yes")))])
    server.route("/markets/3", [Reply(200, settled(3, ("0.5", "0.5")))])
    server.route("/markets/4", [Reply(200, settled(4, ("0.9", "0.1"), status="proposed"))])
    server.route("/markets/5", [Reply(200, settled(5, ("0.7", "0.3")))])
    result = polymarket.fetch_resolutions(client, server.base_url, ["1", "2", "3", "4", "5"])
    by_id = {r.external_id: r for r in result.resolutions}
    assert by_id["501"].value == 1.0
    assert by_id["502"].value == 0.0  # "No" listed first and priced 1
    assert by_id["503"].status is OutcomeStatus.ANNULLED and by_id["503"].value is None
    assert set(by_id) == {"501", "502", "503"}
    assert by_id["501"].resolved_at == datetime(2026, 7, 1, 12, tzinfo=UTC)
    assert len(result.errors) == 1 and "neither settled nor 50/50" in result.errors[0]


def test_legacy_list_response_is_one_page(server, client):
    server.route("/markets/keyset", [Reply(200, [gamma_market(0), gamma_market(1)])])
    result = polymarket.harvest_open(client, server.base_url, now=NOW + timedelta(days=1))
    assert [q.external_id for q in result.questions] == ["500", "501"]
    assert len(server.requests) == 1


def test_a_null_empty_or_wrongly_typed_question_or_id_is_refused_with_a_line_naming_it(
    server, client
):
    bad = [
        gamma_market(1, question=None),
        gamma_market(2, question=""),
        gamma_market(3, question={"en": "Will team 3 win?"}),
        gamma_market(4, id=True),
    ]
    server.route("/markets/keyset", [Reply(200, {"markets": [gamma_market(0), *bad]})])
    result = polymarket.harvest_open(client, server.base_url, now=NOW)
    assert [(q.external_id, q.title) for q in result.questions] == [
        ("500", "Will team 0 win the cup?")
    ]
    assert result.counts["skipped_malformed"] == 4 and len(result.errors) == 4
    null, empty, mapping, flag = result.errors
    assert "market '501' is malformed: question is null" in null
    assert "market '502' is malformed: question is empty" in empty
    assert "market '503' is malformed: question is not text (got dict" in mapping
    assert "market True is malformed: id is not a string or an integer (got bool" in flag
