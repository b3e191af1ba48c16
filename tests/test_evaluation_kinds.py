"""Score rows of choice and numeric forecasts, their tables and the PIT histogram plot."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from futureworld import scoring, scoring_choice, scoring_numeric
from futureworld.domain import QUANTILE_LEVELS, NumericSpec, Question, QuestionKind
from futureworld.evaluation_kinds import (
    ChoiceForecastRecord,
    NumericForecastRecord,
    choice_record,
    kind_table_markdown,
    numeric_record,
    pit_groups,
    score_choice_forecasts,
    score_numeric_forecasts,
)
from futureworld.plots import plot_pit_histogram

AT = datetime(2026, 3, 1, tzinfo=UTC)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _choice(probabilities, outcome, **kwargs) -> ChoiceForecastRecord:
    fields = {"agent": "a", "policy_version": 1, "source": "sim", "domain": "sports"}
    fields.update(kwargs)
    return ChoiceForecastRecord(probabilities=tuple(probabilities), outcome=outcome, **fields)


def _numeric(quantiles, outcome, **kwargs) -> NumericForecastRecord:
    fields = {"agent": "a", "policy_version": 1, "source": "sim", "domain": "economy"}
    fields.update(kwargs)
    return NumericForecastRecord(quantiles=tuple(quantiles), outcome=outcome, **fields)


def test_choice_rows_hold_the_choice_scores_per_source_and_pooled():
    records = [
        _choice([0.2, 0.5, 0.3], 1, crowd_probabilities=(0.3, 0.4, 0.3)),
        _choice([0.6, 0.3, 0.1], 2, crowd_probabilities=(0.2, 0.2, 0.6)),
        _choice([0.1, 0.9], 1, source="meta", ordered=True),
    ]
    rows = score_choice_forecasts(records, n_bootstrap=100)
    assert [(r.source, r.n) for r in rows] == [("meta", 1), ("sim", 2), (None, 3)]
    sim = rows[1]
    vectors, outcomes = [r.probabilities for r in records[:2]], [1, 2]
    assert sim.brier == pytest.approx(scoring_choice.multiclass_brier(vectors, outcomes))
    assert sim.log_score == pytest.approx(scoring_choice.multiclass_log_score(vectors, outcomes))
    assert sim.ece == pytest.approx(scoring_choice.top_label_ece(vectors, outcomes))
    assert sim.accuracy == 0.5 and sim.rps is None
    crowd = scoring_choice.multiclass_brier([(0.3, 0.4, 0.3), (0.2, 0.2, 0.6)], outcomes)
    assert sim.brier_skill_vs_crowd == pytest.approx(1 - sim.brier / crowd)
    assert sim.brier_ci[0] <= sim.brier <= sim.brier_ci[1]
    pooled = rows[2]
    assert pooled.rps == pytest.approx(0.01)  # only the ordered question: (0.1 − 0)²
    assert pooled.as_dict()["kind"] == "choice" and "domain" not in pooled.as_dict()


def test_numeric_rows_hold_crps_coverage_and_pit_counts():
    rng = np.random.default_rng(0)
    centres = rng.uniform(0.2, 0.8, size=400)
    outcomes = centres + 0.1 * rng.standard_normal(400)
    offsets = 0.1 * np.array([-1.6449, -0.6745, 0.0, 0.6745, 1.6449])
    records = [
        _numeric(c + offsets, y, crowd_quantiles=tuple(c + 2 * offsets))
        for c, y in zip(centres, outcomes, strict=True)
    ]
    (row,) = score_numeric_forecasts(records, by=("agent",), n_bootstrap=100)
    quantiles = centres[:, None] + offsets[None, :]
    crps = scoring.crps_from_quantiles(quantiles, QUANTILE_LEVELS, outcomes)
    assert row.crps == pytest.approx(float(np.mean(crps)))
    assert row.coverage_50 == pytest.approx(0.5, abs=0.08)
    assert row.coverage_90 == pytest.approx(0.9, abs=0.05)
    assert sum(row.pit_counts) == 400 and len(row.pit_counts) == 6
    assert row.crps_skill_vs_crowd > 0  # the crowd is twice as wide as the truth
    table = kind_table_markdown([row])
    assert table.splitlines()[0].startswith("| agent | policy_version | source | n | crps |")
    assert " ".join(map(str, row.pit_counts)) in table


def test_records_are_built_on_the_question_unit_axis_with_the_crowd():
    spec = NumericSpec(lower=100.0, upper=300.0)
    question = Question(
        source="sim",
        external_id="n",
        title="How many?",
        created_at=AT,
        info_cutoff_at=AT,
        kind=QuestionKind.NUMERIC,
        extra={**spec.to_extra(), "crowd_quantiles": [110, 150, 200, 250, 290]},
    )
    record = numeric_record(question, (120, 160, 200, 240, 280), 250.0, agent="a", policy_version=2)
    assert record.quantiles == pytest.approx((0.1, 0.3, 0.5, 0.7, 0.9))
    assert record.outcome == 0.75 and record.crowd_quantiles[0] == pytest.approx(0.05)
    choice_q = Question(
        source="sim",
        external_id="c",
        title="Which?",
        created_at=AT,
        info_cutoff_at=AT,
        kind=QuestionKind.CHOICE,
        options=("x", "y"),
        extra={"ordered_options": True, "crowd_probabilities": [0.3, 0.5]},
    )
    choice = choice_record(choice_q, (0.4, 0.6), 1.0, agent="a", policy_version=2)
    assert choice.ordered and choice.crowd_probabilities == pytest.approx((0.375, 0.625))
    with pytest.raises(ValueError, match="option indices"):
        choice_record(choice_q, (0.4, 0.6), 2.0, agent="a", policy_version=2)


def test_pit_histogram_plot_is_a_png(tmp_path: Path):
    records = [_numeric((0.1, 0.2, 0.3, 0.4, 0.5), y) for y in (0.05, 0.25, 0.45, 0.9)]
    records += [_numeric((0.1, 0.2, 0.3, 0.4, 0.5), 0.35, policy_version=2)]
    groups = pit_groups(records)
    assert set(groups) == {"a v1", "a v2"}
    assert groups["a v1"].counts.tolist() == [1, 0, 1, 0, 1, 1]
    assert isinstance(groups["a v2"], scoring_numeric.PitHistogram)
    path = plot_pit_histogram(groups, tmp_path / "plots" / "pit.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
