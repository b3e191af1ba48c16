from datetime import UTC, datetime

import pytest

from futureworld.domain import OutcomeStatus
from futureworld.sources import kalshi
from tests.sources.loopback_server import Reply, Request

NOW = datetime(2026, 3, 1, tzinfo=UTC)
MARKETS = "/trade-api/v2/markets"


def market(i: int, **overrides) -> dict:
    body = {
        "ticker": f"KXCPI-26MAR-T{i}",
        "event_ticker": "KXCPI-26MAR",
        "market_type": "binary",
        "title": f"Will CPI rise more than 0.{i}% in March?",
        "yes_sub_title": "",
        "open_time": "2026-02-01T14:00:00Z",
        "close_time": "2026-04-10T12:30:00Z",
        "expiration_time": "2026-04-11T12:30:00Z",
        "status": "active",
        "result": "",
        "yes_bid": 40,
        "yes_ask": 44,
        "yes_bid_dollars": "0.4000",
        "yes_ask_dollars": "0.4400",
        "last_price": 41,
        "last_price_dollars": "0.4100",
        "rules_primary": "If CPI rises more than the strike, the market resolves to Yes.",
        "category": "Economics",
    }
    body.update(overrides)
    return body


def cursor_pages(markets: list[dict]):
    def handler(request: Request) -> Reply:
        start = int(request.query.get("cursor") or 0)
        limit = int(request.query["limit"])
        nxt = str(start + limit) if start + limit < len(markets) else ""
        return Reply(200, {"markets": markets[start : start + limit], "cursor": nxt})

    return handler


def test_cursor_paging_and_crowd_from_dollar_fields(server, client):
    markets = [market(i) for i in range(5)]
    markets[4] = market(4, market_type="scalar")
    server.route(MARKETS, cursor_pages(markets))
    result = kalshi.harvest_open(client, server.base_url, now=NOW, page_size=2)
    assert [q.external_id for q in result.questions] == [f"KXCPI-26MAR-T{i}" for i in range(4)]
    assert [r.query.get("cursor") for r in server.requests_to(MARKETS)] == [None, "2", "4"]
    assert result.counts["skipped_scalar_without_range"] == 1
    assert result.questions[0].crowd_probability == pytest.approx(0.42)  # mid of 0.40 / 0.44
    assert result.questions[0].domain == "Economics"


def test_crowd_falls_back_to_last_price_in_cents(server, client):
    cents_only = market(0, yes_bid=0, yes_ask=100, last_price=37)
    for name in ("yes_bid_dollars", "yes_ask_dollars", "last_price_dollars"):
        del cents_only[name]
    server.route(MARKETS, [Reply(200, {"markets": [cents_only], "cursor": ""})])
    (question,) = kalshi.harvest_open(client, server.base_url, now=NOW).questions
    assert question.crowd_probability == 0.37


def test_determined_is_not_final_and_finalized_is(server, client):
    server.route(
        f"{MARKETS}/A", [Reply(200, {"market": market(1, status="determined", result="yes")})]
    )
    server.route(
        f"{MARKETS}/B", [Reply(200, {"market": market(2, status="finalized", result="no")})]
    )
    server.route(
        f"{MARKETS}/C", [Reply(200, {"market": market(3, status="finalized", result="void")})]
    )
    server.route(f"{MARKETS}/D", [Reply(200, {"market": market(4, status="closed")})])
    server.route(f"{MARKETS}/E", [Reply(200, {"nothing": True})])
    result = kalshi.fetch_resolutions(client, server.base_url, ["A", "B", "C", "D", "E"])
    by_id = {r.external_id[-2:]: r for r in result.resolutions}
    assert (by_id["T1"].value, by_id["T1"].final) == (1.0, False)
    assert (by_id["T2"].value, by_id["T2"].final) == (0.0, True)
    assert by_id["T3"].status is OutcomeStatus.ANNULLED
    assert set(by_id) == {"T1", "T2", "T3"}
    assert len(result.errors) == 1 and "market E" in result.errors[0]


