"""Choice and numeric scores against slow reference loops and properscoring / scipy values."""

from __future__ import annotations

import math

import numpy as np
import properscoring
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from futureworld import scoring, scoring_choice, scoring_numeric
from futureworld.domain import QUANTILE_LEVELS


@st.composite
def choice_forecasts(draw: st.DrawFn) -> tuple[list[list[float]], list[int]]:
    n = draw(st.integers(1, 12))
    vectors, outcomes = [], []
    for _ in range(n):
        k = draw(st.integers(2, 6))
        weights = draw(st.lists(st.integers(0, 50), min_size=k, max_size=k).filter(any))
        vectors.append([w / sum(weights) for w in weights])
        outcomes.append(draw(st.integers(0, k - 1)))
    return vectors, outcomes


def _slow_brier(vectors, outcomes) -> float:
    total = 0.0
    for p, y in zip(vectors, outcomes, strict=True):
        total += sum((pj - (1.0 if j == y else 0.0)) ** 2 for j, pj in enumerate(p))
    return total / len(vectors)


def _slow_rps(vectors, outcomes) -> float:
    total = 0.0
    for p, y in zip(vectors, outcomes, strict=True):
        cum_p = cum_o = gap = 0.0
        for k in range(len(p) - 1):
            cum_p += p[k]
            cum_o += 1.0 if k == y else 0.0
            gap += (cum_p - cum_o) ** 2
        total += gap / (len(p) - 1)
    return total / len(vectors)


def _slow_top_label_ece(vectors, outcomes, bins: int = 10) -> float:
    tops = []
    for p, y in zip(vectors, outcomes, strict=True):
        best = max(range(len(p)), key=lambda j: (p[j], -j))
        tops.append((p[best], 1.0 if best == y else 0.0))
    total = 0.0
    for b in range(bins):
        members = [t for t in tops if min(int(t[0] * bins), bins - 1) == b]
        if members:
            conf = sum(c for c, _ in members) / len(members)
            acc = sum(a for _, a in members) / len(members)
            total += len(members) / len(tops) * abs(conf - acc)
    return total


@settings(max_examples=60)
@given(forecasts=choice_forecasts())
def test_choice_scores_match_slow_loops(forecasts):
    vectors, outcomes = forecasts
    assert scoring_choice.multiclass_brier(vectors, outcomes) == pytest.approx(
        _slow_brier(vectors, outcomes)
    )
    assert scoring_choice.ranked_probability_score(vectors, outcomes) == pytest.approx(
        _slow_rps(vectors, outcomes)
    )
    assert scoring_choice.top_label_ece(vectors, outcomes) == pytest.approx(
        _slow_top_label_ece(vectors, outcomes)
    )
    slow_log = sum(
        math.log(min(max(p[y], 0.01), 0.99)) for p, y in zip(vectors, outcomes, strict=True)
    ) / len(vectors)
    assert scoring_choice.multiclass_log_score(vectors, outcomes) == pytest.approx(slow_log)


@given(p=st.floats(0.0, 1.0), y=st.integers(0, 1))
def test_two_options_reduce_to_the_binary_scores(p: float, y: int):
    vector, option = [[1.0 - p, p]], [y]  # option 1 is YES
    assert scoring_choice.multiclass_brier(vector, option) == pytest.approx(
        2 * scoring.brier([p], [y])
    )
    assert scoring_choice.multiclass_log_score(vector, option) == pytest.approx(
        scoring.log_score([p], [y])
    )
    assert scoring_choice.ranked_probability_score(vector, option) == pytest.approx(
        scoring.brier([p], [y])
    )


def test_hand_computed_choice_scores():
    vectors, outcomes = [[0.2, 0.5, 0.3], [0.6, 0.3, 0.1]], [1, 2]
    # (0.04 + 0.25 + 0.09) + (0.36 + 0.09 + 0.81) = 0.38 + 1.26 → mean 0.82
    assert scoring_choice.multiclass_brier(vectors, outcomes) == pytest.approx(0.82)
    # RPS: ((0.2)² + (0.7 − 1)²)/2 = 0.065; ((0.6)² + (0.9)²)/2 = 0.585 → mean 0.325
    assert scoring_choice.ranked_probability_score(vectors, outcomes) == pytest.approx(0.325)
    confidence, correct = scoring_choice.top_label(vectors, outcomes)
    assert confidence.tolist() == [0.5, 0.6] and correct.tolist() == [1.0, 0.0]
    assert scoring_choice.top_label_accuracy(vectors, outcomes) == 0.5
    assert scoring_choice.top_label(([0.4, 0.4, 0.2],), [1])[1].tolist() == [0.0]  # tie: A


