"""Scoring rules and calibration of multiple-choice forecasts: pure numpy functions.

Owns multiclass Brier, multiclass log score, top-label accuracy and ECE, and the ranked
probability score of ordered options. A forecast is a probability vector over its question's
options and an outcome is the index of the option that happened; questions in one call may
have different numbers of options (vectors are padded with zero-probability options, which
changes none of these scores). Binary scores live in scoring.py, numeric ones in
scoring_numeric.py. `brier` and `rps` are lower-is-better, `log_score` higher-is-better.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from futureworld import scoring

SUM_TOLERANCE = 1e-6
"""How far a forecast vector may sum from 1 (the parser already normalised it)."""


def _forecasts_and_outcomes(
    probabilities: Sequence[ArrayLike], outcomes: ArrayLike
) -> tuple[NDArray, NDArray, NDArray]:
    """(P, y, K): P (N, K_max) zero-padded, y (N,) option indices, K (N,) options per row."""
    rows = [np.asarray(p, dtype=np.float64).reshape(-1) for p in probabilities]
    y = np.asarray(outcomes, dtype=np.float64).reshape(-1)
    if len(rows) != y.size:
        raise ValueError(f"{len(rows)} forecasts but {y.size} outcomes")
    if not rows:
        raise ValueError("cannot score an empty set of forecasts")
    sizes = np.array([row.size for row in rows], dtype=np.int64)
    if np.any(sizes < 2):
        raise ValueError(f"a choice forecast needs >= 2 options; got {int(sizes.min())}")
    matrix = np.zeros((len(rows), int(sizes.max())))
    for i, row in enumerate(rows):
        matrix[i, : row.size] = row
    if not np.all((matrix >= 0.0) & (matrix <= 1.0)):
        raise ValueError(
            f"probabilities must lie in [0, 1]; got {matrix[(matrix < 0) | (matrix > 1)][0]}"
        )
    sums = matrix.sum(axis=1)
    if np.any(np.abs(sums - 1.0) > SUM_TOLERANCE):
        raise ValueError(
            f"each forecast must sum to 1; one sums to {sums[np.abs(sums - 1) > SUM_TOLERANCE][0]}"
        )
    if not np.all((y == np.round(y)) & (y >= 0) & (y < sizes)):
        bad = y[~((y == np.round(y)) & (y >= 0) & (y < sizes))][0]
        raise ValueError(f"outcomes must be option indices of their forecast; got {bad}")
    return matrix, y.astype(np.int64), sizes


def _one_hot(y: NDArray, width: int) -> NDArray:
    return np.eye(width)[y]


def multiclass_brier(probabilities: Sequence[ArrayLike], outcomes: ArrayLike) -> float:
    """Brier's original score: (1/N) Σ_i Σ_j (p_ij − 1[y_i = j])². Range [0, 2]; lower is
    better; for two options it is twice the binary Brier of P(option 0)."""
    p, y, _ = _forecasts_and_outcomes(probabilities, outcomes)
    return float(np.mean(np.sum((p - _one_hot(y, p.shape[1])) ** 2, axis=1)))


def multiclass_log_score(
    probabilities: Sequence[ArrayLike],
    outcomes: ArrayLike,
    clip: tuple[float, float] = scoring.LOG_SCORE_CLIP,
) -> float:
    """(1/N) Σ_i ln p̃_{i, y_i}, p̃ = clip(p, lo, hi): the log-likelihood of the options that
    happened, clipped as the binary log score is (so two options give the binary value).
    Higher is better (≤ ln hi)."""
    lo, hi = clip
    if not 0.0 < lo <= hi < 1.0:
        raise ValueError(f"log score clip must satisfy 0 < lo <= hi < 1; got {clip}")
    p, y, _ = _forecasts_and_outcomes(probabilities, outcomes)
    return float(np.mean(np.log(np.clip(p[np.arange(y.size), y], lo, hi))))


def top_label(probabilities: Sequence[ArrayLike], outcomes: ArrayLike) -> tuple[NDArray, NDArray]:
    """(confidence, correct), shapes (N,): the largest probability of each forecast (its
    "top label", the lowest index on ties) and whether that option happened (1.0 / 0.0)."""
    p, y, _ = _forecasts_and_outcomes(probabilities, outcomes)
    choice = np.argmax(p, axis=1)  # first maximum: the lowest index on ties
    return p[np.arange(y.size), choice], (choice == y).astype(np.float64)


def top_label_accuracy(probabilities: Sequence[ArrayLike], outcomes: ArrayLike) -> float:
    """Share of forecasts whose most probable option happened."""
    return float(np.mean(top_label(probabilities, outcomes)[1]))


def top_label_ece(probabilities: Sequence[ArrayLike], outcomes: ArrayLike, bins: int = 10) -> float:
    """Top-label ECE (Guo et al., "On Calibration of Modern Neural Networks", 2017):
    Σ_b (n_b / N) · |conf̄_b − acc_b| over equal-width bins of the top label's probability."""
    confidence, correct = top_label(probabilities, outcomes)
    return scoring.expected_calibration_error(confidence, correct, bins)


def ranked_probability_score(probabilities: Sequence[ArrayLike], outcomes: ArrayLike) -> float:
    """RPS of ordered options (Epstein 1969), normalised to [0, 1]:
    (1/N) Σ_i 1/(K_i − 1) Σ_{k<K_i} (F_ik − O_ik)², F and O the cumulative forecast and
    outcome over the first k options. Lower is better; only meaningful for ordered options."""
    p, y, sizes = _forecasts_and_outcomes(probabilities, outcomes)
    width = p.shape[1]
    gaps = (np.cumsum(p, axis=1) - np.cumsum(_one_hot(y, width), axis=1))[:, :-1] ** 2
    # Padding columns have F = O = 1, adding nothing; divide each row by its own K − 1.
    return float(np.mean(gaps.sum(axis=1) / (sizes - 1)))
