"""Evaluation of choice and numeric forecasts: records, per-group score rows, markdown
tables and the PIT histogram's groups (plots.py draws them).

Owns how a resolved choice or numeric answer becomes a record and which metrics a row holds.
Choice rows: multiclass Brier (with a bootstrap interval), log score, top-label accuracy and
ECE, the ranked probability score over the group's ordered-option questions, and Brier skill
vs the crowd where the source gave per-option probabilities. Numeric rows: CRPS on each
question's unit axis (NumericSpec.normalise, so questions of different ranges pool; a bootstrap
interval), coverage of the 50% and 90% central intervals, the PIT histogram's counts, and CRPS
skill vs the crowd's quantiles where the source gave them. Grouping is evaluation.py's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from futureworld import scoring, scoring_choice, scoring_numeric
from futureworld.domain import QUANTILE_LEVELS, Question, QuestionKind
from futureworld.evaluation import group_records, row_as_dict, score_cell


@dataclass(frozen=True, kw_only=True)
class ChoiceForecastRecord:
    """One resolved choice forecast."""

    agent: str
    policy_version: int | None
    source: str
    domain: str
    probabilities: tuple[float, ...]
    outcome: int
    """Index of the option that happened."""
    ordered: bool = False
    crowd_probabilities: tuple[float, ...] | None = None
    round: int | None = None
    as_of: datetime | None = None

    def __post_init__(self) -> None:
        scoring_choice.multiclass_brier([self.probabilities], [self.outcome])  # validates
        crowd = self.crowd_probabilities
        if crowd is not None and len(crowd) != len(self.probabilities):
            raise ValueError(f"forecast of {self.agent}: crowd has another number of options")


@dataclass(frozen=True, kw_only=True)
class NumericForecastRecord:
    """One resolved numeric forecast, on its question's unit axis (0 = lower, 1 = upper)."""

    agent: str
    policy_version: int | None
    source: str
    domain: str
    quantiles: tuple[float, ...]
    """At QUANTILE_LEVELS."""
    outcome: float
    crowd_quantiles: tuple[float, ...] | None = None
    round: int | None = None
    as_of: datetime | None = None

    def __post_init__(self) -> None:
        for values in (self.quantiles, self.crowd_quantiles):
            if values is not None:
                scoring_numeric.pit_histogram([values], QUANTILE_LEVELS, [self.outcome])


def choice_record(
    question: Question,
    probabilities: Sequence[float],
    outcome_value: float,
    *,
    agent: str,
    policy_version: int | None,
    as_of: datetime | None = None,
    round: int | None = None,
) -> ChoiceForecastRecord:
    """The record of a choice answer to `question` that resolved to option `outcome_value`."""
    spec = question.choice_spec
    return ChoiceForecastRecord(
        agent=agent,
        policy_version=policy_version,
        source=question.source,
        domain=question.domain,
        probabilities=tuple(probabilities),
        outcome=int(outcome_value),
        ordered=spec.ordered,
        crowd_probabilities=_normalised(question.crowd_forecast),
        round=round,
        as_of=as_of,
    )


def _normalised(crowd: tuple[float, ...] | None) -> tuple[float, ...] | None:
    """Crowd option probabilities rescaled to sum to 1 (markets' answers rarely sum exactly)."""
    if crowd is None or sum(crowd) <= 0.0:
        return None
    return tuple(p / sum(crowd) for p in crowd)


def numeric_record(
    question: Question,
    quantiles: Sequence[float],
    outcome_value: float,
    *,
    agent: str,
    policy_version: int | None,
    as_of: datetime | None = None,
    round: int | None = None,
) -> NumericForecastRecord:
    """The record of a numeric answer to `question`, moved to the question's unit axis."""
    spec = question.numeric_spec
    crowd = question.crowd_forecast
    return NumericForecastRecord(
        agent=agent,
        policy_version=policy_version,
        source=question.source,
        domain=question.domain,
        quantiles=tuple(spec.normalise(v) for v in quantiles),
        outcome=spec.normalise(outcome_value),
        crowd_quantiles=None if crowd is None else tuple(spec.normalise(v) for v in crowd),
        round=round,
        as_of=as_of,
    )


@dataclass(frozen=True, kw_only=True)
class ChoiceScoreRow:
    """Metrics of one group of choice forecasts; a None group field means "all values"."""

    agent: str | None
    policy_version: int | None
    source: str | None
    n: int
    brier: float
    """Multiclass Brier, lower is better, in [0, 2]."""
    brier_ci: tuple[float, float] | None
    log_score: float
    accuracy: float
    """Share whose most probable option happened."""
    ece: float
    """Top-label ECE, 10 equal-width bins."""
    rps: float | None
    """Ranked probability score over the ordered-option questions; None if there are none."""
    brier_skill_vs_crowd: float | None
    domain: str | None = None
    round: int | None = None
    kind: str = QuestionKind.CHOICE.value

    def as_dict(self) -> dict[str, Any]:
        return row_as_dict(self)


