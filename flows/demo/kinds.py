"""The demo's choice and numeric questions (`futureworld demo --kinds binary,choice,numeric`):
their held-out panels, forecasting them each round through the rollout engine, their
warm-start demonstrations, and the paired first-vs-last-round comparison the report states.

A kind's panel is drawn like the binary one (flows.demo.panel): the world's questions of that
kind from PANEL_DAY on, as the Manifold adapter harvests them, with their outcomes and true
distributions, forecast by every round's policy with the same seeds (common random numbers).
Per forecast it keeps the score the report averages: multiclass Brier and the top-label
(confidence, correct) pair for choice questions; CRPS on the range's unit axis and whether the
outcome fell in the 50% and 90% central intervals for numeric ones. The truth's own score on
the panel is the floor. Claims are paired over panel questions as for binary questions: the
last round is better only where the 95% paired bootstrap interval of the difference lies
below zero.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from flows.demo.panel import CYCLE_HOUR, PANEL_DAY
from futureworld import scoring
from futureworld.agent.demonstrations import Demonstration, demonstration_trajectory
from futureworld.agent.engine import GroupJob, RolloutEngine
from futureworld.agent.loop import rollout_seed
from futureworld.agent.tools import InMemoryCorpus
from futureworld.answers import ANSWER_FORMATS
from futureworld.domain import (
    QUANTILE_LEVELS,
    GenerationSettings,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)
from futureworld.plots import plot_metric_by_round
from futureworld.policy.base import PolicyBackend
from futureworld.scoring import PairedDifference, expected_calibration_error
from futureworld.sources.manifold import market_to_question
from futureworld.world import World
from futureworld.world.payloads import kind_market
from futureworld.world.questions import SimChoiceQuestion, SimKindQuestion, SimNumericQuestion
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


def build_kind_panel(world: World, kind: QuestionKind, n: int) -> list[KindPanelQuestion]:
    """The first `n` questions of `kind` posed from PANEL_DAY on, with their outcomes."""
    wanted = KIND_PANELS[kind].sim_type
    out: list[KindPanelQuestion] = []
    day = PANEL_DAY
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
        if day > PANEL_DAY + 10 * n:
            raise ValueError(f"the panel world poses no {kind} questions")
    return out


@dataclass(frozen=True)
class KindPanelScore:
    """One round's forecasts of a kind's panel, one row per parsed forecast: the question's
    index in the panel and the forecast's scores (see the module docstring)."""

    kind: QuestionKind
    round: int
    policy_version: int
    question: tuple[int, ...]
    score: tuple[float, ...]
    """Multiclass Brier (choice) or CRPS on the unit axis (numeric); lower is better."""
    confidence: tuple[float, ...]
    """Choice: the top option's probability; numeric: 1.0 if in the 50% interval."""
    hit: tuple[float, ...]
    """Choice: 1.0 if the top option won; numeric: 1.0 if in the 90% interval."""
    true_score: float
    """The truth's mean score on the whole panel: the floor."""
    unparsed: int

    @property
    def parse_rate(self) -> float:
        total = len(self.score) + self.unparsed
        return len(self.score) / total if total else float("nan")

    @property
    def mean_score(self) -> float:
        return float(np.mean(self.score)) if self.score else float("nan")

    @property
    def calibration(self) -> float:
        """Choice: top-label ECE; numeric: the 90% interval's coverage."""
        if not self.score:
            return float("nan")
        return KIND_PANELS[self.kind].calibration(self.confidence, self.hit)

    @property
    def coverage_50(self) -> float:
        """Numeric: the 50% interval's coverage."""
        return float(np.mean(self.confidence)) if self.score else float("nan")

    def score_rows(self) -> list[tuple[int, float, float]]:
        """(question, score, 0) rows: a paired bootstrap of the mean score."""
        return [(q, s, 0.0) for q, s in zip(self.question, self.score, strict=True)]

    def calibration_rows(self) -> list[tuple[int, float, float]]:
        """Choice: (question, confidence, correct) rows, whose ECE is the top-label ECE."""
        return list(zip(self.question, self.confidence, self.hit, strict=True))


def _choice_scores(
    _question: Question, probabilities: Sequence[float], outcome: float
) -> tuple[float, float, float]:
    y = int(outcome)
    brier = sum((p - (1.0 if i == y else 0.0)) ** 2 for i, p in enumerate(probabilities))
    top = max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))
    return brier, probabilities[top], 1.0 if top == y else 0.0


