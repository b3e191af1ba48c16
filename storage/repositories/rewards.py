"""Rewards: exactly once per (rollout, reward function, outcome revision); how backfill reads
what it scores and writes what it scored.

Decisions:
- Backfill reads a rollout's answer (every column but those in `NOT_READ`: token arrays,
  sampling, timings, times), never its turns: the reward functions score the answer.
- Rewards go in by COPY on Postgres when none of them exists yet (the common case: the queue
  names only unscored work); when one does, or a concurrent backfill races us to it, they go
  in by INSERT … ON CONFLICT DO NOTHING instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from types import SimpleNamespace
from typing import Any, cast

from psycopg.errors import UniqueViolation
from sqlalchemy import Text, select
from sqlalchemy import cast as cast_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from futureworld.domain import Outcome, Reward, Trajectory
from storage.repositories._sql import among, copy_rows, dialect, insert_new
from storage.repositories.questions import current_outcomes, outcome_from_row
from storage.repositories.rollouts import trajectory_from_row
from storage.tables import OutcomeRow, RewardRow, RolloutRow

NOT_READ: dict[str, Any] = {
    "prompt_token_ids": b"",
    "completion_token_ids": b"",
    "loss_mask": b"",
    "behaviour_logprobs": b"",
    "idempotency_key": "",
    "group_id": "",
    "n_completion_tokens": 0,
    "sampling": {},
    "timings": {},
    "as_of": None,
    "created_at": None,
}
"""Rollout columns `rollout_answers` does not load, with the value it stands in for each: the
trajectory itself and the circumstances of its sampling, which no reward reads."""
_JSON_LISTS = ("quantiles", "probabilities")
"""Answer columns read as JSON text and decoded here only when not empty: a binary
question's rollouts hold [] in both, and decoding every one cost more than scoring it."""
_ANSWER_SELECT = [
    cast_(c, Text).label(c.name) if c.name in _JSON_LISTS else c
    for c in RolloutRow.__table__.columns
    if c.name not in NOT_READ
]

_REWARD_COLUMNS = (
    "rollout_id",
    "reward_fn",
    "outcome_revision",
    "value",
    "components",
    "voided",
    "provisional",
    "created_at",
    "made_at",
)


def rollout_answers(session: Session, rollout_ids: Sequence[int]) -> dict[int, Trajectory]:
    """rollout id → the rollout as a Trajectory without what no reward reads (`NOT_READ`:
    tokens, turns, sampling, timings, times), built by the same `trajectory_from_row` as a
    full load, so a new answer column is loaded here too."""
    if not rollout_ids:
        return {}
    rows = (
        session.connection()
        .execute(select(*_ANSWER_SELECT).where(among(session, RolloutRow.id, rollout_ids)))
        .mappings()
    )
    answers = {}
    for row in rows:
        values = dict(row)
        for name in _JSON_LISTS:
            text = values[name]
            values[name] = () if text in (None, "", "[]") else json.loads(text)
        answers[row["id"]] = trajectory_from_row(
            cast(RolloutRow, SimpleNamespace(**values, **NOT_READ))
        )
    return answers


def outcome_revisions(
    session: Session, keys: Iterable[tuple[int, int]]
) -> dict[tuple[int, int], Outcome]:
    """(question id, revision) → that outcome revision, for the keys that exist."""
    wanted = set(keys)
    if not wanted:
        return {}
    statement = select(*OutcomeRow.__table__.columns).where(
        among(session, OutcomeRow.question_id, sorted({q for q, _ in wanted}))
    )
    rows = session.connection().execute(statement).mappings()
    found = (outcome_from_row(cast(OutcomeRow, SimpleNamespace(**row))) for row in rows)
    return {(o.question_id, o.revision): o for o in found if (o.question_id, o.revision) in wanted}


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
        "made_at": reward.made_at,
    }


def insert_rewards(session: Session, rewards: Sequence[Reward]) -> int:
    """Insert rewards; one that already exists for (rollout, fn, revision) is left alone.
    Returns how many were inserted."""
    if not rewards:
        return 0
    if dialect(session) == "postgresql":
        try:
            with session.begin_nested():
                return _copy_rewards(session, rewards)
        except (IntegrityError, UniqueViolation):
            pass  # some exist already: the savepoint is rolled back, upsert them instead
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


def _copy_rewards(session: Session, rewards: Sequence[Reward]) -> int:
    return copy_rows(
        session, RewardRow.__table__, _REWARD_COLUMNS, [_reward_values(r) for r in rewards]
    )


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
            made_at=row.made_at,
        )
        for row in session.scalars(statement)
    }
