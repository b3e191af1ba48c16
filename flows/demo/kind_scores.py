"""How the demo scores a choice or numeric panel: each kind's entry in KIND_PANELS (its score,
calibration and their names, the world's true distribution) and a round's scores of a kind's
panel (KindPanelScore). Building and forecasting the panels is kinds.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from futureworld import scoring
from futureworld.domain import QUANTILE_LEVELS, Question, QuestionKind
from futureworld.scoring import expected_calibration_error
from futureworld.world.questions import SimChoiceQuestion, SimKindQuestion, SimNumericQuestion


@dataclass(frozen=True)
class KindPanelScore:
    """One round's forecasts of a kind's panel, one row per parsed forecast: the question's
    index in the panel and the forecast's scores (see the module docstring)."""

    kind: QuestionKind
    round: int
    policy_version: int
    question: tuple[int, ...]
    score: tuple[float, ...]
    """Multiclass Brier (choice) or CRPS on the unit axis (numeric); lower is better."""
    confidence: tuple[float, ...]
    """Choice: the top option's probability; numeric: 1.0 if in the 50% interval."""
    hit: tuple[float, ...]
    """Choice: 1.0 if the top option won; numeric: 1.0 if in the 90% interval."""
    true_score: float
    """The truth's mean score on the whole panel: the floor."""
    unparsed: int
    informed_score: float | None = None
    """On a research world: the mean score of the forecasts given all of each question's
    evidence (the informed floor, above the truth's); None elsewhere."""
    uninformed_score: float | None = None
    """On a research world: the prior's mean score (the uninformed floor); None elsewhere."""

    @property
    def parse_rate(self) -> float:
        total = len(self.score) + self.unparsed
        return len(self.score) / total if total else float("nan")

    @property
    def mean_score(self) -> float:
        return float(np.mean(self.score)) if self.score else float("nan")

    @property
    def calibration(self) -> float:
        """Choice: top-label ECE; numeric: the 90% interval's coverage."""
        if not self.score:
            return float("nan")
        return KIND_PANELS[self.kind].calibration(self.confidence, self.hit)

    @property
    def coverage_50(self) -> float:
        """Numeric: the 50% interval's coverage."""
        return float(np.mean(self.confidence)) if self.score else float("nan")

    def score_rows(self) -> list[tuple[int, float, float]]:
        """(question, score, 0) rows: a paired bootstrap of the mean score."""
        return [(q, s, 0.0) for q, s in zip(self.question, self.score, strict=True)]

    def calibration_rows(self) -> list[tuple[int, float, float]]:
        """Choice: (question, confidence, correct) rows, whose ECE is the top-label ECE."""
        return list(zip(self.question, self.confidence, self.hit, strict=True))


def _choice_scores(
    _question: Question, probabilities: Sequence[float], outcome: float
) -> tuple[float, float, float]:
    y = int(outcome)
    brier = sum((p - (1.0 if i == y else 0.0)) ** 2 for i, p in enumerate(probabilities))
    top = max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))
    return brier, probabilities[top], 1.0 if top == y else 0.0


def _numeric_scores(
    question: Question, quantiles: Sequence[float], outcome: float
) -> tuple[float, float, float]:
    spec = question.numeric_spec
    unit = [spec.normalise(q) for q in quantiles]
    y = spec.normalise(outcome)
    crps = float(scoring.crps_from_quantiles(unit, QUANTILE_LEVELS, y))
    in_50 = 1.0 if quantiles[1] <= outcome <= quantiles[3] else 0.0
    in_90 = 1.0 if quantiles[0] <= outcome <= quantiles[4] else 0.0
    return crps, in_50, in_90


def _top_label_ece(confidence: Sequence[float], hit: Sequence[float]) -> float:
    return expected_calibration_error(list(confidence), list(hit))


def _coverage(_confidence: Sequence[float], hit: Sequence[float]) -> float:
    return float(np.mean(hit))


@dataclass(frozen=True, kw_only=True)
class KindPanel:
    """How the demo scores and reports one kind's panel (KIND_PANELS)."""

    sim_type: type[SimKindQuestion]
    """The world's questions of the kind."""
    true_forecast: Callable[[Any], tuple[float, ...]]
    """The world question's true distribution, as the kind's answer holds a forecast."""
    score: Callable[[Question, Sequence[float], float], tuple[float, float, float]]
    """(score, confidence, hit) of a forecast given the outcome (KindPanelScore's columns)."""
    calibration: Callable[[Sequence[float], Sequence[float]], float]
    """The calibration column's value from the (confidence, hit) columns."""
    score_name: str
    table_score_name: str
    log_score_name: str
    """The score's name in the demo's round log."""
    calibration_name: str
    claims_calibration: bool
    """The claim pairs the calibration as well as the score (else it is only reported)."""
    reports_coverage_50: bool
    """The table has a 50% coverage column (the confidence column's mean)."""


KIND_PANELS: dict[QuestionKind, KindPanel] = {
    QuestionKind.CHOICE: KindPanel(
        sim_type=SimChoiceQuestion,
        true_forecast=lambda sim: sim.probabilities,
        score=_choice_scores,
        calibration=_top_label_ece,
        score_name="multiclass Brier",
        table_score_name="multiclass Brier",
        log_score_name="Brier",
        calibration_name="top-label ECE",
        claims_calibration=True,
        reports_coverage_50=False,
    ),
    QuestionKind.NUMERIC: KindPanel(
        sim_type=SimNumericQuestion,
        true_forecast=lambda sim: sim.true_quantiles(),
        score=_numeric_scores,
        calibration=_coverage,
        score_name="CRPS",
        table_score_name="CRPS (unit axis)",
        log_score_name="CRPS",
        calibration_name="90% coverage",
        claims_calibration=False,
        reports_coverage_50=True,
    ),
}
"""The demo's non-binary kinds (the binary panel is flows.demo.panel's)."""
