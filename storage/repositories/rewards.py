"""Rewards: exactly once per (rollout, reward function, outcome revision); annulments void."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from futureworld.domain import OutcomeStatus, Reward
from storage.repositories._sql import insert_new
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


def _reward_values(reward: Reward) -> dict[str, Any]:
    return {
        "rollout_id": reward.rollout_id,
        "reward_fn": reward.reward_fn,
        "outcome_revision": reward.outcome_revision,
        "value": reward.value,
        "components": reward.components,
        "voided": reward.voided,
        "provisional": reward.provisional,
        "created_at": reward.created_at,
    }


def insert_rewards(session: Session, rewards: Sequence[Reward]) -> int:
    """Insert rewards; one that already exists for (rollout, fn, revision) is left alone."""
    inserted = insert_new(
        session,
        RewardRow,
        rewards,
        _reward_values,
        chunk_size=1000,
        returning=[RewardRow.id],
        conflict_columns=["rollout_id", "reward_fn", "outcome_revision"],
    )
    return len(inserted)


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
