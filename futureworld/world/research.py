"""The research world's evidence model: what a reading says about a cue level, and its lures.

Owns the likelihood of an evidence article's reading, the exact posterior P(yes | readings)
(the informed floor), the prior mean (the uninformed floor) and the texts of the lure articles
that surround the evidence; articles.py generates the articles, reference.py scores the floors.

Noise model (articles.py `binary_evidence`): an evidence article reports the true level k with
probability 1 − ε and otherwise k − 1 or k + 1, each with probability ε/2, clipped to the
ladder, so at an end of the ladder the clipped step lands on the end itself:
    P(r | k) = (1 − ε)·1[r = k] + ε/2·1[r = clip(k − 1)] + ε/2·1[r = clip(k + 1)].
Prior: the marginal level distribution. Levels cycle through the ladder, level = (d·Q + i)
mod K over the world's questions in order, so each level is 1/K of them: π(k) = 1/K. (Within
one day the levels are balanced, which a forecaster who knew the day's other levels could
exploit; the floors ignore that, as an agent forecasting one question does.)
Posterior: P(k | r_1..r_n) ∝ π(k) · Π_i P(r_i | k), and P(yes | r) = Σ_k P(k | r) · p_yes(k).
With no readings it is the prior mean Σ_k π(k) · p_yes(k), the uninformed floor.

Choice questions (questions.py): the favourite f is uniform over the k options and each evidence
article names it with probability 1 − ε, else one of the others (ε/(k − 1) each); the strength
s is stated exactly. P(f | n_1..n_m) ∝ Π_i P(n_i | f) and P(option j wins) = Σ_f P(f | n) ·
p_f(j), p_f(f) = favourite_p[s], p_f(j ≠ f) = (1 − favourite_p[s])/(k − 1); with no readings
every option has 1/k (the uninformed forecast).
Numeric questions: μ is uniform over NUMERIC_MEANS, a reading is round(μ + (σ/2)·Z) with σ
stated, so P(r | μ) = Φ((r + ½ − μ)/(σ/2)) − Φ((r − ½ − μ)/(σ/2)); the informed forecast is
the quantiles of the posterior mixture Σ_μ P(μ | r) · N(μ, σ²), clipped to the range as the
outcome is; the uninformed one mixes every (μ, σ) pair equally.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from statistics import NormalDist

from futureworld.world.config import cue_phrase
from futureworld.world.vocabulary import (
    DISTRACTOR_EVENTS,
    EVENTS,
    EVIDENCE_SOURCES,
    NUMERIC_MEANS,
    NUMERIC_UPPER,
    Entity,
    Topic,
)

LURE_EVENTS: dict[Topic, tuple[str, ...]] = {
    Topic.ECONOMY: ("open a regional branch", "issue corporate bonds"),
    Topic.POLITICS: ("hold a public hearing", "publish its manifesto"),
    Topic.SPORTS: ("sell out its stadium", "renew its kit deal"),
    Topic.TECHNOLOGY: ("hire a chief engineer", "launch a beta programme"),
    Topic.SCIENCE: ("expand its laboratory", "host a visiting delegation"),
}
"""Rival events a lure reports odds on: never the event of any question (vocabulary.EVENTS),
so a lure's reading is a reading of no question."""


def subject_cycle(
    seed: int, entities: Sequence[Entity], cycle: int
) -> tuple[tuple[Entity, str], ...]:
    """The `cycle`-th shuffle of every research subject: each entity with each event of its
    topic (vocabulary.EVENTS), in an order drawn from a stream of its own; the world's n-th
    binary question takes position n mod len of cycle n // len (WorldConfig
    .research_unique_subjects)."""
    subjects = [(entity, event) for entity in entities for event in EVENTS[entity.topic]]
    random.Random(f"{seed}:subjects:{cycle}").shuffle(subjects)
    return tuple(subjects)


def level_prior(n_levels: int) -> tuple[float, ...]:
    """π(k) = 1/K: the marginal distribution of the world's cue levels (module docstring)."""
    if n_levels < 1:
        raise ValueError(f"a ladder needs at least one level, got {n_levels}")
    return tuple(1.0 / n_levels for _ in range(n_levels))


def reading_likelihood(reading: int, level: int, n_levels: int, evidence_noise: float) -> float:
    """P(an evidence article reports `reading` | the true level is `level`), clipped steps."""
    if not (0 <= reading < n_levels and 0 <= level < n_levels):
        raise ValueError(f"reading {reading} or level {level} is outside a {n_levels}-level ladder")
    likelihood = (1.0 - evidence_noise) if reading == level else 0.0
    for step in (-1, 1):
        if min(n_levels - 1, max(0, level + step)) == reading:
            likelihood += evidence_noise / 2.0
    return likelihood


def level_posterior(
    readings: Sequence[int],
    *,
    n_levels: int,
    evidence_noise: float,
    prior: Sequence[float] | None = None,
) -> tuple[float, ...]:
    """P(k | readings) ∝ π(k) · Π_i P(r_i | k); ValueError if no level can give the readings."""
    weights = list(prior if prior is not None else level_prior(n_levels))
    if len(weights) != n_levels:
        raise ValueError(f"prior has {len(weights)} levels, the ladder {n_levels}")
    for reading in readings:
        weights = [
            w * reading_likelihood(reading, k, n_levels, evidence_noise)
            for k, w in enumerate(weights)
        ]
    total = sum(weights)
    if total <= 0.0:
        raise ValueError(f"readings {list(readings)} are impossible with noise {evidence_noise}")
    return tuple(w / total for w in weights)


