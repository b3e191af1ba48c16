"""Evaluation: score groups of resolved binary forecasts and tabulate them.

The unit is the question: an agent's forecast of a question is the mean of its G rollouts'
probabilities, an unparsed rollout counting as IMPUTED_P (ForecastBench imputes 0.5 for a
missing forecast), so n, the bootstrap and every metric are over questions, and an agent whose
answers do not parse is scored, not dropped; ForecastBench's 5% rule (IMPUTED_CUTOFF_PCT) flags
it ineligible instead. Each row also gives the parse rate and the expected Brier of a single
sample (`sample_brier`: per-rollout scoring, reported apart).

Owns per-group metric rows (Brier, log score, accuracy, ECE, skill vs crowd and base rate,
the imputed share and eligibility, bootstrap CI), the grouping every kind's table shares, the
markdown score table, and the groups and series the plots draw (plots.py draws them).
Binary-only apart from the grouping and the per-round series: choice and numeric forecasts
are scored in evaluation_kinds.py, ForecastBench's leaderboard scores (difficulty-adjusted
Brier, Brier Index) in leaderboard.py. The formulas live in `futureworld.scoring`; loading
forecasts is the caller's job.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

import numpy as np

from futureworld import scoring
from futureworld.imputation import (
    IMPUTED_P,
    Eligibility,
    forecaster_eligibility,
    question_forecast,
)

__all__ = ["IMPUTED_P", "question_forecast"]  # the imputation rule, re-exported for callers

GROUP_KEYS = ("agent", "policy_version", "source", "domain", "round")
"""Fields a score table can be grouped by."""


@dataclass(frozen=True, kw_only=True)
class ForecastRecord:
    """One agent's resolved forecast of one binary question (its group of rollouts at one
    forecast time), with its references."""

    agent: str
    policy_version: int | None
    """None for agents without versions (baselines)."""
    source: str
    domain: str
    p_yes: float
    """The question's forecast: the mean of its samples (`question_forecast`)."""
    y: float
    """The outcome, 1.0 or 0.0."""
    crowd_p: float | None = None
    """Crowd / market P(yes) at the question's cut-off, when the source has one."""
    base_rate_p: float | None = None
    """A base-rate forecast for the question (e.g. the YES share of its source so far)."""
    round: int | None = None
    """Evaluation round (simulated day, training round), for per-round curves."""
    as_of: datetime | None = None
    sample_p: tuple[float, ...] = ()
    """Every rollout's P(yes), IMPUTED_P where it did not parse; () means one sample, p_yes."""
    imputed: int = 0
    """Rollouts whose answer did not parse (counted as IMPUTED_P)."""
    question: str | None = None
    """The question's external id (unique within its source): the question of the difficulty
    model (futureworld.leaderboard); None where the caller has no id."""
    resolved_at: datetime | None = None
    """When the outcome resolved: the end of the forecast's horizon (futureworld.horizons)."""

    @property
    def samples(self) -> tuple[float, ...]:
        return self.sample_p or (self.p_yes,)

    @property
    def imputed_share(self) -> float:
        """How much of the question's forecast is imputation: imputed rollouts / rollouts (1 for a
        missing answer, as ForecastBench counts a missing forecast; 1/G per unparsed rollout)."""
        return self.imputed / len(self.samples)

    def __post_init__(self) -> None:
        if not 0 <= self.imputed <= len(self.samples):
            raise ValueError(f"forecast of {self.agent}: {self.imputed} imputed samples of "
                             f"{len(self.samples)}")  # fmt: skip
        for name in ("p_yes", "crowd_p", "base_rate_p"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"forecast of {self.agent}: {name} {value} is outside [0, 1]")
        if self.y not in (0.0, 1.0):
            raise ValueError(f"forecast of {self.agent}: outcome y must be 0 or 1, got {self.y}")


