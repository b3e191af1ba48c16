"""ForecastBench's leaderboard scores (src/leaderboard/main.py) against hand computations: the
two-way fixed-effects fit, per-resolution-date dataset scoring, the equal-weight overall, the
rescaling that puts Always 0.5 at 0.25, the Brier Index of the rescaled score, missing forecasts
imputed per round, and the 5% rule keeping a forecaster out of the reference set."""

from __future__ import annotations

import math

import numpy as np
import pytest

from futureworld.evaluation import ForecastRecord
from futureworld.imputation import Eligibility
from futureworld.leaderboard import (
    forecastbench_leaderboard,
    leaderboard_rows_text,
    two_way_fixed_effects,
)

R1, R2 = "2025-10-12", "2025-10-26"
MARKET, DATASET = "forecastbench:manifold", "forecastbench:fred"


def _f(agent: str, source: str, question: str, p: float | None, y: float) -> ForecastRecord:
    return ForecastRecord(
        agent=agent,
        policy_version=0 if agent == "uniform" else 1,
        source=source,
        domain="d",
        p_yes=0.5 if p is None else p,
        y=y,
        imputed=int(p is None),
        question=question,
    )


def test_fixed_effects_match_a_dense_least_squares_fit() -> None:
    rng = np.random.default_rng(0)
    observations = [
        (f"f{i}", f"q{j}", float(rng.random())) for i in range(4) for j in range(6) if (i + j) % 5
    ]
    a, b = two_way_fixed_effects(observations)
    forecasters = sorted({o[0] for o in observations})
    questions = sorted({o[1] for o in observations})
    design = np.zeros((len(observations), len(forecasters) + len(questions)))
    for k, (f, q, _) in enumerate(observations):
        design[k, forecasters.index(f)] = 1
        design[k, len(forecasters) + questions.index(q)] = 1
    y = np.array([o[2] for o in observations])
    dense = design @ np.linalg.lstsq(design, y, rcond=None)[0]
    ours = np.array([a[f] + b[q] for f, q, _ in observations])
    np.testing.assert_allclose(ours, dense, atol=1e-12)
    with pytest.raises(ValueError, match="not connected"):
        two_way_fixed_effects([("a", "q1", 0.1), ("b", "q2", 0.2)])


def _round_fixture() -> list[ForecastRecord]:
    """Round 1: market q1. Round 2: market q2; dataset d at two resolution dates and d2 at one
    (its other horizon unresolved, so no record). A forecasts both rounds, B only round 2; C
    leaves one round-2 answer unparsed; uniform (a baseline) skips d2."""
    q1, q2 = f"{R1}/q1", f"{R2}/q2"
    d_a, d_b, d2 = f"{R2}/d@2025-11-02", f"{R2}/d@2025-11-25", f"{R2}/d2@2025-11-02"
    rows = [
        ("A", MARKET, q1, 0.8, 1.0),  # 0.04
        ("A", MARKET, q2, 0.6, 1.0),  # 0.16
        ("A", DATASET, d_a, 0.3, 0.0),  # 0.09
        ("A", DATASET, d_b, 0.4, 1.0),  # 0.36
        ("A", DATASET, d2, 0.2, 0.0),  # 0.04
        ("B", MARKET, q2, 0.7, 1.0),  # 0.09
        ("B", DATASET, d_a, 0.1, 0.0),  # 0.01
        ("B", DATASET, d_b, 0.5, 1.0),  # 0.25
        ("B", DATASET, d2, 0.4, 0.0),  # 0.16
        ("C", MARKET, q2, 0.0, 1.0),  # 1.0, a confident miss that must not move the effects
        ("C", DATASET, d_a, None, 0.0),  # unparsed: 1 of 4 imputed, 25% > 5%
        ("C", DATASET, d_b, 1.0, 1.0),
        ("C", DATASET, d2, 1.0, 0.0),
        ("uniform", MARKET, q2, 0.5, 1.0),
        ("uniform", DATASET, d_a, 0.5, 0.0),
        ("uniform", DATASET, d_b, 0.5, 1.0),
    ]
    return [_f(*row) for row in rows]


