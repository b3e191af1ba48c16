"""benchmarks/research_reading.py's answer map: how a research agent's answers map the posterior
its readings imply (the slope in log-odds, the spread about it, the expected Brier)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.research_reading import answer_map


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def test_a_calibrated_reader_maps_with_slope_one_at_the_floor():
    posterior = np.linspace(0.05, 0.95, 19)
    slope, spread, expected, floor = answer_map(np.stack([posterior, posterior], axis=1))
    assert slope == pytest.approx(1.0) and spread == pytest.approx(0.0, abs=1e-9)
    assert expected == pytest.approx(floor) == pytest.approx((posterior * (1 - posterior)).mean())


def test_an_over_confident_noisy_reader_shows_its_sharpening_spread_and_excess_brier():
    rng = np.random.default_rng(0)
    posterior = rng.uniform(0.1, 0.9, 4000)
    logit = np.log(posterior / (1 - posterior))
    answer = _sigmoid(2.0 * logit + rng.normal(0.0, 0.5, posterior.size))
    slope, spread, expected, floor = answer_map(np.stack([answer, posterior], axis=1))
    assert slope == pytest.approx(2.0, abs=0.05) and spread == pytest.approx(0.5, abs=0.03)
    excess = ((answer - posterior) ** 2).mean()
    assert expected - floor == pytest.approx(excess) and excess > 0.01
