"""The simulated world's multiple-choice and numeric questions, with known true distributions.

Owns their generation, evidence, outcomes and reports; model.py poses them only when
`WorldConfig.choice_questions_per_day` / `numeric_questions_per_day` are > 0, after the day's
binary questions and from random streams of their own, so a binary-only world is unchanged.

Choice ("which of k entities"). "Which of A, B, C or D will <event> first by <date>? Analysts
see a <strength> favourite in B." The favourite's true probability is
`choice_favourite_p[s]` for strength s; the other k − 1 options share the rest equally. The
title states both, so the true distribution given everything public is exact, as for binary
questions; evidence articles name the favourite, a random other option with probability
`evidence_noise`. The outcome is a categorical draw (or CANCEL with `cancel_rate`).

Numeric ("a latent quantity"). "How many units will <entity> report by <date>? Analysts
expect about μ, give or take σ." The outcome is X = clip(N(μ, σ²), 0, NUMERIC_UPPER) rounded to
0.1, on the closed range [0, NUMERIC_UPPER]: the true quantiles are clip(μ + σ·z_τ). μ is a
multiple of 20 in [40, 160] and σ one of `numeric_sigmas`; evidence articles report noisy
readings μ + N(0, (σ/2)²), rounded.

Research world (`WorldConfig.research`): neither title nor description states the cue, and the
crowd is centred on the prior (uniform over the options; the middle of the μ range, spread of
the widest σ), so only the evidence carries it. A choice evidence article then also states the
favourite's strength, a numeric one the σ; their readings (the named option, the number) and
noise are unchanged. research.py turns the readings into the informed forecast.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import NormalDist

from futureworld.domain import (
    QUANTILE_LEVELS,
    NumericSpec,
    Question,
    QuestionKind,
)
from futureworld.world.vocabulary import EVENTS, EVIDENCE_SOURCES, Entity, Topic

CHOICE_STRENGTH_WORDS = ("slight", "clear", "strong", "overwhelming")
NUMERIC_UPPER = 200.0
NUMERIC_UNIT = "units"
NUMERIC_QUANTITIES = ("new customers", "site visits", "permits filed", "service calls")
NUMERIC_MEANS = tuple(20.0 * k for k in range(2, 9))
"""The values μ takes, equally likely (40, 60, …, 160)."""
NUMERIC_PRIOR_MEAN = sum(NUMERIC_MEANS) / len(NUMERIC_MEANS)


@dataclass(frozen=True, kw_only=True)
class SimChoiceQuestion:
    """A posed multiple-choice question as the public sees it (no outcome)."""

    external_id: str
    day: int
    index: int
    topic: Topic
    event: str
    options: tuple[str, ...]
    """Entity names, in the market's order."""
    favourite: int
    strength: int
    probabilities: tuple[float, ...]
    """The true distribution over the options."""
    crowd_probabilities: tuple[float, ...]
    """The market's answer probabilities: the truth with log-space noise, renormalised."""
    title: str
    description: str
    slug: str
    horizon_days: int
    created_at: datetime
    close_at: datetime
    resolve_at: datetime

    def to_domain(
        self, *, source: str = "manifold", url: str = "", info_cutoff_at: datetime | None = None
    ) -> Question:
        return Question(
            source=source,
            external_id=self.external_id,
            kind=QuestionKind.CHOICE,
            options=self.options,
            title=self.title,
            background=self.description,
            resolution_criteria=self.description,
            url=url,
            domain=self.topic.value,
            created_at=self.created_at,
            info_cutoff_at=info_cutoff_at or self.created_at,
            close_at=self.close_at,
            resolve_by=self.resolve_at,
            extra={
                "group_slugs": [self.topic.value],
                "ordered_options": False,
                "crowd_probabilities": list(self.crowd_probabilities),
            },
        )


@dataclass(frozen=True, kw_only=True)
class SimNumericQuestion:
    """A posed numeric question as the public sees it (no outcome)."""

    external_id: str
    day: int
    index: int
    topic: Topic
    entity: str
    quantity: str
    mean: float
    sigma: float
    crowd_value: float
    """The market's current value: μ plus noise of sd σ/2, inside the range."""
    title: str
    description: str
    slug: str
    horizon_days: int
    created_at: datetime
    close_at: datetime
    resolve_at: datetime

    @property
    def spec(self) -> NumericSpec:
        return NumericSpec(lower=0.0, upper=NUMERIC_UPPER, unit=NUMERIC_UNIT)

    def true_quantiles(self, levels: tuple[float, ...] = QUANTILE_LEVELS) -> tuple[float, ...]:
        """clip(μ + σ·z_τ) at `levels`: the outcome's true quantiles."""
        normal = NormalDist(self.mean, self.sigma)
        return tuple(min(NUMERIC_UPPER, max(0.0, normal.inv_cdf(t))) for t in levels)

    def to_domain(
        self, *, source: str = "manifold", url: str = "", info_cutoff_at: datetime | None = None
    ) -> Question:
        return Question(
            source=source,
            external_id=self.external_id,
            kind=QuestionKind.NUMERIC,
            title=self.title,
            background=self.description,
            resolution_criteria=self.description,
            url=url,
            domain=self.topic.value,
            created_at=self.created_at,
            info_cutoff_at=info_cutoff_at or self.created_at,
            close_at=self.close_at,
            resolve_by=self.resolve_at,
            extra={"group_slugs": [self.topic.value], **self.spec.to_extra()},
        )


