"""Backtest: the daily cycle replayed over imported history with a simulated clock, as a
warm start before going live and as a measurement of an agent against the crowd.

Each simulated day at 00:00 UTC (the clock T), through the same stages as live operation:
backfill the rewards of outcomes revealed by T (resolved_at <= T), train the agent on the
groups whose outcomes are revealed by T (every `train_every` days, agents with a trainable
policy), then forecast every question open at T (storage.repositories.questions: posed by T,
not closed, no outcome revealed) with the agent, the reference (the crowd) and the fallback
reference (the base rate). Search runs as of each question's cut-off, which is never after T.
Nothing revealed after T reaches a forecast or an update: openness, backfill and replay all
read the clock.

Decisions: harvesting and resolving are not replayed (the history is already imported; the
clock reveals its outcomes). Rounds are scored at the end against the outcomes revealed by the
last clock, as evaluate scores (the unit is the question: the agent's forecast of a question is
the mean of its G rollouts, an unparsed one counting as 0.5; the parse rate and the expected
Brier of one sample beside it), pairing each round's agent forecasts with the reference's
forecasts of the same questions (futureworld.scoring.paired_bootstrap_difference, resampling
questions); a round whose questions have not resolved yet has no score. A question the
reference has no parsed forecast of (a dataset question has no crowd probability) is paired
with the fallback reference's forecast instead (by default the smoothed base rate of its
source, futureworld.baselines), so every resolved binary question the agent forecast is scored;
each round and the report count how many were paired with which, and what was left out and why
(`LeftOut`, `Coverage`). A round's forecasts are the agent's groups made at its clock by its
version, so re-running a backtest over the same days (each stage is idempotent: questions
already forecast by the current version are skipped) scores the same forecasts again. With a
round (`BacktestOptions.round`) every predict of the run (agent and references) is limited to
that ForecastBench round's questions and only they are scored and counted in the coverage
(storage.repositories.questions.round_question_ids); training still replays whatever groups
are complete.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

from flows.context import PipelineContext
from flows.stages.backfilling import backfill_rewards
from flows.stages.backtest_report import write_backtest_report
from flows.stages.evaluating import forecast_records
from flows.stages.predicting import predict
from flows.stages.training import TrainOptions, replay_and_train
from futureworld.domain import OutcomeStatus, QuestionKind
from futureworld.evaluation import ForecastRecord, ScoreRow, score_forecasts
from futureworld.scoring import brier, paired_bootstrap_difference
from storage.engine import session_scope
from storage.repositories.questions import latest_outcomes, list_questions, round_question_ids
from storage.repositories.rollouts import forecasts_of


@dataclass(frozen=True, kw_only=True)
class BacktestOptions:
    """One backtest: who, over which days, how often it trains."""

    agent: str
    start: date
    """The first simulated day (its clock is 00:00 UTC)."""
    end: date
    """The last simulated day, inclusive."""
    step_days: int = 1
    """Days between simulated cycles."""
    train_every: int = 1
    """Train every this many cycles (0: never; baselines never train)."""
    samples: int = 1
    """Rollouts per question (G); training needs G >= 2."""
    limit: int | None = None
    """At most this many questions forecast per cycle (keeps tiny runs small)."""
    reference: str = "crowd"
    """The agent every round is paired against."""
    fallback_reference: str | None = "base-rate"
    """The agent paired with a question the reference has no forecast of (a dataset question
    has no crowd probability): "base-rate" (the smoothed YES rate of the question's source,
    futureworld.baselines.base_rate) or "uniform" (0.5); None leaves such questions out,
    counted as `no_reference`."""
    train: TrainOptions = field(default_factory=TrainOptions)
    round: date | None = None
    """Only the questions of this ForecastBench round (its forecast due date); None: all."""

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"backtest ends ({self.end}) before it starts ({self.start})")
        if self.step_days < 1:
            raise ValueError(f"step_days must be >= 1, got {self.step_days}")
        if self.train_every < 0:
            raise ValueError(f"train_every must be >= 0, got {self.train_every}")
        if self.samples < 1:
            raise ValueError(f"samples must be >= 1, got {self.samples}")

    def clocks(self) -> list[datetime]:
        days = (self.end - self.start).days // self.step_days + 1
        first = datetime.combine(self.start, time(0, 0), tzinfo=UTC)
        return [first + timedelta(days=i * self.step_days) for i in range(days)]


@dataclass(frozen=True)
class LeftOut:
    """The questions of a round's agent forecasts that no score covers, by the first reason
    that applies. A question whose rollouts did not parse is not among them: it is scored, each
    unparsed rollout counted as IMPUTED_P (the round's parse rate says how many)."""

    unresolved: int = 0
    """No resolved outcome revealed by the last clock (still open, or annulled)."""
    not_binary: int = 0
    """Choice and numeric questions: the backtest scores P(yes) by Brier."""
    no_reference: int = 0
    """Neither the reference nor the fallback reference has a parsed forecast of it."""


@dataclass(frozen=True)
class Coverage:
    """Every question with a resolved outcome revealed by the last clock, each counted once:
    scored in some round against the reference or the fallback, or left out and why."""

    resolved: int = 0
    against_reference: int = 0
    against_fallback: int = 0
    not_forecast: int = 0
    """The agent forecast it in no round of this run (it closed or resolved before the first
    clock, or it was past the limit)."""
    not_binary: int = 0
    no_reference: int = 0


@dataclass(frozen=True)
class BacktestRound:
    round: int
    clock: datetime
    policy_version: int
    """The agent's version that forecast this round."""
    forecasts: int
    """The agent's rollouts written this round."""
    rewards: int
    """Rewards backfilled at the start of the round."""
    trained_to: int | None
    """The version this round's update registered, if it trained."""
    training_run_id: int | None
    n: int = 0
    """Questions of this round scored (resolved by the last clock) with a reference forecast:
    the unit of every score and of the bootstrap."""
    against_reference: int = 0
    """Of n, the questions paired with the reference's own forecast."""
    against_fallback: int = 0
    """Of n, the questions paired with the fallback reference's (the reference had none)."""
    left_out: LeftOut = field(default_factory=LeftOut)
    rollouts: int = 0
    """The agent's rollouts of the n questions (G each)."""
    parse_rate: float | None = None
    """Share of those rollouts whose answer parsed (the rest counted as IMPUTED_P)."""
    brier: float | None = None
    """Mean over the n questions of (p − y)², p the mean of the question's rollouts."""
    sample_brier: float | None = None
    """Expected Brier of one sample: the mean over rollouts of (p_i − y)², imputed included."""
    reference_brier: float | None = None
    """The Brier of the paired reference forecasts (the reference's and the fallback's)."""
    difference: float | None = None
    """brier − reference_brier (negative: the agent beat the reference)."""
    difference_ci: tuple[float, float] | None = None
    """95% paired bootstrap interval of the difference, resampling the n questions."""


@dataclass(frozen=True)
class BacktestReport:
    agent: str
    reference: str
    rounds: list[BacktestRound]
    out_dir: Path | None
    fallback_reference: str | None = None
    coverage: Coverage = field(default_factory=Coverage)


def run_backtest(
    ctx: PipelineContext,
    options: BacktestOptions,
    *,
    out_dir: Path | None = None,
    on_round: Callable[[BacktestRound], None] | None = None,
) -> BacktestReport:
    """Run the simulated days, then score every round against the reference and write the
    report folder (metrics.json, report.md, plots) to `out_dir` when given."""
    agent = ctx.agent(options.agent)
    ctx.agent(options.reference)
    if options.fallback_reference is not None:
        ctx.agent(options.fallback_reference)
    assert agent.id is not None
    if options.round is not None:  # an unknown round fails before any simulated day
        with session_scope(ctx.engine) as session:
            round_question_ids(session, options.round)
    rounds: list[BacktestRound] = []
    for index, clock in enumerate(options.clocks()):
        day = ctx.at(clock)
        backfilled = backfill_rewards(day)
        trained = None
        trains = options.train_every > 0 and index % options.train_every == 0
        if trains and agent.backend.generates:
            trained = replay_and_train(day, agent.name, options.train)
        report = predict(
            day, agent.name, samples=options.samples, limit=options.limit, round=options.round
        )
        for reference in dict.fromkeys((options.reference, options.fallback_reference)):
            if reference is not None and reference != agent.name:
                predict(day, reference, samples=1, round=options.round)
        result = BacktestRound(
            round=index,
            clock=clock,
            policy_version=report.policy_version,
            forecasts=report.rollouts,
            rewards=backfilled.rewards_inserted,
            trained_to=None if trained is None else trained.to_version,
            training_run_id=None if trained is None else trained.training_run_id,
        )
        rounds.append(result)
        if on_round is not None:
            on_round(result)
    last = options.clocks()[-1]
    rounds, coverage = _score_rounds(ctx, options, rounds, last)
    if out_dir is not None:
        write_backtest_report(out_dir, options, rounds, coverage)
    return BacktestReport(
        agent.name, options.reference, rounds, out_dir, options.fallback_reference, coverage
    )


def _score_rounds(
    ctx: PipelineContext,
    options: BacktestOptions,
    rounds: list[BacktestRound],
    last: datetime,
) -> tuple[list[BacktestRound], Coverage]:
    """Each round's binary agent forecasts against the reference's of the same questions (the
    fallback's where the reference has none), with the outcomes revealed by the last clock.

    A round's forecasts are the agent's groups made at its clock by its version. Every forecast
    is evaluate's record (flows.stages.evaluating.forecast_records: the mean of the question's
    rollouts, an unparsed one counted as IMPUTED_P) and every row evaluate's score
    (futureworld.evaluation.score_forecasts), so n, the Brier and the bootstrap are over
    questions."""
    agent = ctx.agent(options.agent)
    at_last = ctx.at(last)
    with session_scope(ctx.engine) as session:
        scope = None if options.round is None else round_question_ids(session, options.round)
        outcomes = {
            qid
            for qid, o in latest_outcomes(session, as_of=last).items()
            if o.status is OutcomeStatus.RESOLVED
            and o.value is not None
            and (scope is None or qid in scope)
        }
        questions = list_questions(session)
        made = {(f.question_id, f.policy_version, f.as_of) for f in forecasts_of(session, agent.id)}
    ids = {(q.source, q.external_id): q.id for q in questions}
    binary = {q.id for q in questions if q.kind is QuestionKind.BINARY}
    names = [options.agent, options.reference, options.fallback_reference]
    records = forecast_records(at_last, [n for n in names if n is not None], round=options.round)

    def answered_by(name: str | None) -> dict[int, ForecastRecord]:
        """This forecaster's newest forecast of each question with a parsed answer."""
        return {
            ids[(r.source, r.question)]: r
            for r in records
            if r.agent == name and r.imputed < len(r.samples)
        }

    reference, fallback = answered_by(options.reference), answered_by(options.fallback_reference)
    paired = {**fallback, **reference}  # the reference's own forecast wins
    mine = {
        (ids[(r.source, r.question)], r.policy_version, r.as_of): r
        for r in records
        if r.agent == agent.name
    }
    tagged: list[ForecastRecord] = []
    pairs: dict[int, list[tuple[int, float, float, float]]] = {}  # round → (q, ref p, p, y)
    left: dict[int, LeftOut] = {}
    reasons: dict[int, str] = {}  # each question's most covered reason over the rounds
    for r in rounds:
        forecast = {q for q, v, at in made if v == r.policy_version and at == r.clock}
        why = question_reasons(forecast, outcomes, binary, paired)
        left[r.round] = left_out_of(why)
        for q, reason in sorted(why.items()):
            reasons[q] = min(reasons.get(q, reason), reason, key=_REASONS.index)
            if reason == "scored":
                record = mine[(q, r.policy_version, r.clock)]
                tagged.append(replace(record, round=r.round))
                pairs.setdefault(r.round, []).append((q, paired[q].p_yes, record.p_yes, record.y))
    rows = {
        row.round: row
        for row in score_forecasts(
            tagged, by=("agent", "policy_version", "round"), include_overall=False, n_bootstrap=0
        )
    }
    scored = [_scored(r, left[r.round], rows.get(r.round), pairs, reference) for r in rounds]
    for q in outcomes - reasons.keys():
        reasons[q] = "not_forecast"
    counts = {reason: sum(v == reason for v in reasons.values()) for reason in _REASONS}
    coverage = Coverage(
        resolved=len(outcomes),
        against_reference=sum(v == "scored" and q in reference for q, v in reasons.items()),
        against_fallback=sum(v == "scored" and q not in reference for q, v in reasons.items()),
        not_forecast=counts["not_forecast"],
        not_binary=counts["not_binary"],
        no_reference=counts["no_reference"],
    )
    return scored, coverage


def _scored(
    r: BacktestRound,
    left_out: LeftOut,
    row: ScoreRow | None,
    pairs: dict[int, list[tuple[int, float, float, float]]],
    reference: dict[int, ForecastRecord],
) -> BacktestRound:
    """The round with its score row and its paired difference (one row a question a side)."""
    if row is None:
        return replace(r, left_out=left_out)
    before = [(q, p_ref, y) for q, p_ref, _, y in pairs[r.round]]
    after = [(q, p, y) for q, _, p, y in pairs[r.round]]
    diff = paired_bootstrap_difference(before, after, brier)
    return replace(
        r,
        n=row.n,
        against_reference=sum(q in reference for q, _, _ in before),
        against_fallback=sum(q not in reference for q, _, _ in before),
        left_out=left_out,
        rollouts=row.samples,
        parse_rate=row.parse_rate,
        brier=row.brier,
        sample_brier=row.sample_brier,
        reference_brier=brier([p for _, p, _ in before], [y for _, _, y in before]),
        difference=diff.difference,
        difference_ci=diff.ci,
    )


_REASONS = ("scored", "no_reference", "not_binary", "unresolved", "not_forecast")
"""Why a question is (not) scored, most covered first: a question scored in one round and not
in another counts as scored."""


def question_reasons(
    forecast: Collection[int],
    outcomes: Collection[int],
    binary: Collection[int],
    paired: Collection[int],
) -> dict[int, str]:
    """Each question a round forecast, with its reason (`_REASONS`): scored when it has a
    resolved outcome (`outcomes`), is binary and has a reference forecast (`paired`), however
    many of the agent's rollouts of it parsed."""
    why: dict[int, str] = {}
    for q in forecast:
        if q not in outcomes:
            why[q] = "unresolved"
        elif q not in binary:
            why[q] = "not_binary"
        elif q not in paired:
            why[q] = "no_reference"
        else:
            why[q] = "scored"
    return why


def left_out_of(why: dict[int, str]) -> LeftOut:
    """The round's questions that no score covers, counted by reason."""
    return LeftOut(
        unresolved=sum(v == "unresolved" for v in why.values()),
        not_binary=sum(v == "not_binary" for v in why.values()),
        no_reference=sum(v == "no_reference" for v in why.values()),
    )
