"""Manifold MULTIPLE_CHOICE and PSEUDO_NUMERIC markets, in the LiteMarket / FullMarket shapes
of common/src/api/market-types.ts: harvested as choice and numeric questions with the crowd's
forecast, and resolved to an option index or a number."""

from __future__ import annotations

from datetime import timedelta

import pytest

from futureworld.domain import QUANTILE_LEVELS, OutcomeStatus, QuestionKind
from futureworld.sources import manifold
from tests.sources.loopback_server import Reply
from tests.sources.test_manifold import NOW, lite_market, ms, paged_markets


def choice_lite(i: int, **overrides) -> dict:
    """A LiteMarket of a cpmm-multi-1 market: no probability, pool or answers."""
    market = lite_market(i, outcomeType="MULTIPLE_CHOICE", mechanism="cpmm-multi-1")
    del market["probability"]
    market.update(overrides)
    return market


def answer(market_id: str, index: int, text: str, probability: float, **extra) -> dict:
    return {
        "id": f"{market_id}-ans{index}",
        "index": index,
        "contractId": market_id,
        "userId": "u1",
        "text": text,
        "createdTime": ms(NOW - timedelta(days=2)),
        "probability": probability,
        "pool": {"YES": 100 * (1 - probability), "NO": 100 * probability},
        "totalLiquidity": 100,
        "subsidyPool": 0,
        **extra,
    }


def choice_full(i: int, probabilities=(0.2, 0.5, 0.3), **overrides) -> dict:
    market = choice_lite(i)
    market_id = market["id"]
    texts = ("North", "South", "East", "West")
    # Listed out of index order: the options follow `index`, not the list.
    answers = [answer(market_id, k, texts[k], p) for k, p in enumerate(probabilities)][::-1]
    market.update(
        answers=answers,
        shouldAnswersSumToOne=True,
        addAnswersMode="DISABLED",
        description={"type": "doc", "content": []},
    )
    market.update(overrides)
    return market


def numeric_lite(i: int, **overrides) -> dict:
    market = lite_market(
        i,
        outcomeType="PSEUDO_NUMERIC",
        mechanism="cpmm-1",
        probability=0.35,
        value=70.0,
        min=0,
        max=200,
        isLogScale=False,
    )
    market.update(overrides)
    return market


def test_choice_and_numeric_markets_are_harvested_with_the_crowds_forecast(server, client):
    markets = [lite_market(0), choice_lite(1), numeric_lite(2), choice_lite(3)]
    server.route("/v0/markets", paged_markets(markets))
    server.route("/v0/market/m001", [Reply(200, choice_full(1))])
    server.route("/v0/market/m003", [Reply(200, choice_full(3, shouldAnswersSumToOne=False))])
    result = manifold.harvest_open(client, server.base_url, now=NOW, page_size=10)
    by_id = {q.external_id: q for q in result.questions}
    assert list(by_id) == ["m000", "m001", "m002"] and result.errors == []
    assert result.counts["skipped_independent_answers"] == 1
    choice = by_id["m001"]
    assert choice.kind is QuestionKind.CHOICE
    assert choice.options == ("North", "South", "East")
    assert choice.crowd_forecast == (0.2, 0.5, 0.3) and choice.crowd_probability is None
    assert choice.extra["answer_ids"] == ["m001-ans0", "m001-ans1", "m001-ans2"]
    assert choice.choice_spec.ordered is False
    numeric = by_id["m002"]
    assert numeric.kind is QuestionKind.NUMERIC
    spec = numeric.numeric_spec
    assert (spec.lower, spec.upper, spec.open_lower, spec.open_upper) == (0.0, 200.0, False, False)
    assert numeric.crowd_forecast == (70.0,) * len(QUANTILE_LEVELS)
    assert numeric.crowd_probability is None
    assert by_id["m000"].kind is QuestionKind.BINARY and by_id["m000"].crowd_probability == 0.25
    # Only the choice markets needed their FullMarket.
    assert len(server.requests_to("/v0/market/m001")) == 1
    assert server.requests_to("/v0/market/m002") == []


