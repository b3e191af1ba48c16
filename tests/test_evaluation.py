"""Score tables, grouping, reference skills and plots of resolved forecasts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from futureworld import scoring
from futureworld.evaluation import (
    ForecastRecord,
    ScoreRow,
    metric_by_round,
    question_forecast,
    reliability_groups,
    score_forecasts,
    score_table_markdown,
)
from futureworld.plots import plot_metric_by_round, plot_reliability

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _record(p: float, y: float, **kwargs: object) -> ForecastRecord:
    fields: dict[str, object] = {
        "agent": "a",
        "policy_version": 1,
        "source": "manifold",
        "domain": "sports",
    }
    fields.update(kwargs)
    return ForecastRecord(p_yes=p, y=y, **fields)


RECORDS = [
    _record(0.9, 1.0, crowd_p=0.8, base_rate_p=0.5),
    _record(0.2, 0.0, crowd_p=0.4, base_rate_p=0.5),
    _record(0.6, 0.0, source="fred", base_rate_p=0.5),
    _record(0.7, 1.0, source="fred", base_rate_p=0.5),
]


def _row(rows: list[ScoreRow], **key: object) -> ScoreRow:
    (row,) = [r for r in rows if all(getattr(r, k) == v for k, v in key.items())]
    return row


def test_score_rows_per_source_and_pooled_over_sources() -> None:
    rows = score_forecasts(RECORDS, n_bootstrap=200)
    assert [(r.agent, r.policy_version, r.source, r.n) for r in rows] == [
        ("a", 1, "fred", 2),
        ("a", 1, "manifold", 2),
        ("a", 1, None, 4),
    ]
    manifold = _row(rows, source="manifold")
    assert manifold.brier == pytest.approx((0.01 + 0.04) / 2)
    assert manifold.accuracy == 1.0
    assert manifold.log_score == pytest.approx((math.log(0.9) + math.log(0.8)) / 2)
    # crowd Brier (0.04 + 0.16)/2 = 0.1 → skill 1 − 0.025/0.1
    assert manifold.brier_skill_vs_crowd == pytest.approx(0.75)
    assert manifold.brier_skill_vs_base_rate == pytest.approx(1 - 0.025 / 0.25)
    # 100·(1 − √Brier) of the row's raw Brier, renamed: ForecastBench's Brier Index is of the
    # rescaled difficulty-adjusted Brier (apply_brier_index_transform, futureworld.leaderboard)
    assert manifold.unadjusted_brier_index == pytest.approx(100 * (1 - math.sqrt(0.025)))
    assert manifold.imputed == 0 and manifold.eligibility == "eligible"
    pooled = _row(rows, source=None)
    assert pooled.brier == pytest.approx((0.01 + 0.04 + 0.36 + 0.09) / 4)
    assert pooled.ece == pytest.approx(
        scoring.expected_calibration_error([0.9, 0.2, 0.6, 0.7], [1, 0, 0, 1])
    )


def test_skill_vs_crowd_uses_only_records_with_a_crowd_probability() -> None:
    rows = score_forecasts(RECORDS, n_bootstrap=0)
    assert _row(rows, source="fred").brier_skill_vs_crowd is None
    # pooled: only the two manifold records have a crowd p, so the skill equals manifold's
    assert _row(rows, source=None).brier_skill_vs_crowd == pytest.approx(0.75)


def test_brier_ci_brackets_the_brier_and_is_seeded() -> None:
    records = [_record(p, float(p > 0.4)) for p in np.linspace(0.05, 0.95, 40)]
    (row, _) = score_forecasts(records, n_bootstrap=500, seed=1)
    assert row.brier_ci is not None
    lo, hi = row.brier_ci
    assert lo <= row.brier <= hi
    assert score_forecasts(records, n_bootstrap=500, seed=1)[0].brier_ci == row.brier_ci
    assert score_forecasts(records, n_bootstrap=0)[0].brier_ci is None


def test_as_dict_has_the_documented_keys_and_is_json_ready() -> None:
    row = score_forecasts(RECORDS, n_bootstrap=50)[0]
    out = row.as_dict()
    assert set(out) == {
        "agent",
        "policy_version",
        "source",
        "n",
        "brier",
        "log_score",
        "accuracy",
        "ece",
        "brier_ci",
        "brier_skill_vs_crowd",
        "brier_skill_vs_base_rate",
        "unadjusted_brier_index",
        "samples",
        "parse_rate",
        "sample_brier",
        "imputed",
        "imputed_share",
        "eligibility",
    }
    assert isinstance(out["brier_ci"], list) and len(out["brier_ci"]) == 2
    assert json.loads(json.dumps(out)) == out


def test_grouping_by_round_and_domain_adds_those_keys() -> None:
    records = [_record(0.7, 1.0, round=r) for r in (1, 2)] + [_record(0.4, 1.0, round=2)]
    rows = score_forecasts(records, by=("agent", "round"), n_bootstrap=0)
    assert [(r.round, r.n, r.source) for r in rows] == [(1, 1, None), (2, 2, None)]
    assert rows[0].as_dict()["round"] == 1
    assert "domain" not in rows[0].as_dict()
    assert metric_by_round(rows, "brier") == {
        "a": [(1, pytest.approx(0.09)), (2, pytest.approx((0.09 + 0.36) / 2))]
    }
    with pytest.raises(ValueError, match=r"cannot group forecasts by \['team'\]"):
        score_forecasts(records, by=("team",))


def test_include_overall_false_gives_only_per_source_rows() -> None:
    rows = score_forecasts(RECORDS, include_overall=False, n_bootstrap=0)
    assert [r.source for r in rows] == ["fred", "manifold"]


def test_invalid_records_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"p_yes 1\.5 is outside"):
        _record(1.5, 1.0)
    with pytest.raises(ValueError, match="outcome y must be 0 or 1"):
        _record(0.5, 0.5)


def test_score_table_markdown_lists_every_row() -> None:
    rows = score_forecasts(RECORDS, n_bootstrap=0)
    table = score_table_markdown(rows)
    lines = table.strip().splitlines()
    assert lines[0].startswith(
        "| agent | policy_version | source | n questions | parse rate | brier |"
    )
    assert len(lines) == 2 + len(rows)
    assert "| a | 1 | all | 4 | 1.000 | 0.125 |" in table
    assert "—" in lines[2]  # fred has no crowd probability


def test_reliability_groups_label_a_version_by_agent_and_version_and_a_baseline_by_name() -> None:
    groups = reliability_groups(
        [
            _record(0.9, 1.0),
            _record(0.2, 0.0, policy_version=2),
            _record(0.6, 1.0, agent="crowd", policy_version=None),
        ]
    )
    assert groups == {"a v1": ([0.9], [1.0]), "a v2": ([0.2], [0.0]), "crowd": ([0.6], [1.0])}


def test_plot_reliability_writes_a_png(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(size=200)
    y = (rng.uniform(size=200) < p).astype(float)
    path = plot_reliability(
        {"calibrated": (p, y), "overconfident": (np.round(p), y)}, tmp_path / "sub" / "rel.png"
    )
    assert path.read_bytes()[:8] == PNG_MAGIC
    assert path.stat().st_size > 5_000


def test_plot_metric_by_round_writes_a_png(tmp_path: Path) -> None:
    path = plot_metric_by_round(
        {"agent-a": [(2, 0.20), (1, 0.25), (3, 0.18)], "agent-b": [(1, 0.3)]},
        tmp_path / "brier.png",
        metric="brier",
    )
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_a_question_is_scored_once_on_the_mean_of_its_samples_with_unparsed_ones_as_a_half():
    # G = 4 on one question (y = 1): answers 0.9, 0.7, unparsed, unparsed → p = (0.9 + 0.7 +
    # 0.5 + 0.5) / 4 = 0.65; one question, so n = 1 and the bootstrap has one unit.
    p, samples, imputed = question_forecast([0.9, 0.7, None, None])
    assert (p, samples, imputed) == (0.65, (0.9, 0.7, 0.5, 0.5), 2)
    with pytest.raises(ValueError, match="at least one rollout"):
        question_forecast([])
    first = _record(p, 1.0, sample_p=samples, imputed=imputed)
    # A second question (y = 0) answered 0.2 and 0.4 by both of its two samples... and one
    # question whose every sample failed: forecast 0.5, still scored.
    second = _record(0.3, 0.0, sample_p=(0.2, 0.4))
    failed = _record(0.5, 0.0, imputed=1)
    [row] = score_forecasts([first, second, failed], by=("agent",), n_bootstrap=0)
    assert (row.n, row.samples) == (3, 7)
    assert row.parse_rate == pytest.approx(1 - 3 / 7)
    assert row.brier == pytest.approx(((0.65 - 1) ** 2 + 0.3**2 + 0.5**2) / 3)
    # The expected score of one sample: every rollout scored alone, imputed ones at 0.5.
    per_sample = [(0.9 - 1) ** 2, (0.7 - 1) ** 2, 0.25, 0.25, 0.2**2, 0.4**2, 0.25]
    assert row.sample_brier == pytest.approx(sum(per_sample) / 7)
    with pytest.raises(ValueError, match="imputed"):
        _record(0.5, 0.0, imputed=2)