SimKindQuestion = SimChoiceQuestion | SimNumericQuestion


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


@dataclass(frozen=True, kw_only=True)
class KindTiming:
    """Where one question sits in the world's day (shared with the binary questions)."""

    seed: int
    day: int
    index: int
    created_at: datetime
    horizon_days: int
    resolution_delay_hours: float


def _slug(text: str, external_id: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") + f"-{external_id}"


def make_choice_question(
    rng: random.Random,
    timing: KindTiming,
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
    close_at = timing.created_at + timedelta(days=timing.horizon_days)
    external_id = f"w{timing.seed}d{timing.day}c{timing.index}"
    names = ", ".join(options[:-1]) + f" or {options[-1]}"
    cue = f" Analysts see a {CHOICE_STRENGTH_WORDS[strength]} favourite in {options[favourite]}."
    cue = "" if research else cue
    stem = f"Which of {names} will {event} first by {close_at:%Y-%m-%d}?"
    return SimChoiceQuestion(
        external_id=external_id,
        day=timing.day,
        index=timing.index,
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
        slug=_slug(stem, external_id),
        horizon_days=timing.horizon_days,
        created_at=timing.created_at,
        close_at=close_at,
        resolve_at=close_at + timedelta(hours=timing.resolution_delay_hours),
    )


def make_numeric_question(
    rng: random.Random,
    timing: KindTiming,
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
    close_at = timing.created_at + timedelta(days=timing.horizon_days)
    external_id = f"w{timing.seed}d{timing.day}n{timing.index}"
    stem = f"How many {quantity} will {entity.name} report by {close_at:%Y-%m-%d}?"
    cue = "" if research else f" Analysts expect about {mean:g}, give or take {sigma:g}."
    return SimNumericQuestion(
        external_id=external_id,
        day=timing.day,
        index=timing.index,
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
        slug=_slug(stem, external_id),
        horizon_days=timing.horizon_days,
        created_at=timing.created_at,
        close_at=close_at,
        resolve_at=close_at + timedelta(hours=timing.resolution_delay_hours),
    )


def draw_kind_resolution(
    question: SimKindQuestion, *, outcome_seed: int, cancel_rate: float
) -> KindResolution:
    """The outcome, from a stream of its own (redrawing outcomes changes no published text)."""
    kind = "c" if isinstance(question, SimChoiceQuestion) else "n"
    rng = random.Random(f"{outcome_seed}:outcome-{kind}:{question.day}:{question.index}")
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


def kind_evidence_texts(
    rng: random.Random, question: SimKindQuestion, *, evidence_noise: float, research: bool = False
) -> tuple[str, str, int]:
    """(headline, summary, reading) of one evidence article: a noisy reading of the question's
    cue (the option it names, or the number it reports); in a research world the text also
    states what the title no longer does (the favourite's strength, the σ)."""
    source = rng.choice(EVIDENCE_SOURCES)
    if isinstance(question, SimChoiceQuestion):
        named = question.favourite
        if rng.random() < evidence_noise:
            named = rng.choice([i for i in range(len(question.options)) if i != named])
        option = question.options[named]
        among = f"among {', '.join(question.options)} by {question.close_at:%Y-%m-%d}"
        if research:
            strength = CHOICE_STRENGTH_WORDS[question.strength]
            return (
                f"{source} see a {strength} favourite in {option} to {question.event} first",
                f"{source} see a {strength} favourite in {option} to {question.event} first "
                f"{among}.",
                named,
            )
        return (
            f"{source} expect {option} to {question.event} first",
            f"{source} say {option} is the one to {question.event} first {among}.",
            named,
        )
    reading = round(rng.gauss(question.mean, question.sigma / 2.0))
    spread = f", give or take {question.sigma:g}" if research else ""
    return (
        f"{source} put {question.entity}'s {question.quantity} near {reading}",
        f"{source} estimate {question.entity} will report about {reading} {question.quantity} "
        f"by {question.close_at:%Y-%m-%d}{spread}.",
        reading,
    )


def kind_report_texts(question: SimKindQuestion, resolution: KindResolution) -> tuple[str, str]:
    """(title, summary) of the article stating the outcome at the resolution time."""
    if resolution.value is None:
        what = (
            f"which option would {question.event} first"
            if isinstance(question, SimChoiceQuestion)
            else f"{question.entity}'s {question.quantity}"
        )
        return "Question withdrawn", f"The question on {what} was withdrawn."
    if isinstance(question, SimChoiceQuestion):
        winner = question.options[int(resolution.value)]
        text = f"{winner} was the first to {question.event}"
        return text, f"Confirmed on {question.resolve_at:%Y-%m-%d}: {text}."
    text = f"{question.entity} reported {resolution.value:g} {question.quantity}"
    return text, f"Confirmed on {question.resolve_at:%Y-%m-%d}: {text}."
