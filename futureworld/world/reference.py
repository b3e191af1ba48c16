"""A reference forecaster for the simulated world, and the warm-start SFT data it writes.

Owns the reference's forecasts and the (question, target) pairs; turning them into token
sequences with the agent's prompt is the caller's job.

The reference knows the cue ladder (config.py) exactly but is deliberately over-confident:
    p_ref = σ(s · logit(p_true)),  s = `sharpening` ≥ 1,
so with s = 2 the ladder {0.1, 0.3, 0.5, 0.7, 0.9} becomes {0.012, 0.155, 0.5, 0.845, 0.988}.
It never states certainty: answers are clipped to [0.01, 0.99] (`REFERENCE_RANGE`), as a
sensible forecaster's are, which also keeps every answer's leading digit "0" so that
"very high" and "high" differ in the tenths, not in the first token.
Its expected Brier is E[p(1−p)] + E[(p_ref − p)²]: worse than the true probabilities, better
than the 0.25 of always saying 0.5. SFT on it teaches the format and the direction of the
mapping; RL then has calibration left to learn. Choice and numeric questions get the same kind
of reference (the section at the end): too sure of the favourite, too narrow an interval.
A research world's questions state no cue, so the reference cannot read them;
`research_floors` scores the two forecasts that bound a researching agent there instead.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from futureworld.domain import QUANTILE_LEVELS, Question
from futureworld.scoring import brier, crps_from_quantiles
from futureworld.scoring_choice import multiclass_brier
from futureworld.world.config import WorldConfig, cue_probability
from futureworld.world.model import World
from futureworld.world.questions import SimChoiceQuestion, SimNumericQuestion

DEFAULT_SHARPENING = 2.0
REFERENCE_RANGE = (0.01, 0.99)
"""The reference's answers are clipped to this range, before and after SFT noise."""


@dataclass(frozen=True, kw_only=True)
class SFTExample:
    question: Question
    """The question as a harvest of the world's Manifold API yields it."""
    target_p_yes: float
    """The reference forecaster's answer, the SFT target."""


def sharpen(p_yes: float, sharpening: float) -> float:
    """σ(s · logit(p)); s = 1 is the identity, s > 1 pushes p toward 0 or 1."""
    if not 0.0 < p_yes < 1.0:
        raise ValueError(f"p_yes must be inside (0, 1) to sharpen, got {p_yes}")
    if sharpening <= 0:
        raise ValueError(f"sharpening must be > 0, got {sharpening}")
    return 1.0 / (1.0 + math.exp(-sharpening * math.log(p_yes / (1.0 - p_yes))))


def reference_forecast(
    question: Question,
    *,
    sharpening: float = DEFAULT_SHARPENING,
    config: WorldConfig | None = None,
) -> float:
    """The over-confident reference P(yes) from the cue stated in the question's text."""
    p_true = cue_probability(f"{question.title} {question.background}", config or WorldConfig())
    return _clip(round(sharpen(p_true, sharpening), 4))


def _clip(p_yes: float) -> float:
    low, high = REFERENCE_RANGE
    return min(max(p_yes, low), high)


def true_probability(question: Question, world: World | None = None) -> float:
    """The world's true P(yes): looked up by external id when `world` is given, else read from
    the cue in the title under the default ladder (the same number, by construction)."""
    if world is not None:
        return world.true_probability(question.external_id)
    return cue_probability(question.title, WorldConfig())


@dataclass(frozen=True, kw_only=True)
class ResearchFloors:
    """Brier scores no forecaster can beat in expectation, on one set of resolved questions."""

    n_questions: int
    """Questions scored: those asked for that resolved YES or NO (annulled ones are skipped)."""
    informed_brier: float
    """Brier of World.informed_probability: an agent that finds and reads all the evidence."""
    uninformed_brier: float
    """Brier of World.uninformed_probability: an agent that never searches."""
    latent_brier: float
    """Brier of the latent cue_p_yes[k] the outcome is drawn from: beyond reach in a research
    world (it needs the level itself), the floor of the world with research off."""


