"""Rewards: exactly once per (rollout, reward function, outcome revision); annulments void."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from futureworld.domain import OutcomeStatus, Reward
from storage.repositories._sql import insert
from storage.repositories.questions import current_outcomes
from storage.tables import RewardRow, RolloutRow


@dataclass(frozen=True)
class PendingScore:
    rollout_id: int
    question_id: int
    outcome_revision: int


def rollouts_pending_rewards(session: Session, reward_fns: Sequence[str]) -> list[PendingScore]:
    """Rollouts whose question's current outcome is resolved and which lack a reward of one of
    `reward_fns` for that revision."""
    current = current_outcomes()
    have = (
        select(func.count())
        .select_from(RewardRow)
        .where(
            RewardRow.rollout_id == RolloutRow.id,
            RewardRow.outcome_revision == current.c.revision,
            RewardRow.reward_fn.in_(list(reward_fns)),
        )
        .scalar_subquery()
    )
    statement = (
        select(RolloutRow.id, RolloutRow.question_id, current.c.revision)
        .join(current, current.c.question_id == RolloutRow.question_id)
        .where(current.c.status == str(OutcomeStatus.RESOLVED))
        .where(have < len(reward_fns))
        .order_by(RolloutRow.id)
    )
    return [PendingScore(r, q, rev) for r, q, rev in session.execute(statement).all()]


def insert_rewards(session: Session, rewards: Sequence[Reward]) -> int:
    """Insert rewards; one that already exists for (rollout, fn, revision) is left alone."""
    inserted = 0
    for start in range(0, len(rewards), 1000):
        chunk = rewards[start : start + 1000]
        statement = (
            insert(session, RewardRow)
            .values(
                [
                    {
                        "rollout_id": r.rollout_id,
                        "reward_fn": r.reward_fn,
                        "outcome_revision": r.outcome_revision,
                        "value": r.value,
                        "components": r.components,
                        "voided": r.voided,
                        "provisional": r.provisional,
                        "created_at": r.created_at,
                    }
                    for r in chunk
                ]
            )
            .on_conflict_do_nothing(index_elements=["rollout_id", "reward_fn", "outcome_revision"])
            .returning(RewardRow.id)
        )
        inserted += len(session.execute(statement).all())
    return inserted


def void_annulled_rewards(session: Session) -> int:
    """Mark every unvoided reward of a question whose current outcome is annulled as voided."""
    current = current_outcomes()
    annulled = select(current.c.question_id).where(current.c.status == str(OutcomeStatus.ANNULLED))
    rollouts = select(RolloutRow.id).where(RolloutRow.question_id.in_(annulled))
    result = session.execute(
        update(RewardRow)
        .where(RewardRow.rollout_id.in_(rollouts), RewardRow.voided.is_(False))
        .values(voided=True)
    )
    return int(result.rowcount or 0)


def current_rewards(
    session: Session, reward_fn: str, *, agent_id: int | None = None
) -> dict[int, Reward]:
    """rollout id → its reward of `reward_fn` for the question's current outcome revision,
    excluding voided and provisional ones."""
    current = current_outcomes()
    statement = (
        select(RewardRow)
        .join(RolloutRow, RolloutRow.id == RewardRow.rollout_id)
        .join(
            current,
            (current.c.question_id == RolloutRow.question_id)
            & (current.c.revision == RewardRow.outcome_revision),
        )
        .where(
            RewardRow.reward_fn == reward_fn,
            RewardRow.voided.is_(False),
            RewardRow.provisional.is_(False),
        )
    )
    if agent_id is not None:
        statement = statement.where(RolloutRow.agent_id == agent_id)
    return {
        row.rollout_id: Reward(
            id=row.id,
            rollout_id=row.rollout_id,
            reward_fn=row.reward_fn,
            outcome_revision=row.outcome_revision,
            value=row.value,
            components=dict(row.components or {}),
            voided=row.voided,
            provisional=row.provisional,
            created_at=row.created_at,
        )
        for row in session.scalars(statement)
    }
