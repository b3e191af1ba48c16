"""Backfill rewards when outcomes arrive.

Backfill is exactly once per (rollout, reward function, outcome revision): pending work is
found by what is missing, and inserts ignore what already exists. An annulled outcome voids
the question's earlier rewards (kept for audit, excluded from training and evaluation).
"""

from __future__ import annotations

from dataclasses import dataclass

from flows.context import PipelineContext
from futureworld.domain import Reward
from futureworld.rewards import REWARD_FUNCTIONS, RewardFn, applicable_rewards
from storage.engine import session_scope
from storage.repositories.questions import latest_outcomes, list_questions
from storage.repositories.rewards import (
    insert_rewards,
    rollouts_pending_rewards,
    void_annulled_rewards,
)
from storage.repositories.rollouts import load_trajectories


@dataclass(frozen=True)
class BackfillReport:
    rollouts_scored: int
    rewards_inserted: int
    rewards_voided: int


def backfill_rewards(ctx: PipelineContext, *, batch_size: int = 2000) -> BackfillReport:
    """Score every rollout whose question has a new outcome revision, with every reward
    function that applies to its kind; void the rewards of annulled questions."""
    engine = ctx.engine
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