def test_leaderboard_scores_against_a_hand_computation() -> None:
    board = forecastbench_leaderboard(_round_fixture(), reference_agents={"uniform"})
    rows = {r.agent: r for r in board.rows}
    assert list(rows) == ["A", "B", "C", "uniform"]
    # C is over the 5% rule and uniform is constant: the effects come from A and B alone.
    assert board.reference_set == {"market": ("A v1", "B v1"), "dataset": ("A v1", "B v1")}
    a, b = rows["A"], rows["B"]
    # Dataset: every resolution date is a row, the score their mean (not a mean per question).
    assert (a.n_dataset, b.n_dataset) == (3, 3)
    assert a.brier_dataset == pytest.approx((0.09 + 0.36 + 0.04) / 3)
    assert b.brier_dataset == pytest.approx((0.01 + 0.25 + 0.16) / 3)
    # Markets: A answered q1 (0.04) and q2 (0.16), B only q2 (0.09). Fitted exactly,
    # b_q2 − b_q1 = 0.12 and a_B − a_A = −0.07; rescaled (shift: the mean b over q1, q2):
    # A = 0.10, B = −0.07 + 0.10 = 0.03, the difficulty of q2 taken off B's raw 0.09.
    assert a.brier_market == pytest.approx(0.10) and b.brier_market == pytest.approx(0.09)
    assert a.difficulty_adjusted_market == pytest.approx(0.10)
    assert b.difficulty_adjusted_market == pytest.approx(0.03)
    # A and B forecast the same dataset rows: adjusted equals raw there.
    assert b.difficulty_adjusted_dataset == pytest.approx(0.14)
    # Overall: the equal-weight mean of market and dataset, raw and adjusted.
    assert b.brier_overall == pytest.approx((0.09 + 0.14) / 2)
    assert b.difficulty_adjusted_overall == pytest.approx((0.03 + 0.14) / 2)
    assert b.brier_index == pytest.approx(100 * (1 - math.sqrt(0.085)))
    assert b.brier_index_market == pytest.approx(100 * (1 - math.sqrt(0.03)))
    # Always 0.5 on every question of the kind would score exactly 0.25; uniform missed q1 of
    # round 1 (it was not active then), so on markets it gets 0.25 − b_q2 + mean b = 0.19.
    u = rows["uniform"]
    assert u.difficulty_adjusted_market == pytest.approx(0.19)
    assert u.difficulty_adjusted_dataset == pytest.approx(0.25)
    # uniform skipped d2 of a round it was active in: imputed 0.5, counted, and exempt.
    assert (u.n_dataset, u.imputed, u.eligibility) == (3, 1, Eligibility.REFERENCE)
    c = rows["C"]
    assert (c.eligibility, c.ineligible_rounds, c.imputed) == (Eligibility.INELIGIBLE, (R2,), 1)
    assert c.imputed_share == pytest.approx(0.25)
    # C is scored with the effects of the reference set: its miss of q2 (1.0) − b_q2 + mean b.
    assert c.difficulty_adjusted_market == pytest.approx(1.0 - 0.16 + 0.10)
    assert a.eligibility is Eligibility.ELIGIBLE
    text = "\n".join(leaderboard_rows_text(board))
    assert "ForecastBench C v1 [ineligible]" in text
    assert "difficulty reference set (market): A v1, B v1" in text


def test_an_ineligible_forecaster_leaves_the_reference_set_and_changes_nothing() -> None:
    without_c = [r for r in _round_fixture() if r.agent != "C"]
    with_c = forecastbench_leaderboard(_round_fixture(), reference_agents={"uniform"})
    alone = forecastbench_leaderboard(without_c, reference_agents={"uniform"})
    for mine, other in zip([r for r in with_c.rows if r.agent != "C"], alone.rows, strict=True):
        assert mine.difficulty_adjusted_overall == pytest.approx(other.difficulty_adjusted_overall)


def test_a_forecaster_of_one_kind_has_no_overall_and_other_sources_are_ignored() -> None:
    records = [
        _f("A", MARKET, f"{R2}/q", 0.8, 1.0),
        _f("B", MARKET, f"{R2}/q", 0.6, 1.0),
        _f("A", "manifold", "live-q", 0.1, 1.0),
    ]
    board = forecastbench_leaderboard(records)
    a = board.rows[0]
    assert (a.n_market, a.n_dataset) == (1, 0)
    assert a.brier_market == pytest.approx(0.04)
    assert a.brier_overall is None and a.brier_index is None  # pandas: NaN
    assert a.difficulty_adjusted_market == pytest.approx(0.04)  # balanced: adjusted = raw


def test_only_constant_forecasters_score_their_brier() -> None:
    # The crowd has no dataset forecast (0.5 everywhere) and uniform says 0.5: nothing tells
    # difficulty apart, so each question is as hard as the others and the scores are 0.25.
    records = [_f("crowd", DATASET, f"{R2}/d@2025-11-02", None, 1.0)]
    records += [_f("uniform", DATASET, f"{R2}/d@2025-11-02", 0.5, 1.0)]
    board = forecastbench_leaderboard(records, reference_agents={"crowd", "uniform"})
    assert [r.difficulty_adjusted_dataset for r in board.rows] == [
        pytest.approx(0.25),
        pytest.approx(0.25),
    ]
    assert board.reference_set["dataset"] == ("crowd v1", "uniform v0")
