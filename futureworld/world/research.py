"""The research world's evidence model: what a reading says about a cue level, and its lures.

Owns the likelihood of an evidence article's reading, the exact posterior P(yes | readings)
(the informed floor), the prior mean (the uninformed floor) and the texts of the lure articles
that surround the evidence; model.py generates the articles, reference.py scores the floors.

Noise model (model.py `_make_evidence`): an evidence article reports the true level k with
probability 1 − ε and otherwise k − 1 or k + 1, each with probability ε/2, clipped to the
ladder, so at an end of the ladder the clipped step lands on the end itself:
    P(r | k) = (1 − ε)·1[r = k] + ε/2·1[r = clip(k − 1)] + ε/2·1[r = clip(k + 1)].
Prior: the marginal level distribution. Levels cycle through the ladder, level = (d·Q + i)
mod K over the world's questions in order, so each level is 1/K of them: π(k) = 1/K. (Within
one day the levels are balanced, which a forecaster who knew the day's other levels could
exploit; the floors ignore that, as an agent forecasting one question does.)
Posterior: P(k | r_1..r_n) ∝ π(k) · Π_i P(r_i | k), and P(yes | r) = Σ_k P(k | r) · p_yes(k).
With no readings it is the prior mean Σ_k π(k) · p_yes(k), the uninformed floor.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from futureworld.world.config import cue_phrase
from futureworld.world.vocabulary import DISTRACTOR_EVENTS, EVIDENCE_SOURCES, Topic

LURE_EVENTS: dict[Topic, tuple[str, ...]] = {
    Topic.ECONOMY: ("open a regional branch", "issue corporate bonds"),
    Topic.POLITICS: ("hold a public hearing", "publish its manifesto"),
    Topic.SPORTS: ("sell out its stadium", "renew its kit deal"),
    Topic.TECHNOLOGY: ("hire a chief engineer", "launch a beta programme"),
    Topic.SCIENCE: ("expand its laboratory", "host a visiting delegation"),
}
"""Rival events a lure reports odds on: never the event of any question (vocabulary.EVENTS),
so a lure's reading is a reading of no question."""


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
