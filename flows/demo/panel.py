"""The demo's held-out panel and its warm-start data, in the exact shape the harvest gives
world questions: the panel (fixed questions, outcomes and true probabilities, drawn from a
world of its own), forecasting it with a policy through the rollout engine (the same loop
predict runs, every panel question in flight at once), and the warm start's demonstrations.
benchmarks/learning_curve.py uses the same functions.

The panel world: the demo's world config with its own seed (`panel_seed`), from day 0 on, so
no panel question is one the learner trains on, and its questions are dated in the calendar
the rounds live in. A panel drawn from far-future days of the demo's own world (day 10 000,
dates in 2053, as it once was) is out of distribution in its dates alone: the same version
(seed 0, v29) parsed 0.61 of 600 such questions and 0.99 of 600 dated 2026.

Panel seeds: sample s of panel question n is seeded by a hash of (seed, n, s), the same in
every round, so round 0 and the last round draw with common random numbers and their paired
difference measures the policies, not the dice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

from futureworld.agent.demonstrations import Demonstration, demonstration_trajectory
from futureworld.agent.engine import GroupJob, RolloutEngine
from futureworld.agent.loop import rollout_seed
from futureworld.agent.tools import Corpus, InMemoryCorpus
from futureworld.answers import ANSWER_FORMATS
from futureworld.domain import GenerationSettings, ParseStatus, Question, Trajectory
from futureworld.policy.base import PolicyBackend
from futureworld.sources.manifold import market_to_question
from futureworld.world import World, WorldConfig, sft_examples
from futureworld.world.payloads import lite_market

PANEL_SEED_OFFSET = 20_000
"""A panel world's seed is the demo's seed plus this (the warm start's is +10 000)."""
PANEL_QUESTIONS_PER_DAY = 250
"""The panel world poses this many questions a day; a larger panel spans several days."""
CYCLE_HOUR = 12
"""The daily cycle runs at noon (simulated UTC), after the day's questions are posed."""


@dataclass(frozen=True)
class PanelQuestion:
    question: Question
    """With a placeholder (negative) id: the panel is never stored."""
    outcome: float
    p_true: float


@dataclass(frozen=True)
class PanelScore:
    """One round's forecasts of the evaluation panel: p, outcome and true p per forecast."""

    round: int
    policy_version: int
    p_yes: tuple[float, ...]
    y: tuple[float, ...]
    p_true: tuple[float, ...]
    question: tuple[int, ...]
    """Index of the panel question each forecast is of (several samples per question)."""
    unparsed: int

    @property
    def parse_rate(self) -> float:
        return len(self.p_yes) / (len(self.p_yes) + self.unparsed)

    def rows(self) -> list[tuple[int, float, float]]:
        """(question, p, y) per forecast, as `paired_bootstrap_difference` takes them."""
        return list(zip(self.question, self.p_yes, self.y, strict=True))


def as_harvested(world: World, external_id: str) -> Question:
    """The question exactly as the demo's harvest sees it: the world's Manifold market parsed
    by the Manifold adapter at the cycle's hour of its day (same prompt, same as-of)."""
    sim = world.question(external_id)
    at = world.day_start(sim.day) + timedelta(hours=CYCLE_HOUR)
    return market_to_question(lite_market(sim, None, now=at, base_url="http://world"), now=at)


def panel_seed(seed: int) -> int:
    """The seed of the panel world of a demo (or benchmark) run with `seed`."""
    return seed + PANEL_SEED_OFFSET


def panel_world(base: WorldConfig, n: int) -> World:
    """The world a panel of `n` questions is drawn from for a run on `base`: `base` with the
    run's `panel_seed`, no cancellations, and up to PANEL_QUESTIONS_PER_DAY questions a day."""
    return World(
        dataclasses.replace(
            base,
            seed=panel_seed(base.seed),
            questions_per_day=min(n, PANEL_QUESTIONS_PER_DAY),
            cancel_rate=0.0,
        )
    )


def build_panel(world: World, n: int) -> list[PanelQuestion]:
    """The first `n` questions the panel world poses from day 0 on, with their outcomes and
    true p."""
    out: list[PanelQuestion] = []
    day = 0
    while len(out) < n:
        far = world.day_start(day + 30)
        for sim in world.questions_posed_on(day)[: n - len(out)]:
            resolution = world.resolution_as_of(sim.external_id, far)
            question = replace(as_harvested(world, sim.external_id), id=-(len(out) + 1))
            out.append(PanelQuestion(question, resolution.value, sim.p_yes))
        day += 1
    return out


def score_panel(
    backend: PolicyBackend,
    settings: GenerationSettings,
    panel: Sequence[PanelQuestion],
    *,
    round_no: int,
    policy_version: int,
    samples: int,
    seed: int,
) -> PanelScore:
    """A policy forecasts the panel (in memory: never stored, never trained) with the agent's
    own settings through the rollout engine, all panel questions in flight at once; the
    corpus is empty (the panel measures what the policy knows, not what it can look up)."""
    groups = forecast_panel(
        backend,
        settings,
        [item.question for item in panel],
        policy_version=policy_version,
        samples=samples,
        seed=seed,
    )
    return panel_score(
        [(group, item.outcome, item.p_true) for item, group in zip(panel, groups, strict=True)],
        round_no=round_no,
        policy_version=policy_version,
    )


def forecast_panel(
    backend: PolicyBackend,
    settings: GenerationSettings,
    questions: Sequence[Question],
    *,
    corpus: Corpus | None = None,
    policy_version: int,
    samples: int,
    seed: int,
    first_index: int = 0,
) -> list[list[Trajectory]]:
    """Every panel question's `samples` rollouts, all in flight at once through the engine, in
    panel order; question n's sample s has the seed rollout_seed(seed, first_index + n, 0, s),
    the same every round (common random numbers). Without a corpus the corpus is empty: a
    held-out panel measures what the policy knows, not what it can look up."""
    corpus = InMemoryCorpus([]) if corpus is None else corpus
    engine = RolloutEngine(backend, corpus, settings, agent_id=0, policy_version=policy_version)
    jobs = [
        GroupJob(
            question=question,
            samples=tuple(range(samples)),
            seeds=tuple(rollout_seed(seed, first_index + n, 0, s) for s in range(samples)),
            as_of=question.info_cutoff_at,
        )
        for n, question in enumerate(questions)
    ]
    groups: dict[int | None, list[Trajectory]] = {}
    engine.run(jobs, lambda job, group: groups.__setitem__(job.question.id, group))
    return [groups[question.id] for question in questions]


def panel_score(
    forecasts: Sequence[tuple[Sequence[Trajectory], float, float]],
    *,
    round_no: int,
    policy_version: int,
) -> PanelScore:
    """The PanelScore of (rollouts, outcome, true P(yes)) per panel question, in panel order:
    one row per parsed forecast; the others count as unparsed."""
    p, y, truth, index, unparsed = [], [], [], [], 0
    for n, (group, outcome, p_true) in enumerate(forecasts):
        for trajectory in group:
            if trajectory.parse_status is not ParseStatus.OK or trajectory.p_yes is None:
                unparsed += 1
                continue
            p.append(trajectory.p_yes)
            y.append(outcome)
            truth.append(p_true)
            index.append(n)
    return PanelScore(
        round=round_no,
        policy_version=policy_version,
        p_yes=tuple(p),
        y=tuple(y),
        p_true=tuple(truth),
        question=tuple(index),
        unparsed=unparsed,
    )


def warm_start_questions(
    world: World, days: int, *, sharpening: float, noise_logit: float
) -> list[tuple[Question, float]]:
    """(question as harvested, the reference's target P(yes)) for the warm start: an
    over-confident (log-odds × `sharpening`) and noisy reference forecaster."""
    return [
        (as_harvested(world, e.question.external_id), e.target_p_yes)
        for e in sft_examples(world, days, sharpening=sharpening, noise_logit=noise_logit)
    ]


def warm_start_trajectories(
    tokenizer: object, examples: Sequence[tuple[Question, float]], *, agent_id: int = 0
) -> list[Trajectory]:
    """The reference's answers as demonstrations with the agent's brief prompt."""
    return [
        demonstration_trajectory(
            tokenizer,
            Demonstration(
                question=question, completion=ANSWER_FORMATS[question.kind].write(target, question)
            ),
            agent_id=agent_id,
            policy_version=0,
            sample_index=i,
            brief=True,
        )
        for i, (question, target) in enumerate(examples)
    ]