@dataclass(frozen=True, kw_only=True)
class NumericScoreRow:
    """Metrics of one group of numeric forecasts; a None group field means "all values"."""

    agent: str | None
    policy_version: int | None
    source: str | None
    n: int
    crps: float
    """Mean CRPS on the questions' unit axes (−reward), lower is better."""
    crps_ci: tuple[float, float] | None
    coverage_50: float
    """Share of outcomes inside [q25, q75]; 0.5 when calibrated."""
    coverage_90: float
    """Share of outcomes inside [q5, q95]; 0.9 when calibrated."""
    pit_counts: tuple[int, ...]
    """Outcomes between consecutive QUANTILE_LEVELS (0, 5%, 25%, 50%, 75%, 95%, 1)."""
    crps_skill_vs_crowd: float | None
    """1 − CRPS/CRPS_crowd over the forecasts whose question has crowd quantiles."""
    domain: str | None = None
    round: int | None = None
    kind: str = QuestionKind.NUMERIC.value

    def as_dict(self) -> dict[str, Any]:
        return row_as_dict(self)


def _ci(values: np.ndarray, n_bootstrap: int, seed: int) -> tuple[float, float] | None:
    if n_bootstrap <= 0:
        return None
    return scoring.bootstrap_ci(values, np.mean, n_resamples=n_bootstrap, seed=seed)


