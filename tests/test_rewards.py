"""Reward functions on real domain objects: hand-computed values and edge cases."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from futureworld import rewards
from futureworld.domain import (
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
    for fn in REWARD_FUNCTIONS.values():
        for kind in QuestionKind:
            question = _question(kind, options=("a", "b"))
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
    choice_q = _question(QuestionKind.CHOICE, options=("a", "b", "c"))
    assert REWARD_FUNCTIONS[RewardFn.BRIER](_trajectory(p_yes=0.5), choice_q, _outcome(1)) is None
    assert REWARD_FUNCTIONS[RewardFn.RLCR](_trajectory(p_yes=0.5), _question(), _outcome(1)) is None
    assert REWARD_FUNCTIONS[RewardFn.CRPS](_trajectory(p_yes=0.5), _question(), _outcome(1)) is None


def test_applicable_rewards_follow_the_question_kind() -> None:
    assert rewards.applicable_rewards(_question()) == [RewardFn.BRIER, RewardFn.LOG_SCORE]
    assert rewards.applicable_rewards(_question(QuestionKind.CHOICE)) == [RewardFn.RLCR]
    assert rewards.applicable_rewards(_question(QuestionKind.NUMERIC)) == [RewardFn.CRPS]


def test_rlcr_reward_compares_choice_with_outcome_index() -> None:
    question = _question(QuestionKind.CHOICE, options=("a", "b", "c"))
    rlcr = REWARD_FUNCTIONS[RewardFn.RLCR]
    right = rlcr(_trajectory(choice=2, p_yes=0.8), question, _outcome(2.0))
    assert right.value == pytest.approx(1.0 - 0.04)
    assert right.components["correct"] == 1.0
    wrong = rlcr(_trajectory(choice=1, p_yes=0.8), question, _outcome(2.0))
    assert wrong.value == pytest.approx(-0.64)
    assert rlcr(_trajectory(choice=None, p_yes=0.8), question, _outcome(2.0)).value == -1.25
    assert rlcr(_trajectory(choice=5, p_yes=0.8), question, _outcome(2.0)).value == -1.25


def test_crps_reward_is_negative_scaled_crps() -> None:
    question = _question(
        QuestionKind.NUMERIC, extra={"scale": 2.0, "quantile_levels": [0.25, 0.5, 0.75]}
    )
    crps = REWARD_FUNCTIONS[RewardFn.CRPS]
    result = crps(_trajectory(quantiles=(1.0, 2.0, 3.0)), question, _outcome(2.5))
    # CRPS = (2/3)(0.375 + 0.25 + 0.125) = 0.5, scaled by 2
    assert result.value == pytest.approx(-0.25)
    assert result.components["crps"] == pytest.approx(0.5)
    assert crps(_trajectory(quantiles=()), question, _outcome(2.5)).value == -1.25
    assert crps(_trajectory(quantiles=(3.0, 2.0, 1.0)), question, _outcome(2.5)).value == -1.25


def test_crps_reward_defaults_to_unit_scale_and_even_levels() -> None:
    question = _question(QuestionKind.NUMERIC)
    result = REWARD_FUNCTIONS[RewardFn.CRPS](_trajectory(quantiles=(0.0,)), question, _outcome(4.0))
    # one quantile at level 0.5: CRPS = 2 · 0.5 · 4 = 4
    assert result.value == pytest.approx(-4.0)