def _numeric_scores(
    question: Question, quantiles: Sequence[float], outcome: float
) -> tuple[float, float, float]:
    spec = question.numeric_spec
    unit = [spec.normalise(q) for q in quantiles]
    y = spec.normalise(outcome)
    crps = float(scoring.crps_from_quantiles(unit, QUANTILE_LEVELS, y))
    in_50 = 1.0 if quantiles[1] <= outcome <= quantiles[3] else 0.0
    in_90 = 1.0 if quantiles[0] <= outcome <= quantiles[4] else 0.0
    return crps, in_50, in_90


def _top_label_ece(confidence: Sequence[float], hit: Sequence[float]) -> float:
    return expected_calibration_error(list(confidence), list(hit))


def _coverage(_confidence: Sequence[float], hit: Sequence[float]) -> float:
    return float(np.mean(hit))


@dataclass(frozen=True, kw_only=True)
class KindPanel:
    """How the demo scores and reports one kind's panel (KIND_PANELS)."""

    sim_type: type[SimKindQuestion]
    """The world's questions of the kind."""
    true_forecast: Callable[[Any], tuple[float, ...]]
    """The world question's true distribution, as the kind's answer holds a forecast."""
    score: Callable[[Question, Sequence[float], float], tuple[float, float, float]]
    """(score, confidence, hit) of a forecast given the outcome (KindPanelScore's columns)."""
    calibration: Callable[[Sequence[float], Sequence[float]], float]
    """The calibration column's value from the (confidence, hit) columns."""
    score_name: str
    table_score_name: str
    log_score_name: str
    """The score's name in the demo's round log."""
    calibration_name: str
    claims_calibration: bool
    """The claim pairs the calibration as well as the score (else it is only reported)."""
    reports_coverage_50: bool
    """The table has a 50% coverage column (the confidence column's mean)."""


KIND_PANELS: dict[QuestionKind, KindPanel] = {
    QuestionKind.CHOICE: KindPanel(
        sim_type=SimChoiceQuestion,
        true_forecast=lambda sim: sim.probabilities,
        score=_choice_scores,
        calibration=_top_label_ece,
        score_name="multiclass Brier",
        table_score_name="multiclass Brier",
        log_score_name="Brier",
        calibration_name="top-label ECE",
        claims_calibration=True,
        reports_coverage_50=False,
    ),
    QuestionKind.NUMERIC: KindPanel(
        sim_type=SimNumericQuestion,
        true_forecast=lambda sim: sim.true_quantiles(),
        score=_numeric_scores,
        calibration=_coverage,
        score_name="CRPS",
        table_score_name="CRPS (unit axis)",
        log_score_name="CRPS",
        calibration_name="90% coverage",
        claims_calibration=False,
        reports_coverage_50=True,
    ),
}
"""The demo's non-binary kinds (the binary panel is flows.demo.panel's)."""


def _true_score(item: KindPanelQuestion) -> float:
    panel = KIND_PANELS[item.question.kind]
    return panel.score(item.question, panel.true_forecast(item.sim), item.outcome)[0]


def score_kind_panel(
    backend: PolicyBackend,
    settings: GenerationSettings,
    kind: QuestionKind,
    panel: Sequence[KindPanelQuestion],
    *,
    round_no: int,
    policy_version: int,
    seed: int,
) -> KindPanelScore:
    """A policy forecasts a kind's panel (in memory, one sample a question, empty corpus)
    through the rollout engine, as flows.demo.panel.score_panel does for binary questions."""
    engine = RolloutEngine(
        backend, InMemoryCorpus([]), settings, agent_id=0, policy_version=policy_version
    )
    jobs = [
        GroupJob(
            question=item.question,
            samples=(0,),
            seeds=(rollout_seed(seed, KIND_PANEL_SEED_OFFSET + n, 0, 0),),
            as_of=item.question.info_cutoff_at,
        )
        for n, item in enumerate(panel)
    ]
    groups: dict[int, list[Trajectory]] = {}
    engine.run(jobs, lambda job, group: groups.__setitem__(job.question.id, group))
    answers, rules = ANSWER_FORMATS[kind], KIND_PANELS[kind]
    index, score, confidence, hit, unparsed = [], [], [], [], 0
    for n, item in enumerate(panel):
        for t in groups[item.question.id]:
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
        unparsed=unparsed,
    )


