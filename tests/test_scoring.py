"""Scoring rules against hand-computed values and slow reference loops."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from futureworld import scoring


def test_brier_matches_hand_computed_mean_squared_error() -> None:
    # (0.9-1)² + (0.2-0)² + (0.5-1)² = 0.01 + 0.04 + 0.25 = 0.30 → mean 0.1
    assert scoring.brier([0.9, 0.2, 0.5], [1, 0, 1]) == pytest.approx(0.1)


def test_log_score_clips_and_is_higher_is_better() -> None:
    # p=0 on a YES is clipped to 0.01; p=0.8 on a YES gives ln 0.8; p=0.3 on a NO gives ln 0.7
    expected = (math.log(0.01) + math.log(0.8) + math.log(0.7)) / 3
    assert scoring.log_score([0.0, 0.8, 0.3], [1, 1, 0]) == pytest.approx(expected)
    assert scoring.log_score([0.9], [1]) > scoring.log_score([0.6], [1])
    assert scoring.log_score([1.0], [1]) == pytest.approx(math.log(0.99))


def test_log_score_custom_clip_is_applied() -> None:
    assert scoring.log_score([0.0], [1], clip=(0.1, 0.9)) == pytest.approx(math.log(0.1))
    with pytest.raises(ValueError, match="clip"):
        scoring.log_score([0.5], [1], clip=(0.0, 0.9))


def test_accuracy_counts_p_above_half_as_yes() -> None:
    assert scoring.accuracy([0.51, 0.5, 0.2, 0.9], [1, 1, 0, 0]) == pytest.approx(0.5)


def test_metrics_reject_probabilities_outside_unit_interval_and_non_binary_outcomes() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]; got 1.2"):
        scoring.brier([0.5, 1.2], [1, 0])
    with pytest.raises(ValueError, match=r"0 or 1; got 0\.5"):
        scoring.brier([0.5], [0.5])
    with pytest.raises(ValueError, match="2 forecasts but y has 1"):
        scoring.brier([0.5, 0.5], [1])
    with pytest.raises(ValueError, match="empty"):
        scoring.brier([], [])
    with pytest.raises(ValueError, match="got nan"):
        scoring.brier([float("nan")], [1])


def _slow_ece(p: list[float], y: list[int], bins: int) -> float:
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [i for i, pi in enumerate(p) if lo <= pi < hi or (b == bins - 1 and pi == 1.0)]
        if not members:
            continue
        mean_p = sum(p[i] for i in members) / len(members)
        mean_y = sum(y[i] for i in members) / len(members)
        total += len(members) / len(p) * abs(mean_p - mean_y)
    return total


def test_ece_matches_hand_computed_two_bin_case() -> None:
    # bin [0.0,0.1): p=0.05,y=0 → gap 0.05; bin [0.9,1.0]: p=0.95,1.0 y=1,0 → mean p .975, freq .5
    p = [0.05, 0.95, 1.0]
    y = [0, 1, 0]
    expected = 1 / 3 * 0.05 + 2 / 3 * abs(0.975 - 0.5)
    assert scoring.expected_calibration_error(p, y) == pytest.approx(expected)


def test_probability_one_falls_in_last_bin() -> None:
    rel = scoring.reliability_bins([1.0, 0.0], [1, 0], bins=10)
    assert rel.counts.tolist() == [1, 0, 0, 0, 0, 0, 0, 0, 0, 1]
    assert rel.mean_predicted[9] == 1.0
    assert np.isnan(rel.mean_predicted[5])
    assert rel.edges.tolist() == pytest.approx([i / 10 for i in range(11)])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.0, 1.0, allow_nan=False), st.integers(0, 1)),
        min_size=1,
        max_size=60,
    ),
    st.integers(1, 15),
)
def test_ece_agrees_with_slow_reference_loop(pairs: list[tuple[float, int]], bins: int) -> None:
    p = [a for a, _ in pairs]
    y = [b for _, b in pairs]
    assert scoring.expected_calibration_error(p, y, bins=bins) == pytest.approx(
        _slow_ece(p, y, bins), abs=1e-12
    )


def test_perfectly_calibrated_bins_have_zero_ece() -> None:
    p = [0.25] * 4 + [0.75] * 4
    y = [1, 0, 0, 0, 1, 1, 1, 0]
    assert scoring.expected_calibration_error(p, y) == pytest.approx(0.0)


def test_brier_index_and_skill() -> None:
    assert scoring.brier_index(0.25) == pytest.approx(50.0)
    assert scoring.brier_index(0.0) == pytest.approx(100.0)
    assert scoring.brier_index(0.04) == pytest.approx(80.0)
    assert scoring.brier_skill(0.1, 0.2) == pytest.approx(0.5)
    assert scoring.brier_skill(0.3, 0.2) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="reference Brier"):
        scoring.brier_skill(0.1, 0.0)
    with pytest.raises(ValueError, match="Brier score lies"):
        scoring.brier_index(1.5)


def test_bootstrap_ci_is_deterministic_and_brackets_the_mean() -> None:
    values = np.linspace(0.0, 1.0, 101)
    lo, hi = scoring.bootstrap_ci(values, np.mean, n_resamples=2000, seed=3)
    assert (lo, hi) == scoring.bootstrap_ci(values, np.mean, n_resamples=2000, seed=3)
    assert lo < 0.5 < hi
    # standard error of the mean ≈ 0.29 / √101 ≈ 0.029 → 95% half-width ≈ 0.057
    assert hi - lo == pytest.approx(2 * 1.96 * values.std() / math.sqrt(101), rel=0.15)


def test_bootstrap_ci_resamples_pairs_together() -> None:
    pairs = np.array([[0.9, 1.0], [0.1, 0.0], [0.8, 1.0], [0.3, 0.0]])

    def pair_brier(rows: np.ndarray) -> float:
        return float(np.mean((rows[:, 0] - rows[:, 1]) ** 2))

    lo, hi = scoring.bootstrap_ci(pairs, pair_brier, n_resamples=500)
    assert 0.01 - 1e-12 <= lo <= hi <= 0.09 + 1e-12  # every per-pair error lies in [0.01, 0.09]
    assert scoring.bootstrap_ci([0.2], np.mean) == (pytest.approx(0.2), pytest.approx(0.2))
    with pytest.raises(ValueError, match="at least one"):
        scoring.bootstrap_ci([], np.mean)


def test_rlcr_reward_hand_values() -> None:
    assert scoring.rlcr_reward(True, 1.0) == pytest.approx(1.0)
    assert scoring.rlcr_reward(True, 0.7) == pytest.approx(1.0 - 0.09)
    assert scoring.rlcr_reward(False, 0.7) == pytest.approx(-0.49)
    assert scoring.rlcr_reward(False, 0.0) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="confidence"):
        scoring.rlcr_reward(True, 1.1)


def test_crps_from_quantiles_matches_pinball_sum() -> None:
    levels = [0.25, 0.5, 0.75]
    quantiles = [1.0, 2.0, 3.0]
    # y = 2.5: pinball 0.25·1.5=0.375, 0.5·0.5=0.25, (0.75−1)·(−0.5)=0.125 → sum 0.75, ×2/3 = 0.5
    assert scoring.crps_from_quantiles(quantiles, levels, 2.5) == pytest.approx(0.5)
    # y = 0: all quantiles above → (1−τ)(q−y): 0.75, 1.0, 0.75 → 2.5 × 2/3
    assert scoring.crps_from_quantiles(quantiles, levels, 0.0) == pytest.approx(2.5 * 2 / 3)
    batch = scoring.crps_from_quantiles([quantiles, quantiles], levels, [2.5, 0.0])
    assert batch == pytest.approx([0.5, 2.5 * 2 / 3])


def test_crps_of_many_quantiles_approaches_absolute_error_for_a_point_forecast() -> None:
    levels = scoring.evenly_spaced_levels(99)
    # a point forecast at 0 (all quantiles 0) has CRPS = |y|: (2/K) Σ τ·y with mean τ = 0.5
    assert scoring.crps_from_quantiles([0.0] * 99, levels, 3.0) == pytest.approx(3.0)


def test_crps_rejects_mismatched_levels() -> None:
    with pytest.raises(ValueError, match="2 quantiles but 3 levels"):
        scoring.crps_from_quantiles([1.0, 2.0], [0.25, 0.5, 0.75], 1.0)
    with pytest.raises(ValueError, match=r"levels must lie in \(0, 1\)"):
        scoring.crps_from_quantiles([1.0], [1.0], 1.0)


def test_paired_bootstrap_difference_sees_a_small_shared_noise_gain() -> None:
    rng = np.random.default_rng(0)
    n = 400
    p_true = rng.choice([0.1, 0.3, 0.5, 0.7, 0.9], size=n)
    y = (rng.random(n) < p_true).astype(float)
    over = 1 / (1 + np.exp(-3 * np.log(p_true / (1 - p_true))))  # over-confident
    questions = np.arange(n, dtype=float)
    before = np.stack([questions, over, y], axis=1)
    after = np.stack([questions, p_true, y], axis=1)
    result = scoring.paired_bootstrap_difference(before, after, scoring.brier, n_resamples=500)
    assert result.before == pytest.approx(scoring.brier(over, y))
    assert result.after == pytest.approx(scoring.brier(p_true, y))
    assert result.difference == pytest.approx(result.after - result.before)
    lo, hi = result.ci
    assert lo <= result.difference <= hi < 0  # calibrating is a clear gain, pairwise
    # the unpaired interval of the first Brier alone is much wider than the paired one
    first_lo, first_hi = scoring.bootstrap_ci(
        np.stack([over, y], 1), lambda r: scoring.brier(r[:, 0], r[:, 1]), n_resamples=500
    )
    assert hi - lo < (first_hi - first_lo) / 2
    same = scoring.paired_bootstrap_difference(before, before, scoring.brier, n_resamples=200)
    assert same.difference == 0.0 and same.ci == (0.0, 0.0)


def test_paired_bootstrap_difference_keeps_a_questions_samples_together() -> None:
    # Two questions, many samples each: only two independent units, so the interval is wide
    # (a per-forecast bootstrap would call a 400-sample difference certain).
    before = [(q, 0.5, float(q)) for q in (0, 1) for _ in range(200)]
    after = [(0, 0.1, 0.0)] * 200 + [(1, 0.4, 1.0)] * 200
    result = scoring.paired_bootstrap_difference(
        before, after, scoring.brier, n_resamples=400, seed=1
    )
    assert result.difference == pytest.approx((0.01 + 0.36) / 2 - 0.25)
    lo, hi = result.ci
    assert lo == pytest.approx(0.01 - 0.25) and hi == pytest.approx(0.36 - 0.25)
    with pytest.raises(ValueError, match="both sides"):
        scoring.paired_bootstrap_difference([], after, scoring.brier)
    ece = scoring.paired_bootstrap_difference(
        before, after, scoring.expected_calibration_error, n_resamples=50
    )
    assert ece.before == pytest.approx(0.0)
