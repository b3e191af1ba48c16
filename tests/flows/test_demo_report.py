"""The demo's learning claim on hand-built panels: a real calibration gain passes, while no
change, a random change, or a gain bought by ceasing to answer does not."""

from __future__ import annotations

import numpy as np

from flows.demo.panel import PanelScore
from flows.demo.report import LearningClaim, learning_claim

LADDER = np.array([0.1, 0.3, 0.5, 0.7, 0.9])


def _panel(round_no: int, p_of_truth, *, n: int = 2000, unparsed: int = 0, seed: int = 0):
    rng = np.random.default_rng(seed)  # same seed: same questions and outcomes every round
    truth = rng.choice(LADDER, size=n)
    y = (rng.random(n) < truth).astype(float)
    p = p_of_truth(truth)
    keep = np.arange(n) >= unparsed  # the first `unparsed` questions get no answer
    return PanelScore(
        round=round_no,
        policy_version=round_no + 1,
        p_yes=tuple(p[keep]),
        y=tuple(y[keep]),
        p_true=tuple(truth[keep]),
        question=tuple(np.arange(n)[keep]),
        unparsed=unparsed,
    )


def _over_confident(truth):
    return 1 / (1 + np.exp(-3 * np.log(truth / (1 - truth))))


def _claim(*panels: PanelScore) -> LearningClaim:
    claim = learning_claim(list(panels), n_resamples=300)
    assert claim is not None
    return claim


def test_calibrating_an_over_confident_policy_is_learning() -> None:
    claim = _claim(_panel(0, _over_confident), _panel(5, lambda t: t))
    assert claim.brier.difference < 0 and claim.brier.ci[1] < 0
    assert claim.ece.difference < 0 and claim.ece.ci[1] < 0
    assert claim.learned and "learned" in claim.summary()


def test_no_change_or_a_random_change_is_not_learning() -> None:
    same = _claim(_panel(0, _over_confident), _panel(5, _over_confident))
    assert same.brier.difference == 0 and not same.learned

    def jittered(truth):  # answers that move, but not toward the truth
        noise = np.random.default_rng(7).normal(0.0, 0.05, size=truth.shape)
        return np.clip(_over_confident(truth) + noise, 0.01, 0.99)

    random = _claim(_panel(0, _over_confident), _panel(5, jittered))
    assert random.brier.ci[1] > 0 and not random.learned


def test_a_gain_from_not_answering_is_not_learning() -> None:
    claim = _claim(_panel(0, _over_confident), _panel(5, lambda t: t, unparsed=400))
    assert claim.brier.ci[1] < 0 and claim.ece.ci[1] < 0  # the answered part did improve …
    assert claim.parse_rates == (1.0, 0.8) and not claim.learned  # … but a fifth went silent


def test_no_claim_without_forecasts_to_compare() -> None:
    empty = _panel(3, lambda t: t, n=10, unparsed=10)
    assert learning_claim([_panel(0, lambda t: t, n=10), empty]) is None