def test_a_null_empty_or_wrongly_typed_title_or_ticker_is_refused_with_a_line_naming_it(
    server, client
):
    bad = [market(1, title=None), market(2, title="\t"), market(3, title=7), market(4, ticker=None)]
    server.route(MARKETS, [Reply(200, {"markets": [market(0), *bad, market(5)], "cursor": ""})])
    result = kalshi.harvest_open(client, server.base_url, now=NOW)
    assert [q.external_id for q in result.questions] == ["KXCPI-26MAR-T0", "KXCPI-26MAR-T5"]
    assert result.questions[1].title == "Will CPI rise more than 0.5% in March?"
    assert result.counts["skipped_malformed"] == 4 and len(result.errors) == 4
    null, empty, number, no_ticker = result.errors
    assert "market 'KXCPI-26MAR-T1' is malformed: title is null" in null
    assert "market 'KXCPI-26MAR-T2' is malformed: title is empty" in empty
    assert "market 'KXCPI-26MAR-T3' is malformed: title is not text (got int 7)" in number
    assert "market None is malformed: ticker is null" in no_ticker


# Decided markets in the shape GET /markets/{ticker} returns them (its time fields and the
# settlement timer), fetched at FETCHED. An open-ended market ("before 2030") closes early
# when its event happens, and its expiration times stay at the far bound.
FETCHED = datetime(2026, 5, 24, 6, 0, tzinfo=UTC)


def recorded(ticker: str, **fields) -> dict:
    return {
        "ticker": ticker,
        "event_ticker": ticker.rsplit("-", 1)[0],
        "market_type": "binary",
        "title": "Will SpaceX land a crewed Starship on Mars before 2030?",
        "yes_sub_title": "Before 2030",
        "can_close_early": True,
        "created_time": "2025-01-13T01:51:41.778164Z",
        "open_time": "2025-01-13T02:30:00Z",
        "close_time": "2026-05-20T03:59:00Z",
        "expected_expiration_time": "2099-12-31T15:00:00Z",
        "expiration_time": "2099-12-31T15:00:00Z",
        "latest_expiration_time": "2099-12-31T15:00:00Z",
        "settlement_timer_seconds": 3600,
        "last_price_dollars": "0.9900",
        "status": "finalized",
        "result": "yes",
        **fields,
    }


def test_a_decided_market_resolves_at_its_settlement_else_its_last_passed_time(server, client):
    payloads = {
        # settlement_ts when given.
        "S": recorded("KXMARS-30-S", settlement_ts="2026-05-20T15:00:00Z"),
        # Settled without settlement_ts, its expirations at 2099: the (early) close.
        "A": recorded("KXMARS-30-A"),
        # Expired after its close, every time passed: the expiration.
        "B": recorded(
            "KXCPI-26APR-B",
            close_time="2026-05-12T12:29:00Z",
            expected_expiration_time="2026-05-12T14:00:00Z",
            expiration_time="2026-05-12T14:00:00Z",
            latest_expiration_time="2026-05-19T14:00:00Z",
            result="no",
        ),
        # Voided early (close moved to the annulment), expirations at 2099: the close.
        "V": recorded("KXMARS-30-V", result="void", close_time="2026-03-02T17:00:00Z"),
        # Voided before it closed, every time in the future: when it was seen decided.
        "W": recorded("KXMARS-30-W", result="void", close_time="2029-12-31T23:59:00Z"),
    }
    for ticker, payload in payloads.items():
        server.route(f"{MARKETS}/{ticker}", [Reply(200, {"market": payload})])
    result = kalshi.fetch_resolutions(client, server.base_url, list(payloads), now=FETCHED)
    by_id = {r.external_id[-1]: r for r in result.resolutions}
    assert result.errors == [] and set(by_id) == set(payloads)
    assert by_id["S"].resolved_at == datetime(2026, 5, 20, 15, 0, tzinfo=UTC)
    assert by_id["A"].resolved_at == datetime(2026, 5, 20, 3, 59, tzinfo=UTC)
    assert (by_id["A"].status, by_id["A"].value) == (OutcomeStatus.RESOLVED, 1.0)
    assert by_id["B"].resolved_at == datetime(2026, 5, 12, 14, 0, tzinfo=UTC)
    assert by_id["V"].resolved_at == datetime(2026, 3, 2, 17, 0, tzinfo=UTC)
    assert by_id["V"].status is OutcomeStatus.ANNULLED
    assert by_id["W"].resolved_at == FETCHED and by_id["W"].status is OutcomeStatus.ANNULLED
    assert all(r.resolved_at <= FETCHED for r in result.resolutions)
