"""Evaluate: every resolved forecast with its outcome and reference forecasts, scored per
question kind: binary rows (futureworld.evaluation: Brier, log score, ECE, skill vs the crowd
and the base rate) and choice and numeric rows (futureworld.evaluation_kinds).

A binary rollout whose answer did not parse counts as IMPUTED_P in its question's forecast,
as ForecastBench imputes a missing forecast, and ForecastBench's 5% rule flags a forecaster with
too many (baselines exempt); choice and numeric rollouts that did not parse are left out (their
reward says it). Annulled questions and questions still open are left out. Forecasts of
imported ForecastBench questions also get ForecastBench's leaderboard (futureworld.leaderboard:
difficulty-adjusted Brier over every forecaster present, the Brier Index; its 5% rule also counts
the forecasts of market questions still open, as ForecastBench's does). Choice and numeric
answers are read without token arrays (storage's rollout_answers); a choice rollout is scored
from its stored probability vector (Trajectory.probabilities).

As of an instant (`as_of`, a backtest's clock): only forecasts made by then and outcomes
revealed by then (resolved_at <= as_of, the definition in storage.repositories.questions)
count, so a past day's evaluation is what that day could have known.

With a round (a ForecastBench round's forecast due date) only the forecasts of that round's
questions count (storage.repositories.questions.round_question_ids), in every table and in
the leaderboard, so a database holding several rounds scores one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime

from flows.context import PipelineContext
from futureworld.baselines import base_rate
from futureworld.domain import (
    Agent,
    BackendKind,
    Outcome,
    OutcomeStatus,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)
from futureworld.evaluation import ForecastRecord, ScoreRow, question_forecast, score_forecasts
from futureworld.evaluation_kinds import (
    ChoiceForecastRecord,
    ChoiceScoreRow,
    NumericForecastRecord,
    NumericScoreRow,
    choice_record,
    numeric_record,
    score_choice_forecasts,
    score_numeric_forecasts,
)
from futureworld.imputation import forecastbench_kind
from futureworld.leaderboard import ForecastBenchLeaderboard, OpenMarkets, forecastbench_leaderboard
from storage.engine import session_scope
from storage.repositories.agents import list_agents
from storage.repositories.questions import (
    latest_outcomes,
    list_questions,
    resolved_history,
    round_question_ids,
)
from storage.repositories.rewards import rollout_answers
from storage.repositories.rollouts import forecast_groups, forecasts_of


@dataclass(frozen=True)
class Evaluation:
    records: list[ForecastRecord]
    """Binary forecasts."""
    rows: list[ScoreRow]
    """Binary score rows."""
    choice_records: list[ChoiceForecastRecord] = field(default_factory=list)
    choice_rows: list[ChoiceScoreRow] = field(default_factory=list)
    numeric_records: list[NumericForecastRecord] = field(default_factory=list)
    numeric_rows: list[NumericScoreRow] = field(default_factory=list)
    forecastbench: ForecastBenchLeaderboard | None = None
    """ForecastBench's leaderboard of the binary forecasts of imported ForecastBench questions
    (empty rows when there are none)."""


def _made_by(forecast_as_of: datetime | None, as_of: datetime) -> bool:
    return forecast_as_of is not None and forecast_as_of <= as_of


def forecast_records(
    ctx: PipelineContext, agent_names: Sequence[str] | None = None, *, round: date | None = None
) -> list[ForecastRecord]:
    """One record per forecast (an agent version's group of rollouts of a question at one
    forecast time) made by `ctx.as_of` of a binary question with a current resolved outcome
    revealed by then, oldest first per agent: p_yes is the mean of the group's rollouts, an
    unparsed one counted as IMPUTED_P (`question_forecast`); each carries its `as_of` and its
    outcome's `resolved_at`. With `round`, only that round's questions."""
    as_of = ctx.as_of
    wanted = None if not agent_names else set(agent_names)
    with session_scope(ctx.engine) as session:
        agents = [a for a in list_agents(session) if wanted is None or a.name in wanted]
        scope = None if round is None else round_question_ids(session, round)
        questions = {
            q.id: q
            for q in list_questions(session)
            if q.kind is QuestionKind.BINARY and (scope is None or q.id in scope)
        }
        outcomes = latest_outcomes(session, as_of=as_of)
        history = resolved_history(session, as_of=as_of)
        records: list[ForecastRecord] = []
        for agent in agents:
            for group in forecast_groups(session, agent.id):
                outcome = outcomes.get(group.question_id)
                if not _made_by(group.as_of, as_of) or group.question_id not in questions:
                    continue
                if outcome is None or outcome.status is not OutcomeStatus.RESOLVED:
                    continue
                question = questions[group.question_id]
                p_yes, sample_p, imputed = question_forecast(group.answers)
                records.append(
                    ForecastRecord(
                        agent=agent.name,
                        policy_version=group.policy_version,
                        source=question.source,
                        domain=question.domain,
                        p_yes=p_yes,
                        y=float(outcome.value),
                        crowd_p=question.crowd_probability,
                        base_rate_p=base_rate(question, history),
                        as_of=group.as_of,
                        sample_p=sample_p if len(sample_p) > 1 else (),
                        imputed=imputed,
                        question=question.external_id,
                        resolved_at=outcome.resolved_at,
                    )
                )
    return records


def open_market_forecasts(
    ctx: PipelineContext, agent_names: Sequence[str] | None = None, *, round: date | None = None
) -> OpenMarkets:
    """Every imported ForecastBench market question without an outcome revealed by `ctx.as_of`
    (still open), with the imputed share of each agent version's forecast of it made by then
    (its latest): what ForecastBench's 5% rule counts besides the scored forecasts."""
    as_of = ctx.as_of
    wanted = None if not agent_names else set(agent_names)
    with session_scope(ctx.engine) as session:
        scope = None if round is None else round_question_ids(session, round)
        outcomes = latest_outcomes(session, as_of=as_of)
        questions = {
            q.id: q
            for q in list_questions(session)
            if forecastbench_kind(q.source) == "market"
            and q.id not in outcomes
            and (scope is None or q.id in scope)
        }
        shares: dict[tuple[str, str], dict[tuple[str, int | None], float]] = {
            (q.source, q.external_id): {} for q in questions.values()
        }
        for agent in list_agents(session):
            if wanted is not None and agent.name not in wanted:
                continue
            for group in forecast_groups(session, agent.id):
                question = questions.get(group.question_id)
                if question is not None and _made_by(group.as_of, as_of):
                    _, filled, imputed = question_forecast(group.answers)
                    key = (agent.name, group.policy_version)
                    shares[(question.source, question.external_id)][key] = imputed / len(filled)
    return shares