@dataclass(frozen=True, kw_only=True)
class ScoreRow:
    """Metrics of one group of forecasts; a None group field means "all values"."""

    agent: str | None
    policy_version: int | None
    source: str | None
    n: int
    """Questions (forecasts of a question: a re-forecast counts again)."""
    brier: float
    """Lower is better."""
    log_score: float
    """Mean clipped log-likelihood; higher is better (≤ 0)."""
    accuracy: float
    ece: float
    brier_ci: tuple[float, float] | None
    """Percentile bootstrap interval of the Brier score; None when n_bootstrap = 0."""
    brier_skill_vs_crowd: float | None
    """1 − Brier/Brier_crowd over the forecasts that have a crowd p; None if none do."""
    brier_skill_vs_base_rate: float | None
    unadjusted_brier_index: float
    """100 · (1 − √Brier) of this group's own Brier. Not ForecastBench's Brier Index, which is
    the same transform of the rescaled difficulty-adjusted Brier (futureworld.leaderboard)."""
    samples: int = 0
    """Rollouts behind the n forecasts."""
    parse_rate: float = 1.0
    """Share of the samples whose answer parsed (the rest counted as IMPUTED_P)."""
    sample_brier: float | None = None
    """Expected Brier of one sample: the mean over rollouts of (p_i − y)², imputed included."""
    imputed: float = 0.0
    """Question forecasts supplied by imputation: the sum of `ForecastRecord.imputed_share`
    (a whole number when every imputed answer is a whole missing group, as for a baseline)."""
    imputed_share: float = 0.0
    """imputed / n: the share ForecastBench's 5% rule tests."""
    eligibility: Eligibility | None = None
    """The forecaster's standing under the 5% rule over every record scored with it (of its
    round too, when grouped by round); None when the row pools forecasters."""
    domain: str | None = None
    round: int | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready dict; `domain` and `round` appear only when the table is grouped by them."""
        return row_as_dict(self)


def row_as_dict(row: Any) -> dict[str, Any]:
    """A score row of any kind as a JSON-ready dict: tuples as lists, enums as their values,
    and `domain` and `round` only when the table is grouped by them."""
    out = {f.name: getattr(row, f.name) for f in fields(row)}
    for name, value in out.items():
        if isinstance(value, tuple):
            out[name] = list(value)
        elif isinstance(value, StrEnum):
            out[name] = str(value)
    for optional in ("domain", "round"):
        if out[optional] is None:
            del out[optional]
    return out


def _skill(p: np.ndarray, y: np.ndarray, reference: list[float | None]) -> float | None:
    has = np.array([r is not None for r in reference], dtype=bool)
    if not has.any():
        return None
    ref = np.array([r for r in reference if r is not None], dtype=np.float64)
    reference_brier = scoring.brier(ref, y[has])
    if reference_brier == 0.0:
        return None  # a perfect reference leaves no skill to measure
    return scoring.brier_skill(scoring.brier(p[has], y[has]), reference_brier)


def score_group(
    records: Sequence[ForecastRecord], *, n_bootstrap: int = 1000, seed: int = 0
) -> dict[str, Any]:
    """All metrics of one group of forecasts (n ≥ 1), as ScoreRow fields."""
    p = np.array([r.p_yes for r in records], dtype=np.float64)
    y = np.array([r.y for r in records], dtype=np.float64)
    brier = scoring.brier(p, y)
    samples = np.array([s for r in records for s in r.samples], dtype=np.float64)
    imputed = sum(r.imputed_share for r in records)
    sample_y = np.array([r.y for r in records for _ in r.samples], dtype=np.float64)
    ci = (
        scoring.bootstrap_ci((p - y) ** 2, np.mean, n_resamples=n_bootstrap, seed=seed)
        if n_bootstrap > 0
        else None
    )
    return {
        "n": len(records),
        "brier": brier,
        "log_score": scoring.log_score(p, y),
        "accuracy": scoring.accuracy(p, y),
        "ece": scoring.expected_calibration_error(p, y),
        "brier_ci": ci,
        "brier_skill_vs_crowd": _skill(p, y, [r.crowd_p for r in records]),
        "brier_skill_vs_base_rate": _skill(p, y, [r.base_rate_p for r in records]),
        "unadjusted_brier_index": scoring.brier_index(brier),
        "samples": len(samples),
        "parse_rate": 1 - sum(r.imputed for r in records) / len(samples),
        "sample_brier": scoring.brier(samples, sample_y),
        "imputed": int(imputed) if float(imputed).is_integer() else imputed,
        "imputed_share": imputed / len(records),
    }


def _sort_key(key: tuple[Any, ...]) -> tuple[Any, ...]:
    # None ("all") sorts after the concrete values of its column
    return tuple((v is None, "" if v is None else v) for v in key)


def score_forecasts(
    records: Iterable[ForecastRecord],
    *,
    by: Sequence[str] = ("agent", "policy_version", "source"),
    include_overall: bool = True,
    n_bootstrap: int = 1000,
    seed: int = 0,
    reference_agents: Collection[str] = (),
) -> list[ScoreRow]:
    """One ScoreRow per group of `by`; with include_overall (and "source" in `by`), also a row
    with source=None pooling every source of the group's other keys. Sorted by group key.

    Each row of one forecaster (agent and version in `by`) carries its `forecaster_eligibility`
    over all of `records` (per round when "round" is in `by`): the scored set is what was
    passed, so an ineligible forecaster is flagged on every row, never dropped."""
    records = list(records)
    keys = [k for k in ("agent", "policy_version", "round") if k in by]
    verdicts = (
        forecaster_eligibility(records, keys=keys, reference_agents=reference_agents)
        if {"agent", "policy_version"} <= set(by)
        else {}
    )
    rows = []
    for named, members in group_records(records, by=by, include_overall=include_overall):
        metrics = score_group(members, n_bootstrap=n_bootstrap, seed=seed)
        eligibility = verdicts.get(tuple(named[k] for k in keys))
        rows.append(ScoreRow(**named, **metrics, eligibility=eligibility))
    return rows


R = TypeVar("R")


def group_records(
    records: Iterable[R], *, by: Sequence[str], include_overall: bool = True
) -> list[tuple[dict[str, Any], list[R]]]:
    """Records grouped by the GROUP_KEYS fields in `by`, sorted by group key: ({key: value or
    None}, members) pairs; with include_overall (and "source" in `by`) also one group per
    value of the other keys pooling every source (source None)."""
    unknown = [key for key in by if key not in GROUP_KEYS]
    if unknown:
        raise ValueError(f"cannot group forecasts by {unknown}; choose from {GROUP_KEYS}")
    groups: dict[tuple[Any, ...], list[R]] = {}
    for record in records:
        values = {key: getattr(record, key) for key in by}
        full = tuple(values.get(key) for key in GROUP_KEYS)
        groups.setdefault(full, []).append(record)
        if include_overall and "source" in by:
            pooled = tuple(None if key == "source" else values.get(key) for key in GROUP_KEYS)
            groups.setdefault(pooled, []).append(record)
    return [
        (dict(zip(GROUP_KEYS, key, strict=True)), groups[key])
        for key in sorted(groups, key=_sort_key)
    ]


def score_cell(value: Any) -> str:
    """A metric as a table shows it: 3 decimals (1 from 10 up), an interval, — for None."""
    if value is None:
        return "—"
    if isinstance(value, tuple):
        return f"[{value[0]:.3f}, {value[1]:.3f}]"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


SCORE_COLUMNS = (
    "n",
    "parse_rate",
    "brier",
    "brier_ci",
    "sample_brier",
    "log_score",
    "accuracy",
    "ece",
    "brier_skill_vs_crowd",
    "brier_skill_vs_base_rate",
    "unadjusted_brier_index",
    "imputed",
    "eligibility",
)
"""ScoreRow's metric columns, in table order."""
SCORE_HEADERS = {
    "n": "n questions",
    "parse_rate": "parse rate",
    "sample_brier": "sample brier",
    "unadjusted_brier_index": "unadjusted BI",
}
"""Column headers that differ from the field name."""