def test_crowd_probabilities_that_do_not_sum_to_one_are_normalised(server, client):
    server.route("/v0/markets", paged_markets([choice_lite(1)]))
    server.route("/v0/market/m001", [Reply(200, choice_full(1, probabilities=(0.3, 0.5)))])
    [question] = manifold.harvest_open(client, server.base_url, now=NOW).questions
    assert question.crowd_forecast == pytest.approx((0.375, 0.625))


def test_a_choice_market_whose_answers_cannot_be_fetched_is_skipped_alone(server, client):
    markets = [choice_lite(1), numeric_lite(2), choice_lite(3)]
    server.route("/v0/markets", paged_markets(markets))
    server.route("/v0/market/m001", [Reply(404, "")])
    server.route("/v0/market/m003", [Reply(200, {**choice_full(3), "answers": []})])
    result = manifold.harvest_open(client, server.base_url, now=NOW)
    assert [q.external_id for q in result.questions] == ["m002"]
    assert result.counts["skipped_failed_fetch"] == 1
    assert result.counts["skipped_malformed"] == 1
    assert "m001" in result.errors[0] and "404" in result.errors[0]
    assert "m003" in result.errors[1] and "answers" in result.errors[1]


def test_a_log_scale_numeric_market_keeps_its_scale(server, client):
    market = numeric_lite(2, min=1, max=10_000, isLogScale=True, value=250.0)
    server.route("/v0/markets", paged_markets([market]))
    [question] = manifold.harvest_open(client, server.base_url, now=NOW).questions
    assert question.numeric_spec.log_scale and question.crowd_forecast[2] == 250.0


def resolved(market: dict, resolution: str, **extra) -> dict:
    when = NOW + timedelta(days=40)
    return {
        **market,
        "isResolved": True,
        "resolution": resolution,
        "resolutionTime": ms(when),
        **extra,
    }


def test_choice_resolutions_choose_one_cancel_and_split(server, client):
    server.route("/v0/market/m001", [Reply(200, resolved(choice_full(1), "m001-ans2"))])
    server.route("/v0/market/m002", [Reply(200, resolved(choice_full(2), "CANCEL"))])
    server.route("/v0/market/m003", [Reply(200, resolved(choice_full(3), "MKT"))])
    server.route("/v0/market/m004", [Reply(200, resolved(choice_full(4), "nobody"))])
    server.route("/v0/market/m005", [Reply(200, choice_full(5))])
    ids = ["m001", "m002", "m003", "m004", "m005"]
    result = manifold.fetch_resolutions(client, server.base_url, ids, now=NOW)
    by_id = {r.external_id: r for r in result.resolutions}
    assert set(by_id) == {"m001", "m002", "m003"}
    assert by_id["m001"].status is OutcomeStatus.RESOLVED and by_id["m001"].value == 2.0
    assert by_id["m002"].status is OutcomeStatus.ANNULLED and by_id["m003"].value is None
    assert by_id["m003"].status is OutcomeStatus.ANNULLED
    assert len(result.errors) == 1 and "nobody" in result.errors[0]


def test_numeric_resolutions_take_the_value_or_the_scale_position(server, client):
    plain = numeric_lite(1)
    log = numeric_lite(2, min=1, max=10_000, isLogScale=True)
    server.route(
        "/v0/market/m001",
        [Reply(200, resolved(plain, "MKT", resolutionValue=83.4, resolutionProbability=0.417))],
    )
    server.route("/v0/market/m002", [Reply(200, resolved(log, "MKT", resolutionProbability=0.5))])
    server.route("/v0/market/m003", [Reply(200, resolved(numeric_lite(3), "CANCEL"))])
    server.route(
        "/v0/market/m004", [Reply(200, resolved(numeric_lite(4), "MKT", resolutionValue=250.0))]
    )
    ids = ["m001", "m002", "m003", "m004"]
    result = manifold.fetch_resolutions(client, server.base_url, ids, now=NOW)
    by_id = {r.external_id: r.value for r in result.resolutions}
    assert result.errors == []
    assert by_id["m001"] == 83.4
    assert abs(by_id["m002"] - 100.0) < 1e-9  # halfway on ln x between 1 and 10 000
    assert by_id["m003"] is None
    assert by_id["m004"] == 200.0  # the market pays out at its bound