@pytest.mark.parametrize(
    ("vectors", "outcomes", "message"),
    [
        ([[0.5, 0.6]], [0], "sum to 1"),
        ([[1.2, -0.2]], [0], r"\[0, 1\]"),
        ([[0.5, 0.5]], [2], "option indices"),
        ([[0.5, 0.5]], [0.5], "option indices"),
        ([[1.0]], [0], ">= 2 options"),
        ([], [], "empty"),
        ([[0.5, 0.5]], [0, 1], "2 outcomes"),
    ],
)
def test_bad_choice_forecasts_are_rejected(vectors, outcomes, message):
    with pytest.raises(ValueError, match=message):
        scoring_choice.multiclass_brier(vectors, outcomes)


@pytest.mark.parametrize(("mu", "sigma", "y"), [(0.0, 1.0, 0.3), (2.0, 0.5, 3.1), (-1, 2, -4)])
def test_crps_from_many_quantiles_approaches_the_gaussian_crps(mu, sigma, y):
    levels = scoring.evenly_spaced_levels(399)
    quantiles = stats.norm.ppf(levels, loc=mu, scale=sigma)
    expected = properscoring.crps_gaussian(y, mu=mu, sig=sigma)
    assert scoring.crps_from_quantiles(quantiles, levels, y) == pytest.approx(expected, rel=0.01)


def test_crps_from_the_system_levels_matches_a_slow_pinball_loop():
    quantiles, y = [10.0, 14.0, 17.0, 21.0, 30.0], 19.0
    slow = 0.0
    for tau, q in zip(QUANTILE_LEVELS, quantiles, strict=True):
        slow += max(tau * (y - q), (tau - 1.0) * (y - q))
    assert scoring.crps_from_quantiles(quantiles, QUANTILE_LEVELS, y) == pytest.approx(
        2.0 * slow / 5
    )


def _gaussian_forecasts(n: int, spread: float, seed: int = 0):
    """n forecasts N(μ_i, (spread·σ)²) of outcomes drawn from N(μ_i, σ²), σ = 1."""
    rng = np.random.default_rng(seed)
    mu = rng.uniform(-5, 5, size=n)
    y = mu + rng.standard_normal(n)
    quantiles = mu[:, None] + spread * stats.norm.ppf(QUANTILE_LEVELS)[None, :]
    return quantiles, y


def test_calibrated_forecasts_cover_their_intervals_and_have_a_flat_pit():
    quantiles, y = _gaussian_forecasts(20_000, spread=1.0)
    assert scoring_numeric.interval_coverage(quantiles, QUANTILE_LEVELS, y, central=0.5) == (
        pytest.approx(0.5, abs=0.015)
    )
    assert scoring_numeric.interval_coverage(quantiles, QUANTILE_LEVELS, y, central=0.9) == (
        pytest.approx(0.9, abs=0.01)
    )
    pit = scoring_numeric.pit_histogram(quantiles, QUANTILE_LEVELS, y)
    assert pit.edges.tolist() == [0.0, 0.05, 0.25, 0.5, 0.75, 0.95, 1.0]
    assert pit.counts.sum() == 20_000
    assert pit.density == pytest.approx(np.ones(6), abs=0.1)


def test_over_confident_forecasts_under_cover_with_a_u_shaped_pit():
    quantiles, y = _gaussian_forecasts(20_000, spread=0.4)
    coverage = scoring_numeric.interval_coverage(quantiles, QUANTILE_LEVELS, y, central=0.9)
    assert coverage == pytest.approx(2 * stats.norm.cdf(0.4 * 1.6449) - 1, abs=0.015)
    density = scoring_numeric.pit_histogram(quantiles, QUANTILE_LEVELS, y).density
    assert density[0] > 2 and density[-1] > 2 and density[2] < 1 and density[3] < 1


def test_coverage_and_pit_match_slow_loops_on_hand_made_forecasts():
    quantiles = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5], [0, 0, 0, 0, 0], [1, 2, 3, 4, 5]]
    outcomes = [2.5, 5.0, 0.0, 9.0]
    inside_50 = sum(q[1] <= y <= q[3] for q, y in zip(quantiles, outcomes, strict=True))
    assert scoring_numeric.interval_coverage(
        quantiles, QUANTILE_LEVELS, outcomes, central=0.5
    ) == pytest.approx(inside_50 / 4)
    assert scoring_numeric.interval_coverage(
        quantiles, QUANTILE_LEVELS, outcomes, central=0.9
    ) == pytest.approx(3 / 4)
    counts = scoring_numeric.pit_histogram(quantiles, QUANTILE_LEVELS, outcomes).counts
    # 2.5 has two quantiles under it; 5.0 all five; 0.0 equals all five; 9.0 all five
    assert counts.tolist() == [0, 0, 1, 0, 0, 3]
    with pytest.raises(ValueError, match="central 80%"):
        scoring_numeric.interval_coverage(quantiles, QUANTILE_LEVELS, outcomes, central=0.8)
    with pytest.raises(ValueError, match="decrease"):
        scoring_numeric.pit_histogram([[3, 2, 1, 4, 5]], QUANTILE_LEVELS, [1.0])
