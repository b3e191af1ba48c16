"""The simulated world's outcomes: how each kind of question resolves.

Every outcome is drawn from a random stream of its own (`outcome_seed`), so redrawing outcomes
leaves every published text unchanged, and nothing published before a resolution depends on
it. A binary outcome is y ~ Bernoulli(p_yes), a choice outcome a categorical draw over the true
probabilities, a numeric one clip(N(μ, σ²), 0, NUMERIC_UPPER) rounded to 0.1; any question is
cancelled (annulled) with `cancel_rate`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from statistics import NormalDist

from futureworld.world.questions import SimChoiceQuestion, SimKindQuestion, SimQuestion
from futureworld.world.vocabulary import NUMERIC_UPPER


class MarketResolution(StrEnum):
    """Manifold's binary resolutions; the world produces YES, NO and CANCEL."""

    YES = "YES"
    NO = "NO"
    CANCEL = "CANCEL"
    MKT = "MKT"


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """The outcome of a binary question."""

    external_id: str
    resolution: MarketResolution
    resolved_at: datetime

    @property
    def value(self) -> float | None:
        """1.0 for YES, 0.0 for NO, None for an annulment."""
        return {MarketResolution.YES: 1.0, MarketResolution.NO: 0.0}.get(self.resolution)


@dataclass(frozen=True, kw_only=True)
class KindResolution:
    """The outcome of a choice (option index) or numeric (the number) question."""

    external_id: str
    value: float | None
    """None when the question was cancelled (annulled)."""
    resolved_at: datetime

    @property
    def cancelled(self) -> bool:
        return self.value is None


def draw_resolution(question: SimQuestion, *, outcome_seed: int, cancel_rate: float) -> Resolution:
    """A binary question's outcome: YES with its p_yes, unless cancelled."""
    rng = random.Random(f"{outcome_seed}:outcome:{question.day}:{question.index}")
    cancelled, yes = rng.random() < cancel_rate, rng.random() < question.p_yes
    if cancelled:
        resolution = MarketResolution.CANCEL
    else:
        resolution = MarketResolution.YES if yes else MarketResolution.NO
    return Resolution(
        external_id=question.external_id,
        resolution=resolution,
        resolved_at=question.resolve_at,
    )


def draw_kind_resolution(
    question: SimKindQuestion, *, outcome_seed: int, cancel_rate: float
) -> KindResolution:
    """A choice or numeric question's outcome (module docstring)."""
    stream = f"{outcome_seed}:outcome-{question.letter}:{question.day}:{question.index}"
    rng = random.Random(stream)
    cancelled, u = rng.random() < cancel_rate, rng.random()
    value: float | None
    if isinstance(question, SimChoiceQuestion):
        cumulative, value = 0.0, float(len(question.options) - 1)
        for i, p in enumerate(question.probabilities):
            cumulative += p
            if u < cumulative:
                value = float(i)
                break
    else:
        u = min(max(u, 1e-12), 1.0 - 1e-12)
        draw = NormalDist(question.mean, question.sigma).inv_cdf(u)
        value = round(min(NUMERIC_UPPER, max(0.0, draw)), 1)
    return KindResolution(
        external_id=question.external_id,
        value=None if cancelled else value,
        resolved_at=question.resolve_at,
    )
