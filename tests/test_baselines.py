"""Baselines on every question kind: the crowd's and the uniform forecast as trajectories
whose answer text parses back to the same forecast; the base rate is binary-only and
smoothed by a Beta prior."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from futureworld.answers import parse_final_answer
from futureworld.answers.numeric import uniform_quantiles
from futureworld.baselines import (
    BASE_RATE_PSEUDO_COUNT,
    BASELINES,
    Baseline,
    base_rate,
    baseline_trajectory,
)
from futureworld.domain import (
    QUANTILE_LEVELS,
    NumericSpec,
    ParseStatus,
    Question,
    QuestionKind,
    StopReason,
)

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _question(kind: QuestionKind, **extra) -> Question:
    fields: dict = {"crowd_probability": 0.7}
    if kind is QuestionKind.CHOICE:
        fields = {
            "options": ("North", "South", "East"),
            "extra": {"crowd_probabilities": [0.2, 0.5, 0.3], **extra},
        }
    elif kind is QuestionKind.NUMERIC:
        spec = extra.pop("spec", NumericSpec(lower=0.0, upper=200.0))
        fields = {"extra": {**spec.to_extra(), **extra}}
    return Question(
        source="sim",
        external_id=f"{kind}",
        title="?",
        created_at=T0,
        info_cutoff_at=T0,
        kind=kind,
        id=1,
        **fields,
    )


def _trajectory(question: Question, baseline: Baseline, history=()):
    forecast = BASELINES[baseline](question, history)
    return baseline_trajectory(question, forecast, agent_id=1, policy_version=0, as_of=T0)


def test_the_registry_covers_every_baseline() -> None:
    assert set(BASELINES) == set(Baseline)


@pytest.mark.parametrize("kind", list(QuestionKind))
@pytest.mark.parametrize("baseline", [Baseline.CROWD, Baseline.UNIFORM])
def test_a_baselines_answer_text_parses_back_to_its_forecast(kind, baseline) -> None:
    question = _question(
        kind, **({"crowd_quantiles": [10.0, 40.0, 60.0, 90.0, 150.0]} if kind == "numeric" else {})
    )
    t = _trajectory(question, baseline)
    assert t.parse_status is ParseStatus.OK and t.stop_reason is StopReason.ANSWERED
    parsed = parse_final_answer(t.turns[0].text, question)
    assert parsed.status is ParseStatus.OK
    assert parsed.p_yes == pytest.approx(t.p_yes) if t.p_yes is not None else parsed.p_yes is None
    assert parsed.choice == t.choice
    assert parsed.probabilities == pytest.approx(t.probabilities)
    assert parsed.quantiles == pytest.approx(t.quantiles)


def test_a_tiny_crowd_probability_is_written_without_an_exponent() -> None:
    # %.6g wrote 1e-05, which the probability grammar refuses (MALFORMED).
    binary = replace(_question(QuestionKind.BINARY), crowd_probability=1e-05)
    t = _trajectory(binary, Baseline.CROWD)
    assert t.turns[0].text == "<probability>0.00001</probability>"
    assert parse_final_answer(t.turns[0].text, binary).p_yes == 1e-05 == t.p_yes
    choice = _question(QuestionKind.CHOICE, crowd_probabilities=[1e-07, 0.5, 0.5 - 1e-07])
    t = _trajectory(choice, Baseline.CROWD)
    assert parse_final_answer(t.turns[0].text, choice).probabilities == t.probabilities


def test_crowd_and_uniform_forecasts_per_kind() -> None:
    choice = _question(QuestionKind.CHOICE)
    crowd = _trajectory(choice, Baseline.CROWD)
    assert (crowd.probabilities, crowd.choice, crowd.p_yes) == ((0.2, 0.5, 0.3), 1, 0.5)
    uniform = _trajectory(choice, Baseline.UNIFORM)
    assert uniform.probabilities == pytest.approx((1 / 3,) * 3) and uniform.choice == 0
    numeric = _question(QuestionKind.NUMERIC)
    assert _trajectory(numeric, Baseline.UNIFORM).quantiles == pytest.approx(
        tuple(200.0 * t for t in QUANTILE_LEVELS)
    )
    assert _trajectory(_question(QuestionKind.BINARY), Baseline.UNIFORM).p_yes == 0.5


def test_a_crowd_without_a_forecast_is_a_missing_answer() -> None:
    numeric = _question(QuestionKind.NUMERIC)  # no crowd_quantiles
    t = _trajectory(numeric, Baseline.CROWD)
    assert t.parse_status is ParseStatus.MISSING and t.quantiles == () and t.turns[0].text == ""


def test_uniform_quantiles_on_a_log_scale_are_uniform_on_ln_x() -> None:
    spec = NumericSpec(lower=1.0, upper=10_000.0, log_scale=True)
    quantiles = uniform_quantiles(_question(QuestionKind.NUMERIC, spec=spec))
    for level, value in zip(QUANTILE_LEVELS, quantiles, strict=True):
        assert spec.normalise(value) == pytest.approx(level)
    assert math.isclose(quantiles[2], 100.0)


def test_the_base_rate_is_binary_only() -> None:
    history = [("sim", T0 - timedelta(days=1), 1.0), ("sim", T0 - timedelta(days=2), 0.0)]
    binary = _trajectory(_question(QuestionKind.BINARY), Baseline.BASE_RATE, history)
    # One YES, one NO: (1 + 1) / (2 + 2).
    assert binary.p_yes == 0.5 and binary.parse_status is ParseStatus.OK
    for kind in (QuestionKind.CHOICE, QuestionKind.NUMERIC):
        t = _trajectory(_question(kind), Baseline.BASE_RATE, history)
        assert t.parse_status is ParseStatus.MISSING


def _history(*values: float, source: str = "sim", days_before: int = 1):
    return [(source, T0 - timedelta(days=days_before + i), v) for i, v in enumerate(values)]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ((), 1 / 2),  # the prior mean: (0 + 1) / (0 + 2)
        ((0.0,), 1 / 3),  # (0 + 1) / (1 + 2)
        ((1.0,), 2 / 3),  # (1 + 1) / (1 + 2)
        ((1.0, 1.0, 1.0, 0.0), 4 / 6),  # (3 + 1) / (4 + 2)
        ((0.0,) * 8, 1 / 10),  # (0 + 1) / (8 + 2)
    ],
)
def test_the_base_rate_is_the_laplace_smoothed_yes_frequency(values, expected) -> None:
    assert BASE_RATE_PSEUDO_COUNT == 2.0  # Beta(1, 1): the hand computations below assume it
    question = _question(QuestionKind.BINARY)
    assert base_rate(question, _history(*values)) == pytest.approx(expected)


def test_the_base_rate_counts_only_its_source_before_the_cut_off() -> None:
    question = _question(QuestionKind.BINARY)
    history = [
        *_history(0.0),  # counted: sim, a day before the cut-off
        ("sim", T0, 0.0),  # at the cut-off: not yet known
        ("sim", T0 + timedelta(days=1), 0.0),
        *_history(0.0, 0.0, source="other"),
    ]
    assert base_rate(question, history) == pytest.approx(1 / 3)
