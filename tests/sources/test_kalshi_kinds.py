"""Kalshi scalar markets in the Trade API v2 market shape (market_type "scalar", floor_strike,
cap_strike, expiration_value, settlement_value in cents): numeric questions on the strikes'
range with the YES price as the crowd's point, resolved to the settlement's value."""

from __future__ import annotations

import pytest

from futureworld.domain import QUANTILE_LEVELS, OutcomeStatus, QuestionKind
from futureworld.sources import kalshi
from tests.sources.loopback_server import Reply
from tests.sources.test_kalshi import MARKETS, NOW, cursor_pages, market


def scalar(i: int, **overrides) -> dict:
    body = market(
        i,
        market_type="scalar",
        title="What will March CPI inflation be?",
        floor_strike=0.0,
        cap_strike=1.0,
        strike_type="between",
    )
    body.update(overrides)
    return body


def test_scalar_markets_with_a_range_are_numeric_questions(server, client):
    markets = [market(0), scalar(1), scalar(2, cap_strike=None), market(3, market_type="combo")]
    server.route(MARKETS, cursor_pages(markets))
    result = kalshi.harvest_open(client, server.base_url, now=NOW)
    by_id = {q.external_id: q for q in result.questions}
    assert list(by_id) == ["KXCPI-26MAR-T0", "KXCPI-26MAR-T1"] and result.errors == []
    assert result.counts["skipped_scalar_without_range"] == 1
    assert result.counts["skipped_unsupported_kind"] == 1
    question = by_id["KXCPI-26MAR-T1"]
    assert question.kind is QuestionKind.NUMERIC and question.crowd_probability is None
    spec = question.numeric_spec
    assert (spec.lower, spec.upper, spec.open_lower, spec.open_upper) == (0.0, 1.0, False, False)
    # The YES mid 0.42 is the point 0 + 0.42 · (1 − 0).
    assert question.crowd_forecast == pytest.approx((0.42,) * len(QUANTILE_LEVELS))


def settled(body: dict, **fields) -> dict:
    return {**body, "status": "finalized", "settlement_ts": "2026-04-11T13:00:00Z", **fields}


def test_scalar_settlements_resolve_to_the_value(server, client):
    replies = {
        "A": settled(scalar(1, ticker="A"), result="yes", expiration_value="0.37"),
        "B": settled(scalar(2, ticker="B"), result="no", expiration_value="", settlement_value=25),
        "C": settled(scalar(3, ticker="C"), result="yes", expiration_value="1.8"),
        "D": settled(scalar(4, ticker="D"), result="void"),
        "E": settled(scalar(5, ticker="E"), result="yes", expiration_value=""),
        "F": settled(
            scalar(6, ticker="F", floor_strike=2.0, cap_strike=4.0),
            result="scalar",
            settlement_value=99,
            settlement_value_dollars="0.3500",
        ),
    }
    for ticker, body in replies.items():
        server.route(f"{MARKETS}/{ticker}", [Reply(200, {"market": body})])
    result = kalshi.fetch_resolutions(client, server.base_url, list(replies), now=NOW)
    by_id = {r.external_id: r for r in result.resolutions}
    assert by_id["A"].value == pytest.approx(0.37)
    assert by_id["B"].value == pytest.approx(0.25)
    assert by_id["C"].value == 1.0  # beyond the cap the payout is flat: the range's bound
    assert by_id["D"].status is OutcomeStatus.ANNULLED
    assert by_id["F"].value == pytest.approx(2.0 + 0.35 * 2.0)  # the dollar field wins
    assert "E" not in by_id and len(result.errors) == 1 and "settlement_value" in result.errors[0]
