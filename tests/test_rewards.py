"""Reward functions on real domain objects: hand-computed values and edge cases."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from futureworld import rewards
from futureworld.agent.parsing import parse_final_answer
from futureworld.domain import (
    QUANTILE_LEVELS,
    NumericSpec,
    Outcome,
    OutcomeStatus,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)
from futureworld.rewards import REWARD_FUNCTIONS, RewardFn

AT = datetime(2025, 10, 16, tzinfo=UTC)


def _question(kind: QuestionKind = QuestionKind.BINARY, **kwargs: object) -> Question:
    return Question(
        source="sim",
        external_id="q1",
        title="Will it?",
        created_at=AT,
        info_cutoff_at=AT,
        kind=kind,
        id=7,
        **kwargs,
    )


def _choice_question(n_options: int = 3) -> Question:
    return _question(QuestionKind.CHOICE, options=tuple("abcdefg"[:n_options]))


def _numeric_question(**spec: object) -> Question:
    fields: dict[str, object] = {"lower": 0.0, "upper": 10.0}
    fields.update(spec)
    return _question(QuestionKind.NUMERIC, extra=NumericSpec(**fields).to_extra())  # type: ignore[arg-type]


def _outcome(value: float | None, status: OutcomeStatus = OutcomeStatus.RESOLVED) -> Outcome:
    return Outcome(question_id=7, revision=1, status=status, value=value, resolved_at=AT)


def _trajectory(**kwargs: object) -> Trajectory:
    return Trajectory(question_id=7, agent_id=1, policy_version=0, sample_index=0, **kwargs)


def test_registry_and_enum_agree() -> None:
    assert set(REWARD_FUNCTIONS) == set(RewardFn)
    assert rewards.DEFAULT_REWARD is RewardFn.BRIER


def test_brier_reward_is_negative_squared_error() -> None:
    result = REWARD_FUNCTIONS[RewardFn.BRIER](_trajectory(p_yes=0.7), _question(), _outcome(1.0))
    assert result is not None
    assert result.value == pytest.approx(-0.09)
    assert result.components == {"p_yes": 0.7, "outcome": 1.0, "brier": pytest.approx(0.09)}


def test_brier_reward_treats_p_zero_and_one_as_valid_answers() -> None:
    brier = REWARD_FUNCTIONS[RewardFn.BRIER]
    assert brier(_trajectory(p_yes=0.0), _question(), _outcome(0.0)).value == 0.0
    assert brier(_trajectory(p_yes=0.0), _question(), _outcome(1.0)).value == -1.0
    assert brier(_trajectory(p_yes=1.0), _question(), _outcome(1.0)).value == 0.0
    assert brier(_trajectory(p_yes=1.0), _question(), _outcome(0.0)).value == -1.0


@pytest.mark.parametrize(
    "trajectory",
    [
        _trajectory(p_yes=None, parse_status=ParseStatus.MISSING),
        _trajectory(p_yes=None, parse_status=ParseStatus.OK),
        _trajectory(p_yes=0.4, parse_status=ParseStatus.OUT_OF_RANGE),
    ],
)
def test_unparseable_answer_scores_below_every_valid_answer(trajectory: Trajectory) -> None:
    result = REWARD_FUNCTIONS[RewardFn.BRIER](trajectory, _question(), _outcome(1.0))
    assert result.value == -1.25
    assert result.components["parse_failed"] == 1.0
    log_result = REWARD_FUNCTIONS[RewardFn.LOG_SCORE](trajectory, _question(), _outcome(1.0))
    assert log_result.value < math.log(0.01)


def test_log_score_reward_is_clipped_log_likelihood() -> None:
    log_fn = REWARD_FUNCTIONS[RewardFn.LOG_SCORE]
    assert log_fn(_trajectory(p_yes=0.8), _question(), _outcome(1.0)).value == pytest.approx(
        math.log(0.8)
    )
    assert log_fn(_trajectory(p_yes=0.8), _question(), _outcome(0.0)).value == pytest.approx(
        math.log(0.2)
    )
    assert log_fn(_trajectory(p_yes=0.0), _question(), _outcome(1.0)).value == pytest.approx(
        math.log(0.01)
    )
    assert log_fn(_trajectory(p_yes=1.0), _question(), _outcome(1.0)).value == pytest.approx(
        math.log(0.99)
    )


def test_annulled_outcome_raises_a_clear_error() -> None:
    annulled = _outcome(None, OutcomeStatus.ANNULLED)
    questions = [_question(), _choice_question(), _numeric_question()]
    for fn in REWARD_FUNCTIONS.values():
        for question in questions:
            if fn(_trajectory(p_yes=0.5, choice=0), question, _outcome(0.0)) is None:
                continue
            with pytest.raises(rewards.AnnulledOutcomeError, match="annulled"):
                fn(_trajectory(p_yes=0.5, choice=0), question, annulled)


def test_non_binary_outcome_of_binary_question_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"outcome 0\.5; expected 0 or 1"):
        REWARD_FUNCTIONS[RewardFn.BRIER](_trajectory(p_yes=0.5), _question(), _outcome(0.5))


def test_outcome_of_another_question_is_rejected() -> None:
    other = Outcome(
        question_id=8, revision=1, status=OutcomeStatus.RESOLVED, value=1.0, resolved_at=AT
    )
    with pytest.raises(ValueError, match="belongs to question 8"):
        REWARD_FUNCTIONS[RewardFn.BRIER](_trajectory(p_yes=0.5), _question(), other)


def test_rewards_return_none_for_questions_of_another_kind() -> None:
    choice_q = _choice_question()
    assert REWARD_FUNCTIONS[RewardFn.BRIER](_trajectory(p_yes=0.5), choice_q, _outcome(1)) is None
    assert REWARD_FUNCTIONS[RewardFn.RLCR](_trajectory(p_yes=0.5), _question(), _outcome(1)) is None
    assert REWARD_FUNCTIONS[RewardFn.CRPS](_trajectory(p_yes=0.5), _question(), _outcome(1)) is None


def test_applicable_rewards_follow_the_question_kind() -> None:
    assert rewards.applicable_rewards(_question()) == [RewardFn.BRIER, RewardFn.LOG_SCORE]
    assert rewards.applicable_rewards(_choice_question()) == [RewardFn.RLCR]
    assert rewards.applicable_rewards(_numeric_question()) == [RewardFn.CRPS]


def test_rlcr_reward_compares_choice_with_outcome_index() -> None:
    question = _choice_question()
    rlcr = REWARD_FUNCTIONS[RewardFn.RLCR]
    right = rlcr(_trajectory(choice=2, p_yes=0.8), question, _outcome(2.0))
    assert right.value == pytest.approx(1.0 - 0.04)
    assert right.components["correct"] == 1.0
    wrong = rlcr(_trajectory(choice=1, p_yes=0.8), question, _outcome(2.0))
    assert wrong.value == pytest.approx(-0.64)
    assert rlcr(_trajectory(choice=None, p_yes=0.8), question, _outcome(2.0)).value == -1.25
    assert rlcr(_trajectory(choice=5, p_yes=0.8), question, _outcome(2.0)).value == -1.25


def test_rlcr_reward_scores_the_parsed_choice_answer() -> None:
    question = _choice_question()
    answer = parse_final_answer("<probabilities>A: 0.1, B: 0.6, C: 0.3</probabilities>", question)
    trajectory = _trajectory(
        p_yes=answer.p_yes, choice=answer.choice, probabilities=answer.probabilities
    )
    result = REWARD_FUNCTIONS[RewardFn.RLCR](trajectory, question, _outcome(1.0))
    assert result.value == pytest.approx(1.0 - 0.4**2)
    wrong = REWARD_FUNCTIONS[RewardFn.RLCR](trajectory, question, _outcome(2.0))
    assert wrong.value == pytest.approx(-(0.6**2))


@pytest.mark.parametrize("value", [3.0, 1.5, -1.0])
def test_choice_outcome_must_be_an_option_index(value: float) -> None:
    with pytest.raises(ValueError, match=r"expected an option index in \[0, 3\)"):
        REWARD_FUNCTIONS[RewardFn.RLCR](
            _trajectory(p_yes=0.5, choice=0), _choice_question(), _outcome(value)
        )


def _slow_crps_reward(quantiles: list[float], y: float, lower: float, upper: float) -> float:
    total = 0.0
    for tau, q in zip(QUANTILE_LEVELS, quantiles, strict=True):
        u, v = (q - lower) / (upper - lower), (y - lower) / (upper - lower)
        total += tau * (v - u) if v >= u else (tau - 1.0) * (v - u)
    return -2.0 * total / len(QUANTILE_LEVELS)


def test_crps_reward_is_negative_crps_in_units_of_the_range() -> None:
    question = _numeric_question(lower=10.0, upper=30.0)
    quantiles = [12.0, 15.0, 18.0, 20.0, 26.0]
    crps = REWARD_FUNCTIONS[RewardFn.CRPS]
    result = crps(_trajectory(quantiles=tuple(quantiles)), question, _outcome(19.0))
    assert result.value == pytest.approx(_slow_crps_reward(quantiles, 19.0, 10.0, 30.0))
    assert result.components["crps"] == pytest.approx(-result.value)
    assert result.components["median"] == 18.0
    perfect = crps(_trajectory(quantiles=(19.0,) * 5), question, _outcome(19.0))
    assert perfect.value == 0.0


def test_crps_reward_of_the_worst_answer_within_closed_bounds_is_minus_one() -> None:
    question = _numeric_question(lower=0.0, upper=10.0)
    worst = REWARD_FUNCTIONS[RewardFn.CRPS](
        _trajectory(quantiles=(0.0,) * 5), question, _outcome(10.0)
    )
    assert worst.value == pytest.approx(-1.0)
    open_question = _numeric_question(lower=0.0, upper=10.0, open_upper=True)
    far = REWARD_FUNCTIONS[RewardFn.CRPS](
        _trajectory(quantiles=(0.0,) * 5), open_question, _outcome(500.0)
    )
    assert far.value == rewards.NUMERIC_REWARD_FLOOR and far.components["crps"] > 1.0


def test_crps_reward_takes_log_scale_positions() -> None:
    question = _numeric_question(lower=1.0, upper=10_000.0, log_scale=True)
    quantiles = (10.0, 50.0, 100.0, 200.0, 1000.0)
    result = REWARD_FUNCTIONS[RewardFn.CRPS](
        _trajectory(quantiles=quantiles), question, _outcome(100.0)
    )
    logs = [math.log10(q) for q in quantiles]
    assert result.value == pytest.approx(_slow_crps_reward(logs, 2.0, 0.0, 4.0))


@pytest.mark.parametrize(
    "trajectory",
    [
        _trajectory(quantiles=()),
        _trajectory(quantiles=(1.0, 2.0, 3.0)),
        _trajectory(quantiles=(5.0, 4.0, 6.0, 7.0, 8.0)),
        _trajectory(quantiles=(-1.0, 4.0, 6.0, 7.0, 8.0)),
        _trajectory(quantiles=(1.0, 4.0, 6.0, 7.0, 8.0), parse_status=ParseStatus.NOT_MONOTONE),
    ],
)
def test_unusable_quantile_answers_score_minus_one_and_a_quarter(trajectory: Trajectory) -> None:
    result = REWARD_FUNCTIONS[RewardFn.CRPS](trajectory, _numeric_question(), _outcome(5.0))
    assert result.value == rewards.UNPARSEABLE_REWARD


def test_numeric_outcome_beyond_a_closed_bound_is_rejected() -> None:
    with pytest.raises(ValueError, match="outside its range"):
        REWARD_FUNCTIONS[RewardFn.CRPS](
            _trajectory(quantiles=(1.0,) * 5), _numeric_question(), _outcome(11.0)
        )


def test_log_score_reward_is_scoring_log_score_of_one_forecast() -> None:
    from futureworld import scoring

    log_score = REWARD_FUNCTIONS[RewardFn.LOG_SCORE]
    for p in (0.0, 0.005, 0.01, 0.2, 0.5, 0.73, 0.99, 0.999, 1.0):
        for y in (0.0, 1.0):
            value = log_score(_trajectory(p_yes=p), _question(), _outcome(y)).value
            assert value == pytest.approx(scoring.log_score([p], [y]), abs=1e-12)
