"""Scoring and calibration of numeric forecasts given as quantiles: pure numpy functions.

Owns the coverage of central intervals and the PIT histogram; the CRPS from quantiles lives
in scoring.py (the reward uses it too). Forecasts are (N, K) quantile values at K increasing
levels in (0, 1), outcomes (N,). Callers put values on a common axis first (the evaluation
uses each question's NumericSpec unit axis), so forecasts of different questions pool.

PIT from quantiles. A quantile forecast fixes its CDF only at its K levels, so the PIT
histogram has the K + 1 bins between consecutive levels (0, τ_1, …, τ_K, 1): the outcome
falls in bin j when exactly j quantiles are ≤ it. A calibrated forecaster's outcomes land in
bin j with probability τ_{j+1} − τ_j; the histogram reports counts and the density
share / width, which is flat at 1 for a calibrated forecaster, U-shaped for an over-confident
one and hump-shaped for an under-confident one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray


def _quantiles_and_outcomes(
    quantiles: ArrayLike, levels: ArrayLike, outcomes: ArrayLike
) -> tuple[NDArray, NDArray, NDArray]:
    q = np.asarray(quantiles, dtype=np.float64)
    tau = np.asarray(levels, dtype=np.float64).reshape(-1)
    y = np.asarray(outcomes, dtype=np.float64).reshape(-1)
    if q.ndim != 2 or q.shape != (y.size, tau.size):
        raise ValueError(f"need quantiles of shape ({y.size}, {tau.size}); got {q.shape}")
    if y.size == 0:
        raise ValueError("cannot score an empty set of forecasts")
    if not np.all((tau > 0.0) & (tau < 1.0)) or np.any(np.diff(tau) <= 0):
        raise ValueError(f"levels must increase inside (0, 1); got {tau.tolist()}")
    if not (np.all(np.isfinite(q)) and np.all(np.isfinite(y))):
        raise ValueError("quantiles and outcomes must be finite numbers")
    if np.any(np.diff(q, axis=1) < 0):
        raise ValueError("quantiles must not decrease with the level")
    return q, tau, y


def interval_coverage(
    quantiles: ArrayLike, levels: ArrayLike, outcomes: ArrayLike, *, central: float
) -> float:
    """Share of outcomes inside the central `central` interval [q_{(1−c)/2}, q_{(1+c)/2}]
    (both ends included). Both levels must be among `levels`; 0.5 and 0.9 with the system's
    levels. A calibrated forecaster covers `central` of the outcomes."""
    q, tau, y = _quantiles_and_outcomes(quantiles, levels, outcomes)
    ends = [(1.0 - central) / 2.0, (1.0 + central) / 2.0]
    index = [int(np.argmin(np.abs(tau - end))) for end in ends]
    if not np.allclose(tau[index], ends):
        raise ValueError(f"levels {tau.tolist()} have no central {central:.0%} interval")
    lo, hi = q[:, index[0]], q[:, index[1]]
    return float(np.mean((y >= lo) & (y <= hi)))


@dataclass(frozen=True, kw_only=True)
class PitHistogram:
    """The PIT histogram of quantile forecasts; see the module docstring."""

    edges: NDArray
    """Bin edges on the probability axis, shape (K + 2,): 0, τ_1, …, τ_K, 1."""
    counts: NDArray
    """Outcomes per bin, shape (K + 1,) (int64)."""

    @property
    def shares(self) -> NDArray:
        return self.counts / self.counts.sum()

    @property
    def density(self) -> NDArray:
        """share / bin width: 1 everywhere for a calibrated forecaster."""
        return self.shares / np.diff(self.edges)


def pit_histogram(quantiles: ArrayLike, levels: ArrayLike, outcomes: ArrayLike) -> PitHistogram:
    """Counts of outcomes between consecutive quantile levels (the PIT bins)."""
    q, tau, y = _quantiles_and_outcomes(quantiles, levels, outcomes)
    below = np.sum(q <= y[:, None], axis=1)  # quantiles at or under the outcome: its bin
    counts = np.bincount(below, minlength=tau.size + 1).astype(np.int64)
    return PitHistogram(edges=np.concatenate([[0.0], tau, [1.0]]), counts=counts)
