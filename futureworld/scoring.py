"""Proper scoring rules and calibration metrics: pure, vectorised numpy functions.

Owns the formulas of ARCHITECTURE.md §5 (Brier, log score, accuracy, ECE, reliability bins,
Brier Index, Brier skill, bootstrap intervals (plain and paired by question), RLCR, CRPS from
quantiles). It does not know about trajectories or outcomes (rewards.py) nor about groups of
forecasts (evaluation.py). Binary-only: Brier, log score, accuracy, ECE, reliability bins and
the Brier Index here; choice forecasts are scored in scoring_choice.py and the calibration of
numeric ones (interval coverage, PIT) in scoring_numeric.py.
Sign convention: `brier` and `crps` are lower-is-better; `log_score` and rewards higher-is-better.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

LOG_SCORE_CLIP = (0.01, 0.99)
"""Default clip of p before taking logs, so one confident miss costs at most ln(0.01) ≈ −4.6."""


def _probabilities_and_outcomes(p: ArrayLike, y: ArrayLike) -> tuple[NDArray, NDArray]:
    """Validate a forecast vector p ∈ [0, 1]^N and outcome vector y ∈ {0, 1}^N (N ≥ 1)."""
    p_arr = np.asarray(p, dtype=np.float64).reshape(-1)
    y_arr = np.asarray(y, dtype=np.float64).reshape(-1)
    if p_arr.shape != y_arr.shape:
        raise ValueError(f"p has {p_arr.size} forecasts but y has {y_arr.size} outcomes")
    if p_arr.size == 0:
        raise ValueError("cannot score an empty set of forecasts")
    if not np.all((p_arr >= 0.0) & (p_arr <= 1.0)):
        bad = p_arr[~((p_arr >= 0.0) & (p_arr <= 1.0))][0]
        raise ValueError(f"probabilities must lie in [0, 1]; got {bad}")
    if not np.all((y_arr == 0.0) | (y_arr == 1.0)):
        bad = y_arr[~((y_arr == 0.0) | (y_arr == 1.0))][0]
        raise ValueError(f"binary outcomes must be 0 or 1; got {bad}")
    return p_arr, y_arr


def brier(p: ArrayLike, y: ArrayLike) -> float:
    """Mean squared error of P(yes): (1/N) Σ_i (p_i − y_i)². Shapes p, y: (N,). Lower is better."""
    p_arr, y_arr = _probabilities_and_outcomes(p, y)
    return float(np.mean((p_arr - y_arr) ** 2))


def log_score(p: ArrayLike, y: ArrayLike, clip: tuple[float, float] = LOG_SCORE_CLIP) -> float:
    """Mean log-likelihood of the outcomes: (1/N) Σ_i y_i ln p̃_i + (1 − y_i) ln(1 − p̃_i).

    p̃ = clip(p, lo, hi). Higher is better; the value is ≤ 0 (0 is a perfect forecaster).
    Shapes p, y: (N,).
    """
    lo, hi = clip
    if not 0.0 < lo <= hi < 1.0:
        raise ValueError(f"log score clip must satisfy 0 < lo <= hi < 1; got {clip}")
    p_arr, y_arr = _probabilities_and_outcomes(p, y)
    p_clip = np.clip(p_arr, lo, hi)
    return float(np.mean(y_arr * np.log(p_clip) + (1.0 - y_arr) * np.log1p(-p_clip)))


def accuracy(p: ArrayLike, y: ArrayLike) -> float:
    """Share on the right side: (1/N) Σ_i 1[(p_i > 0.5) = y_i]. p = 0.5 counts as NO."""
    p_arr, y_arr = _probabilities_and_outcomes(p, y)
    return float(np.mean((p_arr > 0.5) == (y_arr == 1.0)))


def _bin_index(p_arr: NDArray, bins: int) -> NDArray:
    """Equal-width bins on [0, 1]: bin b holds [b/B, (b+1)/B); p = 1.0 falls in the last bin."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1; got {bins}")
    return np.minimum((p_arr * bins).astype(np.int64), bins - 1)