def baseline_agents(ctx: PipelineContext) -> set[str]:
    """Names of the baseline agents: the reference forecasters the 5% rule exempts."""
    with session_scope(ctx.engine) as session:
        return {a.name for a in list_agents(session) if a.backend is BackendKind.BASELINE}


def kind_records(
    ctx: PipelineContext, agent_names: Sequence[str] | None = None, *, round: date | None = None
) -> tuple[list[ChoiceForecastRecord], list[NumericForecastRecord]]:
    """One record per parsed choice or numeric rollout made by `ctx.as_of` whose question has
    a current resolved outcome revealed by then, oldest first per agent (numeric ones on their
    question's unit axis). With `round`, only that round's questions."""
    as_of = ctx.as_of
    wanted = None if not agent_names else set(agent_names)
    choice: list[ChoiceForecastRecord] = []
    numeric: list[NumericForecastRecord] = []
    with session_scope(ctx.engine) as session:
        scope = None if round is None else round_question_ids(session, round)
        questions = {
            q.id: q
            for q in list_questions(session)
            if q.kind is not QuestionKind.BINARY and (scope is None or q.id in scope)
        }
        outcomes = {
            qid: o
            for qid, o in latest_outcomes(session, as_of=as_of).items()
            if qid in questions and o.status is OutcomeStatus.RESOLVED
        }
        for agent in list_agents(session):
            if wanted is not None and agent.name not in wanted:
                continue
            ids = [
                f.rollout_id
                for f in forecasts_of(session, agent.id)
                if f.question_id in outcomes and _made_by(f.as_of, as_of)
            ]
            answers = rollout_answers(session, ids)
            for rollout_id in ids:
                answer = answers[rollout_id]
                question = questions[answer.question_id]
                record = _kind_record(agent, question, outcomes[answer.question_id], answer)
                if isinstance(record, ChoiceForecastRecord):
                    choice.append(record)
                elif record is not None:
                    numeric.append(record)
    return choice, numeric


def _kind_record(
    agent: Agent, question: Question, outcome: Outcome, answer: Trajectory
) -> ChoiceForecastRecord | NumericForecastRecord | None:
    if answer.parse_status is not ParseStatus.OK or outcome.value is None:
        return None
    common = {"agent": agent.name, "policy_version": answer.policy_version, "as_of": answer.as_of}
    if question.kind is QuestionKind.CHOICE:
        if not answer.probabilities:
            return None
        return choice_record(question, answer.probabilities, outcome.value, **common)
    if not answer.quantiles:
        return None
    return numeric_record(question, answer.quantiles, outcome.value, **common)


def evaluate(
    ctx: PipelineContext, agent_names: Sequence[str] | None = None, *, round: date | None = None
) -> Evaluation:
    """Score every agent and policy version side by side, per source and overall, with one
    table per question kind and ForecastBench's leaderboard, as `ctx.as_of` could have known.
    The scored set of the 5% rule and of the difficulty model is every forecaster evaluated
    together (all agents unless `agent_names` narrows them); with `round`, of that ForecastBench
    round's questions only (UnknownRound when none is stored)."""
    records = forecast_records(ctx, agent_names, round=round)
    choice, numeric = kind_records(ctx, agent_names, round=round)
    baselines = baseline_agents(ctx)
    return Evaluation(
        records=records,
        rows=score_forecasts(records, reference_agents=baselines),
        forecastbench=forecastbench_leaderboard(
            records,
            reference_agents=baselines,
            open_markets=open_market_forecasts(ctx, agent_names, round=round),
        ),
        choice_records=choice,
        choice_rows=score_choice_forecasts(choice),
        numeric_records=numeric,
        numeric_rows=score_numeric_forecasts(numeric),
    )
