"""The world's multiple-choice and numeric questions: off by default, known true
distributions that the outcomes follow, time-gated evidence and reports, and the Manifold
MULTIPLE_CHOICE / PSEUDO_NUMERIC shapes on the loopback API."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np
import pytest

from futureworld import scoring_numeric
from futureworld.domain import QUANTILE_LEVELS, QuestionKind
from futureworld.world import (
    ArticleKind,
    KindResolution,
    SimChoiceQuestion,
    SimClock,
    SimNumericQuestion,
    World,
    WorldConfig,
    serve_world,
)
from futureworld.world.server import WorldServer

FAR_FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
KINDS = {"choice_questions_per_day": 3, "numeric_questions_per_day": 2}


def test_a_binary_world_poses_no_other_kinds_and_enabling_them_changes_no_binary_item():
    plain = World(WorldConfig(seed=4, questions_per_day=6))
    mixed = World(WorldConfig(seed=4, questions_per_day=6, **KINDS))
    assert plain.kind_questions_posed_on(2) == ()
    end = plain.day_start(6)
    for day in range(6):
        assert mixed.questions_posed_on(day) == plain.questions_posed_on(day)
        for q in plain.questions_posed_on(day):
            assert mixed.resolution_as_of(q.external_id, FAR_FUTURE) == plain.resolution_as_of(
                q.external_id, FAR_FUTURE
            )
    extra = set(mixed.articles_published_by(end)) - set(plain.articles_published_by(end))
    assert set(plain.articles_published_by(end)) <= set(mixed.articles_published_by(end))
    kind_ids = {q.external_id for day in range(8) for q in mixed.kind_questions_posed_on(day)}
    assert extra and {a.question_id for a in extra} <= kind_ids
    kinds = mixed.kind_questions_posed_on(1)
    assert [type(q) for q in kinds] == [SimChoiceQuestion] * 3 + [SimNumericQuestion] * 2
    posed = [q.created_at for q in (*mixed.questions_posed_on(1), *kinds)]
    assert posed == sorted(posed) and len(set(posed)) == len(posed)
    assert mixed.market(kinds[0].external_id) == kinds[0]
    with pytest.raises(KeyError, match="not a binary question"):
        mixed.question(kinds[0].external_id)


def test_choice_outcomes_follow_the_stated_favourite_probabilities():
    world = World(WorldConfig(seed=5, questions_per_day=1, choice_questions_per_day=40))
    by_p: dict[float, list[bool]] = {}
    for day in range(40):
        for question in world.kind_questions_posed_on(day):
            assert isinstance(question, SimChoiceQuestion)
            assert sum(question.probabilities) == pytest.approx(1.0)
            assert question.options[question.favourite] in question.title
            resolution = world.resolution_as_of(question.external_id, FAR_FUTURE)
            assert isinstance(resolution, KindResolution)
            if resolution.value is not None:
                p_fav = question.probabilities[question.favourite]
                by_p.setdefault(p_fav, []).append(resolution.value == question.favourite)
    for p_fav, hits in by_p.items():
        se = (p_fav * (1 - p_fav) / len(hits)) ** 0.5
        assert abs(np.mean(hits) - p_fav) < 4 * se, (p_fav, np.mean(hits), len(hits))


def test_numeric_outcomes_are_calibrated_against_the_true_quantiles():
    world = World(WorldConfig(seed=6, questions_per_day=1, numeric_questions_per_day=40))
    quantiles, outcomes = [], []
    for day in range(30):
        for question in world.kind_questions_posed_on(day):
            resolution = world.resolution_as_of(question.external_id, FAR_FUTURE)
            if resolution.value is None:
                continue
            assert 0.0 <= resolution.value <= 200.0
            assert f"about {question.mean:g}, give or take {question.sigma:g}" in question.title
            quantiles.append(question.true_quantiles())
            outcomes.append(resolution.value)
    pit = scoring_numeric.pit_histogram(quantiles, QUANTILE_LEVELS, outcomes)
    assert pit.density == pytest.approx(np.ones(6), abs=0.25)
    coverage = scoring_numeric.interval_coverage(quantiles, QUANTILE_LEVELS, outcomes, central=0.9)
    assert coverage == pytest.approx(0.9, abs=0.03)


def test_kind_questions_become_valid_domain_questions_with_the_crowd():
    world = World(WorldConfig(seed=2, **KINDS))
    choice, _, _, numeric, _ = world.kind_questions_posed_on(0)
    domain = choice.to_domain()
    assert domain.kind is QuestionKind.CHOICE and domain.options == choice.options
    assert domain.crowd_forecast == choice.crowd_probabilities
    number = numeric.to_domain()
    assert number.kind is QuestionKind.NUMERIC
    assert number.numeric_spec.upper == 200.0 and number.numeric_spec.unit == "units"


def test_evidence_precedes_and_reports_follow_each_kind_question():
    world = World(WorldConfig(seed=3, **KINDS))
    question = world.kind_questions_posed_on(1)[0]
    resolution = world.resolution_as_of(question.external_id, FAR_FUTURE)
    articles = [
        a
        for a in world.articles_published_by(world.day_start(12))
        if a.question_id == question.external_id
    ]
    evidence = [a for a in articles if a.kind is ArticleKind.EVIDENCE]
    (report,) = [a for a in articles if a.kind is ArticleKind.REPORT]
    assert len(evidence) == 2 and all(a.published_at < question.created_at for a in evidence)
    assert report.published_at == question.resolve_at == resolution.resolved_at
    assert (
        world.resolution_as_of(question.external_id, question.resolve_at - timedelta(seconds=1))
        is None
    )
    assert world.article(report.guid) == report


@pytest.fixture
def world() -> World:
    return World(WorldConfig(seed=8, questions_per_day=2, cancel_rate=0.1, **KINDS))


@pytest.fixture
def clock(world: World) -> SimClock:
    return SimClock(world.day_start(1) + timedelta(hours=12))


@pytest.fixture
def server(world: World, clock: SimClock) -> Iterator[WorldServer]:
    with serve_world(world, clock) as running:
        yield running


def _get(server: WorldServer, path: str, **params: object) -> httpx.Response:
    return httpx.get(f"{server.base_url}{path}", params=params, timeout=10)


def test_choice_markets_follow_the_manifold_multiple_choice_shape(server, world, clock):
    question = world.kind_questions_posed_on(0)[0]
    listed = {m["id"]: m for m in _get(server, "/v0/markets", limit=1000).json()}
    lite = listed[question.external_id]
    assert lite["outcomeType"] == "MULTIPLE_CHOICE" and lite["mechanism"] == "cpmm-multi-1"
    assert "answers" not in lite and "probability" not in lite and "pool" not in lite
    full = _get(server, f"/v0/market/{question.external_id}").json()
    assert full["shouldAnswersSumToOne"] is True and full["addAnswersMode"] == "DISABLED"
    assert [a["text"] for a in full["answers"]] == list(question.options)
    assert [a["index"] for a in full["answers"]] == list(range(len(question.options)))
    assert [a["probability"] for a in full["answers"]] == list(question.crowd_probabilities)
    assert not full["isResolved"] and "resolution" not in full["answers"][0]
    clock.set(question.resolve_at)
    resolved = _get(server, f"/v0/market/{question.external_id}").json()
    truth = world.resolution_as_of(question.external_id, question.resolve_at)
    assert resolved["isResolved"] is True
    if truth.value is None:
        assert resolved["resolution"] == "CANCEL"
    else:
        winner = resolved["answers"][int(truth.value)]
        assert resolved["resolution"] == winner["id"] and winner["resolution"] == "YES"
        assert Counter(a["resolution"] for a in resolved["answers"])["YES"] == 1


def test_numeric_markets_follow_the_manifold_pseudo_numeric_shape(server, world, clock):
    question = world.kind_questions_posed_on(0)[3]
    full = _get(server, f"/v0/market/{question.external_id}").json()
    assert full["outcomeType"] == "PSEUDO_NUMERIC" and full["mechanism"] == "cpmm-1"
    assert (full["min"], full["max"], full["isLogScale"]) == (0.0, 200.0, False)
    assert full["value"] == question.crowd_value
    assert full["probability"] == pytest.approx(question.crowd_value / 200.0, abs=1e-4)
    clock.set(question.resolve_at)
    resolved = _get(server, f"/v0/market/{question.external_id}").json()
    truth = world.resolution_as_of(question.external_id, question.resolve_at)
    if truth.value is None:
        assert resolved["resolution"] == "CANCEL"
    else:
        assert resolved["resolution"] == "MKT" and resolved["resolutionValue"] == truth.value
        assert resolved["resolutionProbability"] == pytest.approx(truth.value / 200.0, abs=1e-4)
    kinds = Counter(m["outcomeType"] for m in _get(server, "/v0/markets", limit=1000).json())
    assert set(kinds) == {"BINARY", "MULTIPLE_CHOICE", "PSEUDO_NUMERIC"}
