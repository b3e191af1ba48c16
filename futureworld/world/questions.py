"""The simulated world's questions of every kind as the public sees them (no outcome), how each
is drawn, and the domain Question a harvest of it yields. model.py decides which are posed
when; their articles are in articles.py, their outcomes in outcomes.py.

Binary: "Will <entity> <event> by <date>? Analysts rate the chance as <cue>." (the cue level is
model.py's).
Choice ("which of k entities"): "Which of A, B, C or D will <event> first by <date>? Analysts
see a <strength> favourite in B." The favourite's true probability is `choice_favourite_p[s]`
for strength s; the other k − 1 options share the rest equally.
Numeric ("a latent quantity"): "How many units will <entity> report by <date>? Analysts expect
about μ, give or take σ." The outcome is X = clip(N(μ, σ²), 0, NUMERIC_UPPER) rounded to 0.1,
on the closed range [0, NUMERIC_UPPER]: the true quantiles are clip(μ + σ·z_τ). μ is one of
NUMERIC_MEANS and σ one of `numeric_sigmas`.
A research world's titles state no cue, and its crowd is centred on the prior (the ladder's
mean; uniform over the options; the middle of the μ range with the widest σ).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import NormalDist
from typing import Any, ClassVar

from futureworld.domain import QUANTILE_LEVELS, NumericSpec, Question, QuestionKind
from futureworld.world.config import WorldConfig, cue_sentence
from futureworld.world.research import uninformed_p_yes
from futureworld.world.vocabulary import (
    CHOICE_STRENGTH_WORDS,
    EVENTS,
    NUMERIC_PRIOR_MEAN,
    NUMERIC_QUANTITIES,
    NUMERIC_UNIT,
    NUMERIC_UPPER,
    Entity,
    Topic,
)


@dataclass(frozen=True, kw_only=True)
class SimPosed:
    """What every simulated question shares: where it sits in time, its texts, its id letter
    (w<seed>d<day><letter><index>) and its domain kind."""

    letter: ClassVar[str]
    kind: ClassVar[QuestionKind]

    external_id: str
    day: int
    index: int
    topic: Topic
    title: str
    description: str
    slug: str
    horizon_days: int
    created_at: datetime
    close_at: datetime
    resolve_at: datetime

    @property
    def key(self) -> str:
        """What names its articles and random streams: d<day>-<letter><index>."""
        return f"d{self.day}-{self.letter}{self.index}"

    @property
    def names(self) -> tuple[str, ...]:
        """The entities the question is about (a research world's lures name them)."""
        raise NotImplementedError

    def to_domain(
        self, *, source: str = "manifold", url: str = "", info_cutoff_at: datetime | None = None
    ) -> Question:
        """The domain Question a harvest of this market yields (cut-off defaults to posing)."""
        extra, kind_fields = self._domain_fields()
        return Question(
            source=source,
            external_id=self.external_id,
            kind=self.kind,
            title=self.title,
            background=self.description,
            resolution_criteria=self.description,
            url=url,
            domain=self.topic.value,
            created_at=self.created_at,
            info_cutoff_at=info_cutoff_at or self.created_at,
            close_at=self.close_at,
            resolve_by=self.resolve_at,
            extra={"group_slugs": [self.topic.value], **extra},
            **kind_fields,
        )

    def _domain_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The kind's entries of the Question's extra, and its own Question fields."""
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class SimQuestion(SimPosed):
    """A posed binary question: no outcome, only the stated true probability."""

    letter = "q"
    kind = QuestionKind.BINARY

    entity: str
    event: str
    cue_level: int
    p_yes: float
    """cue_p_yes of its level, the outcome's probability: also the true probability given the
    information public before resolution, except in a research world (informed_probability)."""
    crowd_probability: float
    """The market's noisy crowd P(yes): sigmoid(logit(p_yes) + N(0, crowd_noise_logit²))."""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.entity,)

    def _domain_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return {}, {"crowd_probability": self.crowd_probability}


@dataclass(frozen=True, kw_only=True)
class SimChoiceQuestion(SimPosed):
    """A posed multiple-choice question as the public sees it (no outcome)."""

    letter = "c"
    kind = QuestionKind.CHOICE

    event: str
    options: tuple[str, ...]
    """Entity names, in the market's order."""
    favourite: int
    strength: int
    probabilities: tuple[float, ...]
    """The true distribution over the options."""
    crowd_probabilities: tuple[float, ...]
    """The market's answer probabilities: the truth with log-space noise, renormalised."""

    @property
    def names(self) -> tuple[str, ...]:
        return self.options

    def _domain_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        extra = {
            "ordered_options": False,
            "crowd_probabilities": list(self.crowd_probabilities),
        }
        return extra, {"options": self.options}


@dataclass(frozen=True, kw_only=True)
class SimNumericQuestion(SimPosed):
    """A posed numeric question as the public sees it (no outcome)."""

    letter = "n"
    kind = QuestionKind.NUMERIC

    entity: str
    quantity: str
    mean: float
    sigma: float
    crowd_value: float
    """The market's current value: μ plus noise of sd σ/2, inside the range."""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.entity,)

    @property
    def spec(self) -> NumericSpec:
        return NumericSpec(lower=0.0, upper=NUMERIC_UPPER, unit=NUMERIC_UNIT)

    def true_quantiles(self, levels: tuple[float, ...] = QUANTILE_LEVELS) -> tuple[float, ...]:
        """clip(μ + σ·z_τ) at `levels`: the outcome's true quantiles."""
        normal = NormalDist(self.mean, self.sigma)
        return tuple(min(NUMERIC_UPPER, max(0.0, normal.inv_cdf(t))) for t in levels)

    def _domain_fields(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.spec.to_extra(), {}


SimKindQuestion = SimChoiceQuestion | SimNumericQuestion
SimMarket = SimQuestion | SimChoiceQuestion | SimNumericQuestion


@dataclass(frozen=True, kw_only=True)
class QuestionTiming:
    """Where one question sits in the world's day."""

    seed: int
    day: int
    index: int
    created_at: datetime
    horizon_days: int
    resolution_delay_hours: float

    def placed(self, letter: str) -> dict[str, Any]:
        """The id, day, index and instants of the question with this id letter."""
        close_at = self.created_at + timedelta(days=self.horizon_days)
        return {
            "external_id": f"w{self.seed}d{self.day}{letter}{self.index}",
            "day": self.day,
            "index": self.index,
            "horizon_days": self.horizon_days,
            "created_at": self.created_at,
            "close_at": close_at,
            "resolve_at": close_at + timedelta(hours=self.resolution_delay_hours),
        }


def _slug(text: str, external_id: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") + f"-{external_id}"


def make_binary_question(
    rng: random.Random,
    config: WorldConfig,
    entities: tuple[Entity, ...],
    *,
    day: int,
    index: int,
    level: int,
    day_start: datetime,
    subject: tuple[Entity, str] | None = None,
) -> SimQuestion:
    """A binary question drawn from `rng`; `subject` (entity, event), where given, replaces the
    drawn pair, whose draws are still made so the rest of the stream is unchanged."""
    cfg = config
    entity = rng.choice(entities)
    event = rng.choice(EVENTS[entity.topic])
    if subject is not None:
        entity, event = subject
    timing = QuestionTiming(
        seed=cfg.seed,
        day=day,
        index=index,
        created_at=day_start + timedelta(hours=cfg.pose_hour, minutes=index),
        horizon_days=rng.randint(cfg.min_horizon_days, cfg.max_horizon_days),
        resolution_delay_hours=cfg.resolution_delay_hours,
    )
    placed = timing.placed(SimQuestion.letter)
    p_yes = cfg.cue_p_yes[level]
    # A research world's crowd has not researched: its centre says nothing about the level.
    centre = uninformed_p_yes(cfg.cue_p_yes) if cfg.research else p_yes
    noisy = _sigmoid(_logit(centre) + rng.gauss(0.0, cfg.crowd_noise_logit))
    by_date = f"{placed['close_at']:%Y-%m-%d}"
    cue = "" if cfg.research else " " + cue_sentence(level, cfg.n_levels)
    return SimQuestion(
        **placed,
        entity=entity.name,
        topic=entity.topic,
        event=event,
        cue_level=level,
        p_yes=p_yes,
        title=f"Will {entity.name} {event} by {by_date}?{cue}",
        description=(
            f"Resolves YES if {entity.name} does {event} before "
            f"{placed['close_at']:%Y-%m-%d %H:%M} UTC, NO otherwise.{cue}"
        ),
        slug=_slug(f"{entity.name} {event} by {by_date}", placed["external_id"]),
        crowd_probability=round(min(0.99, max(0.01, noisy)), 4),
    )


def make_choice_question(
    rng: random.Random,
    timing: QuestionTiming,
    entities: tuple[Entity, ...],
    *,
    n_options: int,
    favourite_p: tuple[float, ...],
    crowd_noise_logit: float,
    research: bool = False,
) -> SimChoiceQuestion:
    topic = rng.choice(sorted({e.topic for e in entities}))
    pool = [e.name for e in entities if e.topic is topic]
    options = tuple(rng.sample(pool, min(n_options, len(pool))))
    if len(options) < 2:
        options = tuple(rng.sample([e.name for e in entities], n_options))
    favourite = rng.randrange(len(options))
    strength = rng.randrange(len(favourite_p))
    p_fav = favourite_p[strength]
    rest = (1.0 - p_fav) / (len(options) - 1)
    probabilities = tuple(p_fav if i == favourite else rest for i in range(len(options)))
    # A research world's crowd has not researched: its centre is the uniform prior.
    centre = [1.0 / len(options)] * len(options) if research else probabilities
    noisy = [p * math.exp(rng.gauss(0.0, crowd_noise_logit)) for p in centre]
    crowd = tuple(round(v / sum(noisy), 4) for v in noisy)
    event = rng.choice(EVENTS[topic])
    placed = timing.placed(SimChoiceQuestion.letter)
    close_at = placed["close_at"]
    names = ", ".join(options[:-1]) + f" or {options[-1]}"
    cue = f" Analysts see a {CHOICE_STRENGTH_WORDS[strength]} favourite in {options[favourite]}."
    cue = "" if research else cue
    stem = f"Which of {names} will {event} first by {close_at:%Y-%m-%d}?"
    return SimChoiceQuestion(
        **placed,
        topic=topic,
        event=event,
        options=options,
        favourite=favourite,
        strength=strength,
        probabilities=probabilities,
        crowd_probabilities=crowd,
        title=f"{stem}{cue}",
        description=(
            f"Resolves to the option that does {event} first before {close_at:%Y-%m-%d %H:%M} "
            f"UTC; exactly one will.{cue}"
        ),
        slug=_slug(stem, placed["external_id"]),
    )


def make_numeric_question(
    rng: random.Random,
    timing: QuestionTiming,
    entities: tuple[Entity, ...],
    *,
    sigmas: tuple[float, ...],
    research: bool = False,
) -> SimNumericQuestion:
    entity = rng.choice(entities)
    quantity = rng.choice(NUMERIC_QUANTITIES)
    mean = 20.0 * rng.randint(2, 8)  # one of NUMERIC_MEANS
    sigma = rng.choice(sigmas)
    centre, spread = (NUMERIC_PRIOR_MEAN, max(sigmas)) if research else (mean, sigma)
    crowd_value = round(min(NUMERIC_UPPER, max(0.0, rng.gauss(centre, spread / 2.0))), 1)
    placed = timing.placed(SimNumericQuestion.letter)
    close_at = placed["close_at"]
    stem = f"How many {quantity} will {entity.name} report by {close_at:%Y-%m-%d}?"
    cue = "" if research else f" Analysts expect about {mean:g}, give or take {sigma:g}."
    return SimNumericQuestion(
        **placed,
        topic=entity.topic,
        entity=entity.name,
        quantity=quantity,
        mean=mean,
        sigma=sigma,
        crowd_value=crowd_value,
        title=f"{stem}{cue}",
        description=(
            f"Resolves to the number of {quantity} {entity.name} reports for the period ending "
            f"{close_at:%Y-%m-%d %H:%M} UTC, between 0 and {NUMERIC_UPPER:g} {NUMERIC_UNIT}.{cue}"
        ),
        slug=_slug(stem, placed["external_id"]),
    )


def _logit(p: float) -> float:
    return math.log(p / (1.0 - p))


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))