@dataclass(frozen=True, kw_only=True)
class ReliabilityBins:
    """Reliability-diagram data for B equal-width bins; every array has shape (B,)."""

    edges: NDArray
    """Bin edges, shape (B + 1,): 0, 1/B, …, 1."""
    mean_predicted: NDArray
    """Mean forecast p in each bin; NaN where the bin is empty."""
    observed_frequency: NDArray
    """Share of YES outcomes in each bin; NaN where the bin is empty."""
    counts: NDArray
    """Number of forecasts in each bin (int64)."""


def reliability_bins(p: ArrayLike, y: ArrayLike, bins: int = 10) -> ReliabilityBins:
    """Per-bin mean forecast p̄_b, observed frequency ȳ_b and count n_b (equal-width bins)."""
    p_arr, y_arr = _probabilities_and_outcomes(p, y)
    index = _bin_index(p_arr, bins)
    counts = np.bincount(index, minlength=bins)
    sum_p = np.bincount(index, weights=p_arr, minlength=bins)
    sum_y = np.bincount(index, weights=y_arr, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_predicted = np.where(counts > 0, sum_p / counts, np.nan)
        observed = np.where(counts > 0, sum_y / counts, np.nan)
    return ReliabilityBins(
        edges=np.linspace(0.0, 1.0, bins + 1),
        mean_predicted=mean_predicted,
        observed_frequency=observed,
        counts=counts.astype(np.int64),
    )


def expected_calibration_error(p: ArrayLike, y: ArrayLike, bins: int = 10) -> float:
    """ECE = Σ_b (n_b / N) · |p̄_b − ȳ_b| over equal-width bins of P(yes). Never a reward."""
    rel = reliability_bins(p, y, bins)
    filled = rel.counts > 0
    weights = rel.counts[filled] / rel.counts.sum()
    gaps = np.abs(rel.mean_predicted[filled] - rel.observed_frequency[filled])
    return float(np.sum(weights * gaps))


def brier_index(brier_value: float) -> float:
    """ForecastBench Brier Index: 100 · (1 − √Brier). 100 is perfect, 50 is always saying 0.5."""
    if not 0.0 <= brier_value <= 1.0:
        raise ValueError(f"a Brier score lies in [0, 1]; got {brier_value}")
    return 100.0 * (1.0 - float(np.sqrt(brier_value)))


def brier_skill(brier_value: float, reference_brier: float) -> float:
    """Brier skill score: 1 − Brier / Brier_ref. Positive beats the reference (crowd, base rate)."""
    if reference_brier <= 0.0:
        raise ValueError(f"reference Brier must be > 0 for a skill score; got {reference_brier}")
    return 1.0 - brier_value / reference_brier


def bootstrap_ci(
    values_or_pairs: ArrayLike,
    statistic: Callable[[NDArray], float],
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `statistic` over the N rows of `values_or_pairs`.

    values_or_pairs: shape (N,) or (N, k) (e.g. (p, y) pairs); rows are resampled with
    replacement n_resamples times and `statistic` receives each resample of the same shape.
    Returns the (1 − level)/2 and (1 + level)/2 quantiles of the resampled statistics.
    Deterministic for a given seed.
    """
    data = np.asarray(values_or_pairs, dtype=np.float64)
    if data.ndim == 0 or data.shape[0] == 0:
        raise ValueError("bootstrap needs at least one value")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1; got {n_resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1); got {level}")
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, data.shape[0], size=(n_resamples, data.shape[0]))
    if statistic is np.mean and data.ndim == 1:
        stats = data[indices].mean(axis=1)  # the common case, vectorised: (n_resamples,)
    else:
        stats = np.array([float(statistic(data[row])) for row in indices])
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


@dataclass(frozen=True)
class PairedDifference:
    """statistic(after) − statistic(before) on the same questions, with its bootstrap interval."""

    before: float
    after: float
    difference: float
    ci: tuple[float, float]


def paired_bootstrap_difference(
    before: ArrayLike,
    after: ArrayLike,
    statistic: Callable[[NDArray, NDArray], float],
    n_resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> PairedDifference:
    """Percentile bootstrap of statistic(after) − statistic(before), resampling questions.

    `before` and `after` are (N, 3) rows of (question, p, y): two sets of forecasts of the same
    questions (e.g. two policy versions on one evaluation panel, several samples a question; a
    question one side has no forecast for simply adds nothing to that side).
    Each resample draws questions with replacement and keeps every forecast of a drawn question,
    in both sets: the outcome noise the two sets share cancels out of the difference, and the
    samples of one question are not mistaken for independent evidence. `statistic(p, y)` is a
    score such as `brier` or `expected_calibration_error`.
    """
    a = np.asarray(before, dtype=np.float64).reshape(-1, 3)
    b = np.asarray(after, dtype=np.float64).reshape(-1, 3)
    if a.shape[0] == 0 or b.shape[0] == 0:
        raise ValueError("a paired bootstrap needs forecasts on both sides")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1; got {n_resamples}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1); got {level}")
    questions = np.union1d(a[:, 0], b[:, 0])
    a_q, b_q = np.searchsorted(questions, a[:, 0]), np.searchsorted(questions, b[:, 0])
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, questions.size, size=(n_resamples, questions.size))
    rows_a, rows_b = np.arange(a.shape[0]), np.arange(b.shape[0])
    stats = np.empty(n_resamples)
    for i, drawn in enumerate(draws):
        times = np.bincount(drawn, minlength=questions.size)
        pick_a = np.repeat(rows_a, times[a_q])
        pick_b = np.repeat(rows_b, times[b_q])
        if pick_a.size == 0 or pick_b.size == 0:  # drew only questions one side never answered
            stats[i] = np.nan
            continue
        stats[i] = float(statistic(b[pick_b, 1], b[pick_b, 2])) - float(
            statistic(a[pick_a, 1], a[pick_a, 2])
        )
    alpha = (1.0 - level) / 2.0
    lo, hi = np.nanquantile(stats, [alpha, 1.0 - alpha])
    first = float(statistic(a[:, 1], a[:, 2]))
    last = float(statistic(b[:, 1], b[:, 2]))
    return PairedDifference(
        before=first, after=last, difference=last - first, ci=(float(lo), float(hi))
    )


def rlcr_reward(correct: bool, confidence: float) -> float:
    """RLCR reward for an answer with confidence q: 1[correct] − (q − 1[correct])².

    Range [−1, 1]: a right answer at q = 1 earns 1, a wrong one at q = 1 earns −1.
    (Damani et al., "Beyond Binary Rewards: RL for calibrated confidence", 2025.)
    """
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"confidence must lie in [0, 1]; got {confidence}")
    hit = 1.0 if correct else 0.0
    return hit - (confidence - hit) ** 2


def pinball_loss(quantiles: ArrayLike, levels: ArrayLike, y: ArrayLike) -> NDArray:
    """Pinball loss ρ_τ(y − q) = max(τ(y − q), (τ − 1)(y − q)).

    Shapes: quantiles (..., K), levels (K,), y (...) → (..., K).
    """
    q = np.asarray(quantiles, dtype=np.float64)
    tau = np.asarray(levels, dtype=np.float64)
    diff = np.asarray(y, dtype=np.float64)[..., None] - q
    return np.maximum(tau * diff, (tau - 1.0) * diff)


def crps_from_quantiles(quantiles: ArrayLike, levels: ArrayLike, y: ArrayLike) -> float | NDArray:
    """CRPS approximated from K quantiles: CRPS ≈ (2/K) Σ_k ρ_τk(y − q_k). Lower is better.

    quantiles: (..., K) predicted values at `levels` τ_k ∈ (0, 1), shape (K,); y: (...).
    Returns a float for a single forecast, else an array of shape (...).
    """
    q = np.asarray(quantiles, dtype=np.float64)
    tau = np.asarray(levels, dtype=np.float64).reshape(-1)
    if q.shape[-1:] != tau.shape or tau.size == 0:
        raise ValueError(f"{q.shape[-1] if q.ndim else 0} quantiles but {tau.size} levels")
    if not np.all((tau > 0.0) & (tau < 1.0)):
        raise ValueError(f"quantile levels must lie in (0, 1); got {tau.tolist()}")
    if not np.all(np.isfinite(q)):
        raise ValueError("quantiles must be finite numbers")
    crps = 2.0 / tau.size * pinball_loss(q, tau, y).sum(axis=-1)
    return float(crps) if np.ndim(crps) == 0 else crps


def evenly_spaced_levels(k: int) -> tuple[float, ...]:
    """The K quantile levels τ_k = k / (K + 1) used when a question does not name its own."""
    if k < 1:
        raise ValueError(f"need at least one quantile level; got {k}")
    return tuple((i + 1) / (k + 1) for i in range(k))