def score_table_markdown(rows: Sequence[ScoreRow]) -> str:
    """A markdown table of score rows ("all" where a group field pools every value)."""
    group_cols = ["agent", "policy_version", "source"]
    group_cols += [c for c in ("domain", "round") if any(getattr(r, c) is not None for r in rows)]
    lines = [
        "| " + " | ".join(group_cols + [SCORE_HEADERS.get(c, c) for c in SCORE_COLUMNS]) + " |",
        "|" + "---|" * len(group_cols) + "---:|" * len(SCORE_COLUMNS),
    ]
    for row in rows:
        cells = ["all" if getattr(row, c) is None else str(getattr(row, c)) for c in group_cols]
        cells += [score_cell(getattr(row, c)) for c in SCORE_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def metric_by_round(
    rows: Sequence[ScoreRow], metric: str, *, label_by: Sequence[str] = ("agent",)
) -> dict[str, list[tuple[int, float]]]:
    """Series {label: [(round, value), …]} from rows scored with "round" in `by`."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        value = getattr(row, metric)
        if row.round is None or value is None:
            continue
        label = " ".join(str(getattr(row, key)) for key in label_by)
        series.setdefault(label, []).append((row.round, float(value)))
    return {label: sorted(points) for label, points in series.items()}


def reliability_groups(
    records: Iterable[ForecastRecord],
) -> dict[str, tuple[list[float], list[float]]]:
    """(forecasts, outcomes) per "agent vN" (an agent without versions, a baseline: its name
    alone): the groups of a reliability diagram."""
    groups: dict[str, tuple[list[float], list[float]]] = {}
    for record in records:
        version = "" if record.policy_version is None else f" v{record.policy_version}"
        p, y = groups.setdefault(f"{record.agent}{version}", ([], []))
        p.append(record.p_yes)
        y.append(record.y)
    return groups