def informed_p_yes(
    readings: Sequence[int],
    *,
    cue_p_yes: Sequence[float],
    evidence_noise: float,
    prior: Sequence[float] | None = None,
) -> float:
    """P(yes | readings) = Σ_k P(k | readings) · p_yes(k): what perfect research reaches."""
    posterior = level_posterior(
        readings, n_levels=len(cue_p_yes), evidence_noise=evidence_noise, prior=prior
    )
    return sum(w * p for w, p in zip(posterior, cue_p_yes, strict=True))


def uninformed_p_yes(cue_p_yes: Sequence[float], prior: Sequence[float] | None = None) -> float:
    """Σ_k π(k) · p_yes(k): the ladder's prior mean, what a forecaster who never searches has."""
    weights = prior if prior is not None else level_prior(len(cue_p_yes))
    return sum(w * p for w, p in zip(weights, cue_p_yes, strict=True))


def choice_informed_probabilities(
    named: Sequence[int], *, n_options: int, favourite_p: float, evidence_noise: float
) -> tuple[float, ...]:
    """P(option j wins | the options the evidence names), j = 0..k−1 (module docstring)."""
    if n_options < 2:
        raise ValueError(f"a choice needs at least two options, got {n_options}")
    weights = [1.0 / n_options] * n_options
    for option in named:
        weights = [
            w * ((1.0 - evidence_noise) if f == option else evidence_noise / (n_options - 1))
            for f, w in enumerate(weights)
        ]
    total = sum(weights)
    if total <= 0.0:
        raise ValueError(f"named options {list(named)} are impossible with noise {evidence_noise}")
    rest = (1.0 - favourite_p) / (n_options - 1)
    return tuple(
        sum((w / total) * (favourite_p if f == j else rest) for f, w in enumerate(weights))
        for j in range(n_options)
    )


def numeric_reading_likelihood(reading: int, mean: float, sigma: float) -> float:
    """P(round(μ + (σ/2)·Z) = r) for Z ~ N(0, 1)."""
    noise = NormalDist(mean, sigma / 2.0)
    return noise.cdf(reading + 0.5) - noise.cdf(reading - 0.5)


def mixture_quantiles(
    components: Sequence[tuple[float, float, float]],
    levels: Sequence[float],
    *,
    lower: float = 0.0,
    upper: float = NUMERIC_UPPER,
) -> tuple[float, ...]:
    """The τ-quantiles of clip(X, lower, upper), X ~ Σ w · N(μ, σ²) over (w, μ, σ): bisection on
    the mixture's CDF (clipping is monotone, so it commutes with taking a quantile)."""
    total = sum(w for w, _, _ in components)
    parts = [(w / total, NormalDist(mu, sigma)) for w, mu, sigma in components if w > 0]

    def cdf(x: float) -> float:
        return sum(w * normal.cdf(x) for w, normal in parts)

    low = min(n.mean - 12.0 * n.stdev for _, n in parts)
    high = max(n.mean + 12.0 * n.stdev for _, n in parts)
    found = []
    for level in levels:
        a, b = low, high
        for _ in range(80):
            middle = (a + b) / 2.0
            a, b = (middle, b) if cdf(middle) < level else (a, middle)
        found.append(min(upper, max(lower, (a + b) / 2.0)))
    return tuple(found)


def numeric_informed_quantiles(
    readings: Sequence[int], *, sigma: float, levels: Sequence[float]
) -> tuple[float, ...]:
    """Quantiles of the outcome given the evidence's readings and its stated σ."""
    weights = [1.0 / len(NUMERIC_MEANS)] * len(NUMERIC_MEANS)
    for reading in readings:
        weights = [
            w * numeric_reading_likelihood(reading, mu, sigma)
            for w, mu in zip(weights, NUMERIC_MEANS, strict=True)
        ]
    if sum(weights) <= 0.0:
        raise ValueError(f"readings {list(readings)} are impossible under σ = {sigma}")
    components = [(w, mu, sigma) for w, mu in zip(weights, NUMERIC_MEANS, strict=True)]
    return mixture_quantiles(components, levels)


def numeric_uninformed_quantiles(
    sigmas: Sequence[float], levels: Sequence[float]
) -> tuple[float, ...]:
    """Quantiles of the outcome before any reading: every (μ, σ) pair equally likely."""
    return mixture_quantiles([(1.0, mu, sigma) for mu in NUMERIC_MEANS for sigma in sigmas], levels)


def lure_texts(
    rng: random.Random, j: int, *, entity: str, topic: Topic, by_date: str, n_levels: int
) -> tuple[str, str]:
    """(headline, summary) of the j-th lure of a question about `entity`: even j a reading at a
    random level on a rival event (LURE_EVENTS), odd j cue-free chatter about the entity."""
    if j % 2 == 1:
        chatter = rng.choice(DISTRACTOR_EVENTS)
        return f"{entity} {chatter}", f"{entity} {chatter} this week, a spokesperson said."
    source = rng.choice(EVIDENCE_SOURCES)
    event = rng.choice(LURE_EVENTS[topic])
    phrase = cue_phrase(rng.randrange(n_levels), n_levels)
    return (
        f"{source} see {phrase} odds that {entity} will {event}",
        f"{source} rate the chance that {entity} will {event} by {by_date} as {phrase}.",
    )
