"""Reward functions: (trajectory, question, outcome) → reward, one signature, one registry.

Rewards are higher-is-better and built on the scoring rules of `futureworld.scoring`.
Each scores one question kind (REWARD_KINDS); its REWARD_FUNCTIONS entry returns None on
questions of any other kind. Backfill calls every applicable function once per (trajectory,
reward function, outcome revision).
Annulled outcomes are never scored: the caller voids rewards instead, so scoring one raises.

Choice answers are scored by RLCR on the answer's most probable option and its probability
(the parser's `choice` and `p_yes`); numeric answers by −CRPS on the unit axis of the
question's NumericSpec, i.e. −CRPS/scale with scale = upper − lower (ln upper − ln lower on a
log scale), floored at NUMERIC_REWARD_FLOOR.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from futureworld import scoring
from futureworld.domain import (
    QUANTILE_LEVELS,
    Outcome,
    OutcomeStatus,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)

UNPARSEABLE_REWARD = -1.25
"""Reward of a missing or malformed answer: below the worst valid Brier/RLCR reward (−1),
so answering badly always beats not answering."""

LOG_SCORE_UNPARSEABLE_REWARD = math.log(scoring.LOG_SCORE_CLIP[0]) - 0.25
"""Same idea for the clipped log score, whose worst valid value is ln 0.01 ≈ −4.61."""

NUMERIC_REWARD_FLOOR = -1.0
"""Lowest reward of a valid numeric answer. Within closed bounds −CRPS/scale ≥ −1 already
(every pinball term is at most τ·scale, and 2·mean(τ) = 1 for QUANTILE_LEVELS); the floor
only bites on outcomes far beyond an open bound, so answering still beats not answering."""


class AnnulledOutcomeError(ValueError):
    """Raised when asked to score an annulled outcome; annulments void rewards instead."""


@dataclass(frozen=True)
class RewardValue:
    """A reward and the pieces it was computed from (stored with the reward for audit)."""

    value: float
    """Higher is better."""
    components: dict[str, float] = field(default_factory=dict)
    """Inputs and intermediate terms: p_yes, outcome, brier, crps, parse_failed …"""


def _resolved_value(question: Question, outcome: Outcome) -> float:
    """The outcome value, refusing annulled outcomes and outcomes of another question."""
    if outcome.status is OutcomeStatus.ANNULLED:
        raise AnnulledOutcomeError(
            f"outcome revision {outcome.revision} of question {outcome.question_id} is "
            "annulled: void its rewards instead of scoring it"
        )
    if question.id is not None and outcome.question_id != question.id:
        raise ValueError(
            f"outcome belongs to question {outcome.question_id}, not question {question.id}"
        )
    assert outcome.value is not None  # Outcome enforces a value on resolved outcomes
    return float(outcome.value)


def _binary_outcome(question: Question, outcome: Outcome) -> float:
    y = _resolved_value(question, outcome)
    if y not in (0.0, 1.0):
        raise ValueError(
            f"binary question {question.source}/{question.external_id} has outcome {y}; "
            "expected 0 or 1"
        )
    return y


def _parsed_p_yes(trajectory: Trajectory) -> float | None:
    """The final probability, or None when the answer could not be used (p = 0 is valid)."""
    if trajectory.parse_status is not ParseStatus.OK or trajectory.p_yes is None:
        return None
    return trajectory.p_yes


def brier_reward(trajectory: Trajectory, question: Question, outcome: Outcome) -> RewardValue:
    """Binary: R = −(p − y)²; unparseable answer R = −1.25. Range [−1, 0] for valid answers."""
    y = _binary_outcome(question, outcome)
    p = _parsed_p_yes(trajectory)
    if p is None:
        return RewardValue(UNPARSEABLE_REWARD, {"outcome": y, "parse_failed": 1.0})
    squared_error = (p - y) ** 2
    return RewardValue(-squared_error, {"p_yes": p, "outcome": y, "brier": squared_error})


def log_score_reward(trajectory: Trajectory, question: Question, outcome: Outcome) -> RewardValue:
    """Binary: R = y ln p̃ + (1 − y) ln(1 − p̃), p̃ = clip(p, 0.01, 0.99).

    Unparseable answer: ln 0.01 − 0.25.
    """
    y = _binary_outcome(question, outcome)
    p = _parsed_p_yes(trajectory)
    if p is None:
        return RewardValue(LOG_SCORE_UNPARSEABLE_REWARD, {"outcome": y, "parse_failed": 1.0})
    lo, hi = scoring.LOG_SCORE_CLIP  # scoring.log_score of one forecast, without numpy
    clipped = min(max(p, lo), hi)
    value = y * math.log(clipped) + (1.0 - y) * math.log1p(-clipped)
    return RewardValue(value, {"p_yes": p, "outcome": y, "log_score": value})


def _choice_outcome(question: Question, outcome: Outcome) -> int:
    value = _resolved_value(question, outcome)
    n_options = len(question.choice_spec.options)
    if not (value.is_integer() and 0 <= value < n_options):
        raise ValueError(
            f"choice question {question.source}/{question.external_id} has outcome {value}; "
            f"expected an option index in [0, {n_options})"
        )
    return int(value)


def _numeric_outcome(question: Question, outcome: Outcome) -> float:
    value = _resolved_value(question, outcome)
    if not question.numeric_spec.admits(value):
        raise ValueError(
            f"numeric question {question.source}/{question.external_id} has outcome {value} "
            f"outside its range {question.numeric_spec}"
        )
    return value


def rlcr_reward(trajectory: Trajectory, question: Question, outcome: Outcome) -> RewardValue:
    """Choice: R = 1[choice = outcome] − (q − 1[choice = outcome])², where `choice` is the
    answer's most probable option and q = trajectory.p_yes its probability.

    A missing choice or confidence, or a choice outside the options, scores −1.25.
    """
    answer = _choice_outcome(question, outcome)
    q = _parsed_p_yes(trajectory)
    n_options = len(question.options)
    choice = trajectory.choice
    if q is None or choice is None or not 0 <= choice < n_options:
        return RewardValue(UNPARSEABLE_REWARD, {"outcome": answer, "parse_failed": 1.0})
    correct = choice == answer
    value = scoring.rlcr_reward(correct, q)
    return RewardValue(
        value,
        {"choice": float(choice), "confidence": q, "outcome": answer, "correct": float(correct)},
    )


def crps_reward(trajectory: Trajectory, question: Question, outcome: Outcome) -> RewardValue:
    """Numeric: R = max(−CRPS/scale, −1), CRPS ≈ (2/K) Σ_k pinball_τk(y − q_k) at
    QUANTILE_LEVELS, computed on the unit axis of the question's NumericSpec.

    A missing, unsorted or out-of-range answer scores −1.25.
    """
    spec = question.numeric_spec
    y = _numeric_outcome(question, outcome)
    quantiles = trajectory.quantiles
    usable = (
        trajectory.parse_status is ParseStatus.OK
        and len(quantiles) == len(QUANTILE_LEVELS)
        and all(spec.admits(v) for v in quantiles)
        and all(a <= b for a, b in itertools.pairwise(quantiles))
    )
    if not usable:
        return RewardValue(UNPARSEABLE_REWARD, {"outcome": y, "parse_failed": 1.0})
    unit_quantiles = [spec.normalise(v) for v in quantiles]
    crps = float(scoring.crps_from_quantiles(unit_quantiles, QUANTILE_LEVELS, spec.normalise(y)))
    return RewardValue(
        max(-crps, NUMERIC_REWARD_FLOOR),
        {"outcome": y, "crps": crps, "median": quantiles[QUANTILE_LEVELS.index(0.5)]},
    )


class RewardFn(StrEnum):
    BRIER = "brier"
    """Binary questions: negative Brier score (the training default)."""
    LOG_SCORE = "log_score"
    """Binary questions: clipped log score."""
    RLCR = "rlcr"
    """Choice questions: correctness plus a Brier term on the stated confidence."""
    CRPS = "crps"
    """Numeric questions: negative scaled CRPS of the predicted quantiles."""


RewardFunction = Callable[[Trajectory, Question, Outcome], RewardValue | None]

DEFAULT_REWARD = RewardFn.BRIER
"""The reward training optimises unless configured otherwise."""

REWARD_KINDS: dict[RewardFn, QuestionKind] = {
    RewardFn.BRIER: QuestionKind.BINARY,
    RewardFn.LOG_SCORE: QuestionKind.BINARY,
    RewardFn.RLCR: QuestionKind.CHOICE,
    RewardFn.CRPS: QuestionKind.NUMERIC,
}
"""The question kind each reward function scores."""


def rewards_for_kind(kind: QuestionKind) -> list[RewardFn]:
    """The reward functions that score questions of `kind`, in registry order."""
    return [fn for fn in REWARD_FUNCTIONS if REWARD_KINDS[fn] is kind]


def applicable_rewards(question: Question) -> list[RewardFn]:
    """The reward functions that score questions of this kind, in registry order."""
    return rewards_for_kind(question.kind)


def _of_its_kind(fn: RewardFn, score: RewardFunction) -> RewardFunction:
    """`score` on questions of the kind it scores (REWARD_KINDS), None on every other kind."""
    kind = REWARD_KINDS[fn]

    def reward(trajectory: Trajectory, question: Question, outcome: Outcome) -> RewardValue | None:
        return score(trajectory, question, outcome) if question.kind is kind else None

    reward.__doc__ = score.__doc__
    return reward


REWARD_FUNCTIONS: dict[RewardFn, RewardFunction] = {
    fn: _of_its_kind(fn, score)
    for fn, score in (
        (RewardFn.BRIER, brier_reward),
        (RewardFn.LOG_SCORE, log_score_reward),
        (RewardFn.RLCR, rlcr_reward),
        (RewardFn.CRPS, crps_reward),
    )
}