def research_floors(world: World, external_ids: Iterable[str]) -> ResearchFloors:
    """The informed, uninformed and latent floors' Brier on `external_ids` (binary questions),
    against the world's own outcomes, whether or not they have happened yet on any clock."""
    informed, uninformed, latent, outcomes = [], [], [], []
    for external_id in external_ids:
        question = world.question(external_id)
        resolution = world.resolution_as_of(external_id, question.resolve_at)
        assert resolution is not None
        if resolution.value is None:
            continue
        informed.append(world.informed_probability(external_id))
        uninformed.append(world.uninformed_probability(external_id))
        latent.append(question.p_yes)
        outcomes.append(resolution.value)
    if not outcomes:
        raise ValueError("research_floors needs at least one question that resolved YES or NO")
    return ResearchFloors(
        n_questions=len(outcomes),
        informed_brier=brier(informed, outcomes),
        uninformed_brier=brier(uninformed, outcomes),
        latent_brier=brier(latent, outcomes),
    )


def sft_examples(
    world: World,
    days: int | Iterable[int],
    *,
    sharpening: float = DEFAULT_SHARPENING,
    source: str = "manifold",
    noise_logit: float = 0.0,
) -> list[SFTExample]:
    """Warm-start pairs for every question posed on `days` (an int n means days 0..n-1).

    `noise_logit` > 0 adds Gaussian noise of that std to each target's log-odds (seeded by
    the world), so the warm-started policy keeps some spread for RL to explore with.
    """
    if world.config.research:
        raise ValueError(
            "a research world's questions state no cue, so the reference cannot answer them "
            "from their text; warm-start it on a world with research off"
        )
    day_list = range(days) if isinstance(days, int) else list(days)
    rng = random.Random(f"{world.config.seed}:sft-noise")
    examples = []
    for day in day_list:
        for sim_question in world.questions_posed_on(day):
            question = sim_question.to_domain(source=source)
            target = reference_forecast(question, sharpening=sharpening, config=world.config)
            if noise_logit > 0:
                logit = math.log(target / (1.0 - target)) + rng.gauss(0.0, noise_logit)
                target = _clip(round(1.0 / (1.0 + math.exp(-logit)), 4))
            examples.append(SFTExample(question=question, target_p_yes=target))
    return examples


# -- choice and numeric questions ---------------------------------------------------------------
#
# The same over-confident reference for the other kinds, so that the warm start teaches each
# answer format and the direction of the cue, and RL has calibration left to learn:
# - choice: p_ref ∝ p_true^s (s = `sharpening`), with Gaussian noise of sd `noise_logit` on
#   each option's log-probability; clipped to REFERENCE_RANGE and renormalised.
# - numeric: the quantiles of N(μ + ε, (σ/s)²) clipped to the range, ε ~ N(0, (σ·noise/2)²):
#   the stated centre, too narrow an interval.


@dataclass(frozen=True, kw_only=True)
class KindSFTExample:
    question: Question
    """The question as a harvest of the world's Manifold API yields it."""
    probabilities: tuple[float, ...] = ()
    """Choice: the reference's probability per option."""
    quantiles: tuple[float, ...] = ()
    """Numeric: the reference's values at QUANTILE_LEVELS."""


def sharpened_distribution(
    probabilities: Sequence[float],
    *,
    sharpening: float,
    noise_logit: float = 0.0,
    rng: random.Random | None = None,
) -> tuple[float, ...]:
    """p_ref ∝ p^s, Gaussian noise of sd `noise_logit` on each log-probability, clipped to
    REFERENCE_RANGE and renormalised (unrounded): the over-confident reference's choice
    answer, from the true distribution or (flows.demo.researcher) a posterior."""
    if sharpening <= 0:
        raise ValueError(f"sharpening must be > 0, got {sharpening}")
    logs = [sharpening * math.log(p) for p in probabilities]
    if noise_logit > 0:
        if rng is None:
            raise ValueError("noise needs a random stream")
        logs = [v + rng.gauss(0.0, noise_logit) for v in logs]
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    clipped = [_clip(w / sum(weights)) for w in weights]
    return tuple(p / sum(clipped) for p in clipped)


def choice_reference(
    question: SimChoiceQuestion,
    *,
    sharpening: float = DEFAULT_SHARPENING,
    noise_logit: float = 0.0,
    rng: random.Random | None = None,
) -> tuple[float, ...]:
    """The over-confident reference's probability per option (sums to 1, each in range)."""
    reference = sharpened_distribution(
        question.probabilities, sharpening=sharpening, noise_logit=noise_logit, rng=rng
    )
    return tuple(round(p, 4) for p in reference)


