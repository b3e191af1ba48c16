"""Backfill rewards when outcomes arrive, and evaluate forecasts against outcomes.

Backfill is exactly once per (rollout, reward function, outcome revision): pending work is
found by what is missing, and inserts ignore what already exists. An annulled outcome voids
the question's earlier rewards (kept for audit, excluded from training and evaluation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine

from futureworld.baselines import base_rate
from futureworld.domain import OutcomeStatus, QuestionKind, Reward
from futureworld.evaluation import ForecastRecord
from futureworld.rewards import REWARD_FUNCTIONS, RewardFn, applicable_rewards
from storage.engine import session_scope
from storage.repositories.agents import list_agents
from storage.repositories.questions import latest_outcomes, list_questions, resolved_history
from storage.repositories.rewards import (
    insert_rewards,
    rollouts_pending_rewards,
    void_annulled_rewards,
)
from storage.repositories.rollouts import forecasts_of, load_trajectories


@dataclass(frozen=True)
class BackfillReport:
    rollouts_scored: int
    rewards_inserted: int
    rewards_voided: int


def backfill_rewards(engine: Engine, *, batch_size: int = 2000) -> BackfillReport:
    fns = [str(fn) for fn in RewardFn]
    scored = inserted = 0
    with session_scope(engine) as session:
        pending = rollouts_pending_rewards(session, fns)
        questions = {
            q.id: q for q in list_questions(session, ids=sorted({p.question_id for p in pending}))
        }
        outcomes = latest_outcomes(session, sorted(questions))
        for start in range(0, len(pending), batch_size):
            chunk = pending[start : start + batch_size]
            trajectories = load_trajectories(session, [p.rollout_id for p in chunk])
            rewards: list[Reward] = []
            for item, trajectory in zip(chunk, trajectories, strict=True):
                question, outcome = questions[item.question_id], outcomes[item.question_id]
                for fn in applicable_rewards(question):
                    value = REWARD_FUNCTIONS[fn](trajectory, question, outcome)
                    if value is not None:
                        rewards.append(
                            Reward(
                                rollout_id=item.rollout_id,
                                reward_fn=str(fn),
                                outcome_revision=outcome.revision,
                                value=value.value,
                                components=value.components,
                            )
                        )
            inserted += insert_rewards(session, rewards)
            scored += len(chunk)
        voided = void_annulled_rewards(session)
    return BackfillReport(scored, inserted, voided)


def forecast_records(
    engine: Engine, agent_names: Sequence[str] | None = None
) -> list[ForecastRecord]:
    """One record per parsed binary rollout whose question has a current resolved outcome.

    Rollouts with unparseable answers are left out of the metrics (their reward says it).
    """
    with session_scope(engine) as session:
        agents = [a for a in list_agents(session) if agent_names is None or a.name in agent_names]
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
                    )
                )
    return records
