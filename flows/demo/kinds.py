"""The demo's choice and numeric questions (`futureworld demo --kinds binary,choice,numeric`):
their held-out panels, forecasting them each round through the rollout engine, and their
warm-start demonstrations. How a panel is scored is kind_scores.py's; the paired
first-vs-last-round claim and the report's section are kind_report.py's.

A kind's panel is drawn like the binary one (flows.demo.panel): the questions of that kind the
panel world poses from day 0 on, as the Manifold adapter harvests them, with their outcomes and
true distributions, forecast by every round's policy with the same seeds (common random numbers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

import numpy as np

from flows.demo.kind_scores import KIND_PANELS, KindPanelScore
from flows.demo.panel import CYCLE_HOUR, forecast_panel
from futureworld.agent.demonstrations import Demonstration, demonstration_trajectory
from futureworld.agent.tools import Corpus
from futureworld.answers import ANSWER_FORMATS
from futureworld.domain import (
    GenerationSettings,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)
from futureworld.policy.base import PolicyBackend
from futureworld.sources.manifold import market_to_question
from futureworld.world import World
from futureworld.world.payloads import kind_market
from futureworld.world.questions import SimKindQuestion
from futureworld.world.reference import KindSFTExample, kind_sft_examples

KIND_PANEL_SEED_OFFSET = 1_000_000
"""Added to a kind panel question's index in its rollout seed, so no binary panel question
shares its seeds."""


def as_harvested_kind(world: World, sim: SimKindQuestion) -> Question:
    """A choice or numeric question exactly as the demo's harvest sees it: the world's
    FullMarket parsed by the Manifold adapter at the cycle's hour of its day."""
    at = world.day_start(sim.day) + timedelta(hours=CYCLE_HOUR)
    market = kind_market(sim, None, now=at, base_url="http://world", full=True)
    return market_to_question(market, now=at)


@dataclass(frozen=True)
class KindPanelQuestion:
    question: Question
    """With a placeholder (negative) id: the panel is never stored."""
    outcome: float
    sim: SimKindQuestion
    """The world's question, holding its true distribution."""
    informed: tuple[float, ...] | None = None
    """On a research world: the forecast of an agent that reads all the question's evidence
    (World.informed_forecast), the informed floor; None elsewhere."""
    uninformed: tuple[float, ...] | None = None
    """On a research world: the forecast of one that never searches, the uninformed floor."""


def build_kind_panel(world: World, kind: QuestionKind, n: int) -> list[KindPanelQuestion]:
    """The first `n` questions of `kind` the panel world poses from day 0 on, with their
    outcomes."""
    wanted = KIND_PANELS[kind].sim_type
    out: list[KindPanelQuestion] = []
    day = 0
    while len(out) < n:
        far = world.day_start(day + 30)
        for sim in world.kind_questions_posed_on(day):
            if not isinstance(sim, wanted) or len(out) >= n:
                continue
            resolution = world.resolution_as_of(sim.external_id, far)
            assert resolution is not None and resolution.value is not None
            question = replace(as_harvested_kind(world, sim), id=-(len(out) + 1))
            out.append(KindPanelQuestion(question, float(resolution.value), sim))
        day += 1
        if day > 10 * n:
            raise ValueError(f"the panel world poses no {kind} questions")
    return out


def _true_score(item: KindPanelQuestion) -> float:
    panel = KIND_PANELS[item.question.kind]
    return panel.score(item.question, panel.true_forecast(item.sim), item.outcome)[0]


def _floor(panel: Sequence[KindPanelQuestion], which: str) -> float | None:
    """The panel's mean score of its `which` ("informed" or "uninformed") forecasts; None off
    a research world."""
    forecasts = [getattr(item, which) for item in panel]
    if not panel or any(f is None for f in forecasts):
        return None
    rules = KIND_PANELS[panel[0].question.kind]
    return float(
        np.mean(
            [
                rules.score(item.question, forecast, item.outcome)[0]
                for item, forecast in zip(panel, forecasts, strict=True)
            ]
        )
    )


def score_kind_panel(
    backend: PolicyBackend,
    settings: GenerationSettings,
    kind: QuestionKind,
    panel: Sequence[KindPanelQuestion],
    *,
    round_no: int,
    policy_version: int,
    seed: int,
    corpus: Corpus | None = None,
) -> KindPanelScore:
    """A policy forecasts a kind's panel (in memory, one sample a question; an empty corpus
    unless the research demo gives its panel world's) through the rollout engine, as
    flows.demo.panel.score_panel does for binary questions."""
    groups = forecast_panel(
        backend,
        settings,
        [item.question for item in panel],
        corpus=corpus,
        policy_version=policy_version,
        samples=1,
        seed=seed,
        first_index=KIND_PANEL_SEED_OFFSET,
    )
    answers, rules = ANSWER_FORMATS[kind], KIND_PANELS[kind]
    index, score, confidence, hit, unparsed = [], [], [], [], 0
    for n, (item, group) in enumerate(zip(panel, groups, strict=True)):
        for t in group:
            if t.parse_status is not ParseStatus.OK:
                unparsed += 1
                continue
            forecast = answers.forecast_of(t)
            assert isinstance(forecast, tuple), f"an OK {kind} answer holds no forecast"
            s, c, h = rules.score(item.question, forecast, item.outcome)
            index.append(n)
            score.append(s)
            confidence.append(c)
            hit.append(h)
    return KindPanelScore(
        kind=kind,
        round=round_no,
        policy_version=policy_version,
        question=tuple(index),
        score=tuple(score),
        confidence=tuple(confidence),
        hit=tuple(hit),
        true_score=float(np.mean([_true_score(item) for item in panel])),
        informed_score=_floor(panel, "informed"),
        uninformed_score=_floor(panel, "uninformed"),
        unparsed=unparsed,
    )


def kind_answer_text(example: KindSFTExample) -> str:
    """The reference's answer in its kind's canonical format."""
    answers = ANSWER_FORMATS[example.question.kind]
    forecast = answers.forecast_of(example)
    assert forecast is not None, f"no reference forecast for {example.question.external_id}"
    return answers.write(forecast, example.question)


def kind_warm_start_trajectories(
    tokenizer: object, examples: Sequence[KindSFTExample], *, first_index: int = 0
) -> list[Trajectory]:
    """The reference's choice and numeric answers as demonstrations (brief prompt)."""
    return [
        demonstration_trajectory(
            tokenizer,
            Demonstration(question=example.question, completion=kind_answer_text(example)),
            agent_id=0,
            policy_version=0,
            sample_index=first_index + i,
            brief=True,
        )
        for i, example in enumerate(examples)
    ]


def kind_warm_start_examples(
    world: World, days: int, *, sharpening: float, noise_logit: float
) -> list[KindSFTExample]:
    """The reference's answers to the choice and numeric questions of `days`, each question
    as the harvest sees it."""
    examples = kind_sft_examples(world, days, sharpening=sharpening, noise_logit=noise_logit)
    return [
        replace(e, question=as_harvested_kind(world, world.market(e.question.external_id)))
        for e in examples
    ]
