"""Backtest: the daily cycle replayed over imported history with a simulated clock, as a
warm start before going live and as a measurement of an agent against the crowd.

Each simulated day at 00:00 UTC (the clock T), through the same stages as live operation:
backfill the rewards of outcomes revealed by T (resolved_at <= T), train the agent on the
groups whose outcomes are revealed by T (every `train_every` days, agents with a trainable
policy), then forecast every question open at T (storage.repositories.questions: posed by T,
not closed, no outcome revealed) with the agent and the reference (the crowd). Search runs as
of each question's cut-off, which is never after T. Nothing revealed after T reaches a
forecast or an update: openness, backfill and replay all read the clock.

Decisions: harvesting and resolving are not replayed (the history is already imported; the
clock reveals its outcomes). Rounds are scored at the end against the outcomes revealed by the
last clock, pairing each round's agent forecasts with the reference's forecasts of the same
questions (futureworld.scoring.paired_bootstrap_difference, resampling questions); a round
whose questions have not resolved yet has no score. Re-running a backtest over the same days
is idempotent (each stage is): questions already forecast by the current version are skipped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

from flows.context import PipelineContext
from flows.stages.backfilling import backfill_rewards
from flows.stages.predicting import predict
from flows.stages.training import TrainOptions, replay_and_train
from futureworld.domain import OutcomeStatus, QuestionKind
from futureworld.evaluation import plot_metric_by_round
from futureworld.scoring import brier, paired_bootstrap_difference
from storage.engine import session_scope
from storage.repositories.questions import latest_outcomes, list_questions
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
    train: TrainOptions = field(default_factory=TrainOptions)

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
    """Questions of this round scored (resolved by the last clock) with a reference forecast."""
    brier: float | None = None
    reference_brier: float | None = None
    difference: float | None = None
    """brier − reference_brier (negative: the agent beat the reference)."""
    difference_ci: tuple[float, float] | None = None


@dataclass(frozen=True)
class BacktestReport:
    agent: str
    reference: str
    rounds: list[BacktestRound]
    out_dir: Path | None


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
    assert agent.id is not None
    rounds: list[BacktestRound] = []
    made: dict[int, set[int]] = {}
    for index, clock in enumerate(options.clocks()):
        day = ctx.at(clock)
        backfilled = backfill_rewards(day)
        trained = None
        trains = options.train_every > 0 and index % options.train_every == 0
        if trains and agent.backend.generates:
            trained = replay_and_train(day, agent.name, options.train)
        before = _rollout_ids(ctx, agent.id)
        report = predict(day, agent.name, samples=options.samples, limit=options.limit)
        if options.reference != agent.name:
            predict(day, options.reference, samples=1)
        made[index] = _rollout_ids(ctx, agent.id) - before
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
    rounds = _score_rounds(ctx, options, rounds, made, last)
    if out_dir is not None:
        write_backtest_report(out_dir, options, rounds)
    return BacktestReport(agent.name, options.reference, rounds, out_dir)


def _rollout_ids(ctx: PipelineContext, agent_id: int) -> set[int]:
    with session_scope(ctx.engine) as session:
        return {f.rollout_id for f in forecasts_of(session, agent_id)}


def _score_rounds(
    ctx: PipelineContext,
    options: BacktestOptions,
    rounds: list[BacktestRound],
    made: dict[int, set[int]],
    last: datetime,
) -> list[BacktestRound]:
    """Each round's binary agent forecasts against the reference's of the same questions,
    with the outcomes revealed by the last clock."""
    agent, reference_agent = ctx.agent(options.agent), ctx.agent(options.reference)
    with session_scope(ctx.engine) as session:
        outcomes = {
            qid: float(o.value)
            for qid, o in latest_outcomes(session, as_of=last).items()
            if o.status is OutcomeStatus.RESOLVED and o.value is not None
        }
        binary = {
            q.id
            for q in list_questions(session, ids=sorted(outcomes))
            if q.kind is QuestionKind.BINARY
        }
        reference = {
            f.question_id: f.p_yes
            for f in forecasts_of(session, reference_agent.id)
            if f.p_yes is not None and f.question_id in binary
        }
        mine = [
            (f.rollout_id, f.question_id, f.p_yes)
            for f in forecasts_of(session, agent.id)
            if f.p_yes is not None and f.question_id in reference
        ]
    scored = []
    for r in rounds:
        after = [(q, p, outcomes[q]) for rid, q, p in mine if rid in made[r.round]]
        questions = sorted({q for q, _, _ in after})
        before = [(q, reference[q], outcomes[q]) for q in questions]
        if not after:
            scored.append(r)
            continue
        diff = paired_bootstrap_difference(before, after, brier)
        scored.append(
            replace(
                r,
                n=len(questions),
                brier=_brier_of(after),
                reference_brier=_brier_of(before),
                difference=diff.difference,
                difference_ci=diff.ci,
            )
        )
    return scored


def _brier_of(rows: list[tuple[int, float, float]]) -> float:
    return math.fsum((p - y) ** 2 for _, p, y in rows) / len(rows)


def write_backtest_report(
    out_dir: Path, options: BacktestOptions, rounds: list[BacktestRound]
) -> Path:
    """metrics.json, report.md and the Brier-by-round plot, in the demo's report format."""
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = {
        "agent": options.agent,
        "reference": options.reference,
        "start": options.start.isoformat(),
        "end": options.end.isoformat(),
        "step_days": options.step_days,
        "train_every": options.train_every,
        "samples": options.samples,
        "limit": options.limit,
        "rounds": [
            {**asdict(r), "clock": r.clock.isoformat(), "difference_ci": r.difference_ci}
            for r in rounds
        ],
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    scored = [r for r in rounds if r.brier is not None]
    series = {
        options.agent: [(r.round, r.brier) for r in scored],
        options.reference: [(r.round, r.reference_brier) for r in scored],
    }
    plot_metric_by_round(
        series, out_dir / "brier_by_round.png", metric="Brier", title="Brier by round (paired)"
    )
    lines = [
        f"# Backtest: {options.agent} against {options.reference}",
        "",
        f"{options.start} to {options.end}, every {options.step_days} day(s); training every "
        f"{options.train_every} cycle(s); G = {options.samples}; limit {options.limit}.",
        "Each round's forecasts are paired with the reference's on the same questions "
        "(outcomes revealed by the last clock); the interval is the 95% paired bootstrap of "
        "the difference.",
        "",
        "| round | clock | version | forecasts | trained to | n | Brier | reference | "
        "difference | 95% CI |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rounds:
        ci = (
            "—"
            if r.difference_ci is None
            else f"[{r.difference_ci[0]:+.4f}, {r.difference_ci[1]:+.4f}]"
        )
        lines.append(
            f"| {r.round} | {r.clock.date()} | {r.policy_version} | {r.forecasts} | "
            f"{'—' if r.trained_to is None else r.trained_to} | {r.n} | {_f(r.brier)} | "
            f"{_f(r.reference_brier)} | {_f(r.difference, signed=True)} | {ci} |"
        )
    lines += ["", "![Brier by round](brier_by_round.png)", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return out_dir


def _f(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.4f}" if signed else f"{value:.4f}"
