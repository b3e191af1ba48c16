"""Evaluate: every resolved binary forecast with its outcome and reference forecasts (the
crowd's, the base rate's), and the score rows of futureworld.evaluation over them.

Rollouts with unparseable answers are left out of the metrics (their reward says it);
annulled questions and questions still open are left out too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flows.context import PipelineContext
from futureworld.baselines import base_rate
from futureworld.domain import OutcomeStatus, QuestionKind
from futureworld.evaluation import ForecastRecord, ScoreRow, score_forecasts
from storage.engine import session_scope
from storage.repositories.agents import list_agents
from storage.repositories.questions import latest_outcomes, list_questions, resolved_history
from storage.repositories.rollouts import forecasts_of


@dataclass(frozen=True)
class Evaluation:
    records: list[ForecastRecord]
    rows: list[ScoreRow]


def forecast_records(
    ctx: PipelineContext, agent_names: Sequence[str] | None = None
) -> list[ForecastRecord]:
    """One record per parsed binary rollout whose question has a current resolved outcome,
    oldest first per agent; each carries the instant it was forecast at (`as_of`)."""
    wanted = None if not agent_names else set(agent_names)
    with session_scope(ctx.engine) as session:
        agents = [a for a in list_agents(session) if wanted is None or a.name in wanted]
        questions = {q.id: q for q in list_questions(session) if q.kind is QuestionKind.BINARY}
        outcomes = latest_outcomes(session)
        history = resolved_history(session)
        records: list[ForecastRecord] = []
        for agent in agents:
            for forecast in forecasts_of(session, agent.id):
                question = questions.get(forecast.question_id)
                outcome = outcomes.get(forecast.question_id)
                if question is None or outcome is None or forecast.p_yes is None:
                    continue
                if outcome.status is not OutcomeStatus.RESOLVED:
                    continue
                records.append(
                    ForecastRecord(
                        agent=agent.name,
                        policy_version=forecast.policy_version,
                        source=question.source,
                        domain=question.domain,
                        p_yes=forecast.p_yes,
                        y=float(outcome.value),
                        crowd_p=question.crowd_probability,
                        base_rate_p=base_rate(question, history),
                        as_of=forecast.as_of,
                    )
                )
    return records


def evaluate(ctx: PipelineContext, agent_names: Sequence[str] | None = None) -> Evaluation:
    """Score every agent and policy version side by side, per source and overall."""
    records = forecast_records(ctx, agent_names)
    return Evaluation(records=records, rows=score_forecasts(records))