def score_choice_group(
    records: Sequence[ChoiceForecastRecord], *, n_bootstrap: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """All metrics of one group of choice forecasts (n ≥ 1), as ChoiceScoreRow fields."""
    vectors = [r.probabilities for r in records]
    outcomes = [r.outcome for r in records]
    per_forecast = np.array(
        [scoring_choice.multiclass_brier([v], [y]) for v, y in zip(vectors, outcomes, strict=True)]
    )
    ordered = [r for r in records if r.ordered]
    with_crowd = [r for r in records if r.crowd_probabilities is not None]
    skill = None
    if with_crowd:
        crowd = scoring_choice.multiclass_brier(
            [r.crowd_probabilities for r in with_crowd], [r.outcome for r in with_crowd]
        )
        own = scoring_choice.multiclass_brier(
            [r.probabilities for r in with_crowd], [r.outcome for r in with_crowd]
        )
        skill = None if crowd == 0.0 else scoring.brier_skill(own, crowd)
    return {
        "n": len(records),
        "brier": float(per_forecast.mean()),
        "brier_ci": _ci(per_forecast, n_bootstrap, seed),
        "log_score": scoring_choice.multiclass_log_score(vectors, outcomes),
        "accuracy": scoring_choice.top_label_accuracy(vectors, outcomes),
        "ece": scoring_choice.top_label_ece(vectors, outcomes),
        "rps": scoring_choice.ranked_probability_score(
            [r.probabilities for r in ordered], [r.outcome for r in ordered]
        )
        if ordered
        else None,
        "brier_skill_vs_crowd": skill,
    }


def score_numeric_group(
    records: Sequence[NumericForecastRecord], *, n_bootstrap: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """All metrics of one group of numeric forecasts (n ≥ 1), as NumericScoreRow fields."""
    quantiles = np.array([r.quantiles for r in records])
    outcomes = np.array([r.outcome for r in records])
    crps = np.asarray(scoring.crps_from_quantiles(quantiles, QUANTILE_LEVELS, outcomes)).reshape(-1)
    with_crowd = [r for r in records if r.crowd_quantiles is not None]
    skill = None
    if with_crowd:
        ys = [r.outcome for r in with_crowd]
        crowd = np.mean(
            scoring.crps_from_quantiles(
                [r.crowd_quantiles for r in with_crowd], QUANTILE_LEVELS, ys
            )
        )
        own = np.mean(
            scoring.crps_from_quantiles([r.quantiles for r in with_crowd], QUANTILE_LEVELS, ys)
        )
        skill = None if crowd == 0.0 else float(1.0 - own / crowd)
    coverage = {
        c: scoring_numeric.interval_coverage(quantiles, QUANTILE_LEVELS, outcomes, central=c)
        for c in (0.5, 0.9)
    }
    pit = scoring_numeric.pit_histogram(quantiles, QUANTILE_LEVELS, outcomes)
    return {
        "n": len(records),
        "crps": float(crps.mean()),
        "crps_ci": _ci(crps, n_bootstrap, seed),
        "coverage_50": coverage[0.5],
        "coverage_90": coverage[0.9],
        "pit_counts": tuple(int(c) for c in pit.counts),
        "crps_skill_vs_crowd": skill,
    }


CHOICE_COLUMNS = (
    "n",
    "brier",
    "brier_ci",
    "log_score",
    "accuracy",
    "ece",
    "rps",
    "brier_skill_vs_crowd",
)
NUMERIC_COLUMNS = (
    "n",
    "crps",
    "crps_ci",
    "coverage_50",
    "coverage_90",
    "pit_counts",
    "crps_skill_vs_crowd",
)


@dataclass(frozen=True, kw_only=True)
class KindScoring:
    """How one non-binary kind's forecasts are scored: the row a group becomes, the group's
    metrics (the row's fields) and the row's columns in table order."""

    row: type[ChoiceScoreRow] | type[NumericScoreRow]
    score_group: Callable[..., dict[str, Any]]
    columns: tuple[str, ...]


KIND_SCORING: dict[QuestionKind, KindScoring] = {
    QuestionKind.CHOICE: KindScoring(
        row=ChoiceScoreRow, score_group=score_choice_group, columns=CHOICE_COLUMNS
    ),
    QuestionKind.NUMERIC: KindScoring(
        row=NumericScoreRow, score_group=score_numeric_group, columns=NUMERIC_COLUMNS
    ),
}
"""The non-binary kinds' scoring (binary forecasts are evaluation.py's ScoreRow)."""


def score_kind_forecasts(
    kind: QuestionKind,
    records: Iterable[ChoiceForecastRecord] | Iterable[NumericForecastRecord],
    *,
    by: Sequence[str] = ("agent", "policy_version", "source"),
    include_overall: bool = True,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> list[Any]:
    """One row of the kind's KIND_SCORING per group, grouped as evaluation.score_forecasts
    groups."""
    rules = KIND_SCORING[kind]
    return [
        rules.row(**named, **rules.score_group(members, n_bootstrap=n_bootstrap, seed=seed))
        for named, members in group_records(records, by=by, include_overall=include_overall)
    ]


def score_choice_forecasts(
    records: Iterable[ChoiceForecastRecord],
    *,
    by: Sequence[str] = ("agent", "policy_version", "source"),
    include_overall: bool = True,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> list[ChoiceScoreRow]:
    """score_kind_forecasts of choice records: one ChoiceScoreRow per group."""
    return score_kind_forecasts(
        QuestionKind.CHOICE,
        records,
        by=by,
        include_overall=include_overall,
        n_bootstrap=n_bootstrap,
        seed=seed,
    )


def score_numeric_forecasts(
    records: Iterable[NumericForecastRecord],
    *,
    by: Sequence[str] = ("agent", "policy_version", "source"),
    include_overall: bool = True,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> list[NumericScoreRow]:
    """score_kind_forecasts of numeric records: one NumericScoreRow per group."""
    return score_kind_forecasts(
        QuestionKind.NUMERIC,
        records,
        by=by,
        include_overall=include_overall,
        n_bootstrap=n_bootstrap,
        seed=seed,
    )


def kind_table_markdown(rows: Sequence[ChoiceScoreRow] | Sequence[NumericScoreRow]) -> str:
    """A markdown table of choice or numeric score rows ("all" where a group field pools)."""
    if not rows:
        return ""
    metric_cols = list(KIND_SCORING[QuestionKind(rows[0].kind)].columns)
    group_cols = ["agent", "policy_version", "source"]
    group_cols += [c for c in ("domain", "round") if any(getattr(r, c) is not None for r in rows)]
    lines = [
        "| " + " | ".join(group_cols + metric_cols) + " |",
        "|" + "---|" * len(group_cols) + "---:|" * len(metric_cols),
    ]
    for row in rows:
        cells = ["all" if getattr(row, c) is None else str(getattr(row, c)) for c in group_cols]
        for column in metric_cols:
            value = getattr(row, column)
            is_counts = column == "pit_counts"
            cells.append(" ".join(map(str, value)) if is_counts else score_cell(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def pit_groups(
    records: Iterable[NumericForecastRecord],
) -> dict[str, scoring_numeric.PitHistogram]:
    """The PIT histogram per "agent vN": the groups of a PIT plot."""
    grouped: dict[str, tuple[list[tuple[float, ...]], list[float]]] = {}
    for record in records:
        quantiles, outcomes = grouped.setdefault(
            f"{record.agent} v{record.policy_version}", ([], [])
        )
        quantiles.append(record.quantiles)
        outcomes.append(record.outcome)
    return {
        label: scoring_numeric.pit_histogram(q, QUANTILE_LEVELS, y)
        for label, (q, y) in grouped.items()
    }
