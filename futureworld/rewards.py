"""Reward functions: (trajectory, question, outcome) → reward, one signature, one registry.

Rewards are higher-is-better and built on the scoring rules of `futureworld.scoring`.
Each function returns None when it does not apply to the question's kind; backfill calls
every applicable function once per (trajectory, reward function, outcome revision).
Annulled outcomes are never scored: the caller voids rewards instead, so scoring one raises.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from futureworld import scoring
from futureworld.domain import (
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


def brier_reward(
    trajectory: Trajectory, question: Question, outcome: Outcome
) -> RewardValue | None:
    """Binary: R = −(p − y)²; unparseable answer R = −1.25. Range [−1, 0] for valid answers."""
    if question.kind is not QuestionKind.BINARY:
        return None
    y = _binary_outcome(question, outcome)
    p = _parsed_p_yes(trajectory)
    if p is None:
        return RewardValue(UNPARSEABLE_REWARD, {"outcome": y, "parse_failed": 1.0})
    squared_error = (p - y) ** 2
    return RewardValue(-squared_error, {"p_yes": p, "outcome": y, "brier": squared_error})


def log_score_reward(
    trajectory: Trajectory, question: Question, outcome: Outcome
) -> RewardValue | None:
    """Binary: R = y ln p̃ + (1 − y) ln(1 − p̃), p̃ = clip(p, 0.01, 0.99).

    Unparseable answer: ln 0.01 − 0.25.
    """
    if question.kind is not QuestionKind.BINARY:
        return None
    y = _binary_outcome(question, outcome)
    p = _parsed_p_yes(trajectory)
    if p is None:
        return RewardValue(LOG_SCORE_UNPARSEABLE_REWARD, {"outcome": y, "parse_failed": 1.0})
    value = scoring.log_score([p], [y])
    return RewardValue(value, {"p_yes": p, "outcome": y, "log_score": value})


def rlcr_reward(trajectory: Trajectory, question: Question, outcome: Outcome) -> RewardValue | None:
    """Choice: R = 1[choice = outcome] − (q − 1[choice = outcome])², q = trajectory.p_yes.

    A missing choice or confidence, or a choice outside the options, scores −1.25.
    """
    if question.kind is not QuestionKind.CHOICE:
        return None
    answer = _resolved_value(question, outcome)
    q = _parsed_p_yes(trajectory)
    n_options = len(question.options)
    choice = trajectory.choice
    if q is None or choice is None or (n_options and not 0 <= choice < n_options):
        return RewardValue(UNPARSEABLE_REWARD, {"outcome": answer, "parse_failed": 1.0})
    correct = choice == int(answer)
    value = scoring.rlcr_reward(correct, q)
    return RewardValue(
        value,
        {"choice": float(choice), "confidence": q, "outcome": answer, "correct": float(correct)},
    )


def crps_reward(trajectory: Trajectory, question: Question, outcome: Outcome) -> RewardValue | None:
    """Numeric: R = −CRPS / scale, CRPS ≈ (2/K) Σ_k pinball_τk(y − q_k).

    scale = question.extra["scale"] (default 1; choose it so typical CRPS/scale ≲ 1, since a
    missing or unsorted answer scores −1.25). Levels τ_k = question.extra["quantile_levels"],
    default k/(K + 1).
    """
    if question.kind is not QuestionKind.NUMERIC:
        return None
    y = _resolved_value(question, outcome)
    scale = float(question.extra.get("scale", 1.0))
    if not scale > 0.0:
        raise ValueError(
            f"question {question.source}/{question.external_id}: scale must be > 0, got {scale}"
        )
    quantiles = trajectory.quantiles
    levels = tuple(
        question.extra.get("quantile_levels", scoring.evenly_spaced_levels(max(len(quantiles), 1)))
    )
    usable = (
        trajectory.parse_status is ParseStatus.OK
        and len(quantiles) > 0
        and len(quantiles) == len(levels)
        and all(math.isfinite(v) for v in quantiles)
        and all(a <= b for a, b in itertools.pairwise(quantiles))
    )
    if not usable:
        return RewardValue(UNPARSEABLE_REWARD, {"outcome": y, "parse_failed": 1.0})
    crps = float(scoring.crps_from_quantiles(quantiles, levels, y))
    return RewardValue(-crps / scale, {"outcome": y, "crps": crps, "scale": scale})


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

_KINDS: dict[RewardFn, QuestionKind] = {
    RewardFn.BRIER: QuestionKind.BINARY,
    RewardFn.LOG_SCORE: QuestionKind.BINARY,
    RewardFn.RLCR: QuestionKind.CHOICE,
    RewardFn.CRPS: QuestionKind.NUMERIC,
}


def rewards_for_kind(kind: QuestionKind) -> list[RewardFn]:
    """The reward functions that score questions of `kind`, in registry order."""
    return [fn for fn in REWARD_FUNCTIONS if _KINDS[fn] is kind]


def applicable_rewards(question: Question) -> list[RewardFn]:
    """The reward functions that score questions of this kind, in registry order."""
    return rewards_for_kind(question.kind)


REWARD_FUNCTIONS: dict[RewardFn, RewardFunction] = {
    RewardFn.BRIER: brier_reward,
    RewardFn.LOG_SCORE: log_score_reward,
    RewardFn.RLCR: rlcr_reward,
    RewardFn.CRPS: crps_reward,
}