def numeric_reference(
    question: SimNumericQuestion,
    *,
    sharpening: float = DEFAULT_SHARPENING,
    noise: float = 0.0,
    rng: random.Random | None = None,
) -> tuple[float, ...]:
    """The over-confident reference's quantiles at QUANTILE_LEVELS, rounded to 0.1."""
    if sharpening <= 0:
        raise ValueError(f"sharpening must be > 0, got {sharpening}")
    centre = question.mean
    if noise > 0:
        if rng is None:
            raise ValueError("noise needs a random stream")
        centre += rng.gauss(0.0, question.sigma * noise / 2.0)
    normal = NormalDist(centre, question.sigma / sharpening)
    spec = question.spec
    return tuple(
        round(min(spec.upper, max(spec.lower, normal.inv_cdf(level))), 1)
        for level in QUANTILE_LEVELS
    )


@dataclass(frozen=True, kw_only=True)
class KindResearchFloors:
    """research_floors for choice (multiclass Brier) and numeric (CRPS from the quantiles at
    QUANTILE_LEVELS) questions; NaN for a kind with no resolved question among those asked."""

    n_choice: int
    choice_informed_brier: float
    """World.informed_forecast's multiclass Brier: an agent that reads all the evidence."""
    choice_uninformed_brier: float
    """1/k on every option: an agent that never searches."""
    n_numeric: int
    numeric_informed_crps: float
    numeric_uninformed_crps: float


def kind_research_floors(world: World, external_ids: Iterable[str]) -> KindResearchFloors:
    """The informed and uninformed floors of the choice and numeric questions `external_ids`
    against the world's outcomes (annulled questions are skipped)."""
    choice: tuple[list, list, list] = ([], [], [])
    numeric: tuple[list, list, list] = ([], [], [])
    for external_id in external_ids:
        question = world.market(external_id)
        resolution = world.resolution_as_of(external_id, question.resolve_at)
        if resolution is None or resolution.value is None:
            continue
        if not isinstance(question, SimChoiceQuestion | SimNumericQuestion):
            raise ValueError(f"{external_id} is a binary question: use research_floors")
        into = choice if isinstance(question, SimChoiceQuestion) else numeric
        into[0].append(world.informed_forecast(external_id))
        into[1].append(world.uninformed_forecast(external_id))
        into[2].append(int(resolution.value) if into is choice else resolution.value)
    nan = float("nan")

    def crps(quantiles: list, outcomes: list) -> float:
        return float(np.mean(crps_from_quantiles(quantiles, QUANTILE_LEVELS, outcomes)))

    return KindResearchFloors(
        n_choice=len(choice[2]),
        choice_informed_brier=multiclass_brier(choice[0], choice[2]) if choice[2] else nan,
        choice_uninformed_brier=multiclass_brier(choice[1], choice[2]) if choice[2] else nan,
        n_numeric=len(numeric[2]),
        numeric_informed_crps=crps(numeric[0], numeric[2]) if numeric[2] else nan,
        numeric_uninformed_crps=crps(numeric[1], numeric[2]) if numeric[2] else nan,
    )


def kind_sft_examples(
    world: World,
    days: int | Iterable[int],
    *,
    sharpening: float = DEFAULT_SHARPENING,
    source: str = "manifold",
    noise_logit: float = 0.0,
) -> list[KindSFTExample]:
    """Warm-start pairs for every choice and numeric question posed on `days` (an int n means
    days 0..n-1), with noise seeded by the world as for binary questions."""
    if world.config.research:
        raise ValueError(
            "a research world's questions state no cue, so the reference cannot answer them "
            "from their text; warm-start it on a world with research off"
        )
    day_list = range(days) if isinstance(days, int) else list(days)
    rng = random.Random(f"{world.config.seed}:sft-kind-noise")
    examples = []
    for day in day_list:
        for sim in world.kind_questions_posed_on(day):
            question = sim.to_domain(source=source)
            if isinstance(sim, SimChoiceQuestion):
                probabilities = choice_reference(
                    sim, sharpening=sharpening, noise_logit=noise_logit, rng=rng
                )
                examples.append(KindSFTExample(question=question, probabilities=probabilities))
            else:
                quantiles = numeric_reference(
                    sim, sharpening=sharpening, noise=noise_logit, rng=rng
                )
                examples.append(KindSFTExample(question=question, quantiles=quantiles))
    return examples