@dataclass(frozen=True)
class KindClaim:
    """A kind's first round against its last on the panel, paired by question."""

    kind: QuestionKind
    score: PairedDifference
    """Mean multiclass Brier (choice) or CRPS (numeric)."""
    calibration: PairedDifference | None
    """Choice: top-label ECE. None for numeric questions (coverage is reported, not claimed)."""
    parse_rates: tuple[float, float]

    @property
    def improved(self) -> bool:
        """The score lower beyond its 95% paired interval, without answering less often."""
        answering = self.parse_rates[1] >= self.parse_rates[0] - 0.02
        return answering and self.score.ci[1] < 0.0

    def summary(self) -> str:
        name = KIND_PANELS[self.kind].score_name
        d = self.score
        parts = [
            f"{self.kind} {name} {d.before:.4f} → {d.after:.4f} (Δ {d.difference:+.4f}, "
            f"95% CI [{d.ci[0]:+.4f}, {d.ci[1]:+.4f}])"
        ]
        if self.calibration is not None:
            c = self.calibration
            parts.append(
                f"top-label ECE {c.before:.4f} → {c.after:.4f} (Δ {c.difference:+.4f}, "
                f"95% CI [{c.ci[0]:+.4f}, {c.ci[1]:+.4f}])"
            )
        verdict = "improved" if self.improved else "no clear improvement"
        return "; ".join(parts) + f": {verdict}"


def kind_claim(scores: Sequence[KindPanelScore], n_resamples: int = 1000) -> KindClaim | None:
    """The claim of a kind's first against its last panel; None when either has no forecast."""
    first, last = scores[0], scores[-1]
    if not first.score or not last.score:
        return None

    def mean(p, _y) -> float:
        return float(np.mean(p))

    calibration = None
    if KIND_PANELS[first.kind].claims_calibration:
        calibration = scoring.paired_bootstrap_difference(
            first.calibration_rows(),
            last.calibration_rows(),
            expected_calibration_error,
            n_resamples=n_resamples,
        )
    return KindClaim(
        kind=first.kind,
        score=scoring.paired_bootstrap_difference(
            first.score_rows(), last.score_rows(), mean, n_resamples=n_resamples
        ),
        calibration=calibration,
        parse_rates=(first.parse_rate, last.parse_rate),
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


def kind_report(
    scores: dict[QuestionKind, list[KindPanelScore]],
    claims: dict[QuestionKind, KindClaim | None],
    out_dir: Path,
) -> tuple[str, dict[str, Any]]:
    """The report's section on choice and numeric questions (markdown, metrics.json entries)
    and a plot of each kind's panel score by round; empty for a binary-only demo."""
    if not scores:
        return "", {}
    lines = ["## Choice and numeric questions", ""]
    data: dict[str, Any] = {}
    for kind, rounds in scores.items():
        claim = claims.get(kind)
        verdict = (
            "no first- or last-round forecasts to compare" if claim is None else (claim.summary())
        )
        rules = KIND_PANELS[kind]
        name, calibration = rules.table_score_name, rules.calibration_name
        coverage = rules.reports_coverage_50
        lines += [
            f"**{kind}, round 0 → round {rounds[-1].round}** (paired bootstrap over "
            f"{len({q for r in rounds for q in r.question})} panel questions): {verdict}.",
            "",
            f"| round | version | n | {name} | {calibration} | "
            + ("50% coverage | " if coverage else "")
            + "truth's score (floor) | parsed |",
            "|---" * (8 if coverage else 7) + "|",
        ]
        for r in rounds:
            middle = f"{r.coverage_50:.3f} | " if coverage else ""
            lines.append(
                f"| {r.round} | {r.policy_version} | {len(r.score)} | {r.mean_score:.4f} | "
                f"{r.calibration:.4f} | {middle}{r.true_score:.4f} | {r.parse_rate:.2f} |"
            )
        lines += ["", f"![{kind} by round]({kind}_by_round.png)", ""]
        plot_metric_by_round(
            {
                "forecaster (panel)": [(r.round, r.mean_score) for r in rounds],
                "true distribution (floor)": [(r.round, r.true_score) for r in rounds],
            },
            out_dir / f"{kind}_by_round.png",
            metric=name,
            title=f"{kind} questions: {name} by round (lower is better)",
        )
        data[str(kind)] = {
            "rounds": [
                {
                    "round": r.round,
                    "policy_version": r.policy_version,
                    "n": len(r.score),
                    "score": r.mean_score,
                    "calibration": r.calibration,
                    "coverage_50": r.coverage_50 if coverage else None,
                    "true_score": r.true_score,
                    "parse_rate": r.parse_rate,
                }
                for r in rounds
            ],
            "claim": None if claim is None else _claim_json(claim),
        }
    return "\n".join(lines), data


def _claim_json(claim: KindClaim) -> dict[str, Any]:
    def difference(d: PairedDifference) -> dict[str, Any]:
        return {"first": d.before, "last": d.after, "difference": d.difference, "ci": list(d.ci)}

    return {
        "improved": claim.improved,
        "score": difference(claim.score),
        "calibration": None if claim.calibration is None else difference(claim.calibration),
        "parse_rates": list(claim.parse_rates),
    }
