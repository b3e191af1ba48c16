"""Rewards: exactly once per (rollout, reward function, outcome revision); annulments void.

What backfill has left to do is read from `backfill_queue` (kept by the triggers of migration
0003: a row per stored rollout and per rollout of a question given a new outcome revision), so
finding the work costs what arrived since the last run, never the resolved history.

Decisions:
- A queued rollout is pending when its question's current outcome is resolved and one of the
  reward functions that apply to the question's kind has no reward at that revision. The
  caller says which functions apply to which kind (storage does not know the registry).
- Queue rows are settled (deleted) only for rollouts that then have every applicable reward
  at the current revision, or whose current outcome is annulled once their rewards are voided.
  A revision that arrives meanwhile queues new rows, which stay; a rollout whose scoring
  failed stays queued and is retried on the next run.
- Backfill reads a rollout's answer (every column but those in `NOT_READ`: token arrays,
  sampling, timings, times), never its turns: the reward functions score the answer.
- Rewards go in by COPY on Postgres when none of them exists yet (the common case: the queue
  names only unscored work); when one does, or a concurrent backfill races us to it, they go
  in by INSERT … ON CONFLICT DO NOTHING instead.
- As of an instant (a backtest's clock), only outcome revisions revealed by then (resolved_at
  <= the clock) are current: a queued rollout whose outcome resolves later stays queued.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import SimpleNamespace
from typing import Any, cast

from psycopg.errors import UniqueViolation
from sqlalchemy import (
    ColumnElement,
    Integer,
    Text,
    any_,
    bindparam,
    case,
    delete,
    exists,
    false,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy import cast as cast_
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from futureworld.domain import (
    Outcome,
    OutcomeStatus,
    QuestionKind,
    Reward,
    Trajectory,
)
from storage.repositories._sql import dialect, insert_new
from storage.repositories.questions import current_outcomes, outcome_from_row
from storage.repositories.rollouts import trajectory_from_row
from storage.tables import BackfillQueueRow, OutcomeRow, QuestionRow, RewardRow, RolloutRow

ApplicableRewards = Mapping[QuestionKind, Sequence[str]]
"""Question kind → the names of the reward functions that score it."""

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
)


@dataclass(frozen=True)
class PendingScore:
    rollout_id: int
    question_id: int
    outcome_revision: int


def _is_current(
    outcome: type[OutcomeRow] | Any, as_of: datetime | None = None
) -> ColumnElement[bool]:
    """`outcome` is its question's highest revision, revealed by `as_of` when given (an index
    probe per row, where the `current_outcomes` subquery would aggregate the outcome table)."""
    later = aliased(OutcomeRow)
    newer = exists().where(
        later.question_id == outcome.question_id, later.revision > outcome.revision
    )
    if as_of is None:
        return ~newer
    return (outcome.resolved_at <= as_of) & ~newer.where(later.resolved_at <= as_of)


def _missing_reward(
    applicable: ApplicableRewards, rollout_id: Any, revision: Any
) -> ColumnElement[bool]:
    """Some reward function that applies to the question's kind has no reward for
    (rollout, revision). Needs QuestionRow in the FROM clause.

    Written as a correlated count (an index probe per candidate rollout) compared with the
    number of functions of the kind: NOT EXISTS under an OR lets Postgres hash the whole
    reward table instead."""
    pairs = [(str(kind), fn) for kind, fns in applicable.items() for fn in fns]
    if not pairs:
        return false()
    have = (
        select(func.count())
        .select_from(RewardRow)
        .where(
            RewardRow.rollout_id == rollout_id,
            RewardRow.outcome_revision == revision,
            tuple_(QuestionRow.kind, RewardRow.reward_fn).in_(pairs),
        )
        .scalar_subquery()
    )
    wanted = case(
        {str(kind): len(fns) for kind, fns in applicable.items()},
        value=QuestionRow.kind,
        else_=0,
    )
    return have < wanted


def rollouts_pending_rewards(
    session: Session, applicable: ApplicableRewards, *, as_of: datetime | None = None
) -> list[PendingScore]:
    """Queued rollouts of the kinds in `applicable` whose question's current outcome (as of
    `as_of` when given) is resolved (at a revision no older than the queued one) and which
    lack a reward of a function in `applicable[question kind]` for that revision, by rollout
    id."""
    queue, outcome = BackfillQueueRow, OutcomeRow
    statement = (
        select(queue.rollout_id, queue.question_id, outcome.revision)
        .join(
            outcome,
            (outcome.question_id == queue.question_id)
            & (outcome.revision >= queue.outcome_revision),
        )
        .join(QuestionRow, QuestionRow.id == queue.question_id)
        .where(
            QuestionRow.kind.in_([str(kind) for kind in applicable]),
            outcome.status == str(OutcomeStatus.RESOLVED),
            _is_current(outcome, as_of),
            _missing_reward(applicable, queue.rollout_id, outcome.revision),
        )
        .order_by(queue.rollout_id)
    )
    rows = session.connection().execute(statement).all()
    return [PendingScore(r, q, rev) for r, q, rev in rows]


def rollouts_missing_rewards(session: Session, applicable: ApplicableRewards) -> list[PendingScore]:
    """The definition the queue keeps cheap: every rollout (queued or not) whose question's
    current outcome is resolved and which lacks an applicable reward for that revision. It
    reads the whole history; checks and repairs use it, backfill does not."""
    current = current_outcomes()
    statement = (
        select(RolloutRow.id, RolloutRow.question_id, current.c.revision)
        .join(current, current.c.question_id == RolloutRow.question_id)
        .join(QuestionRow, QuestionRow.id == RolloutRow.question_id)
        .where(
            current.c.status == str(OutcomeStatus.RESOLVED),
            _missing_reward(applicable, RolloutRow.id, current.c.revision),
        )
        .order_by(RolloutRow.id)
    )
    rows = session.connection().execute(statement).all()
    return [PendingScore(r, q, rev) for r, q, rev in rows]


def queue_rollouts(session: Session, pending: Iterable[PendingScore]) -> int:
    """Queue rollouts for backfill (e.g. what `rollouts_missing_rewards` found after a new
    reward function was registered); already queued ones are left alone."""
    rows = [
        {
            "rollout_id": p.rollout_id,
            "outcome_revision": p.outcome_revision,
            "question_id": p.question_id,
        }
        for p in pending
    ]
    inserted = insert_new(
        session,
        BackfillQueueRow,
        rows,
        lambda row: row,
        chunk_size=2000,
        returning=[BackfillQueueRow.rollout_id],
    )
    return len(inserted)


def rollout_answers(session: Session, rollout_ids: Sequence[int]) -> dict[int, Trajectory]:
    """rollout id → the rollout as a Trajectory without what no reward reads (`NOT_READ`:
    tokens, turns, sampling, timings, times), built by the same `trajectory_from_row` as a
    full load, so a new answer column is loaded here too."""
    if not rollout_ids:
        return {}
    rows = (
        session.connection()
        .execute(select(*_ANSWER_SELECT).where(_among(session, RolloutRow.id, rollout_ids)))
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
        _among(session, OutcomeRow.question_id, sorted({q for q, _ in wanted}))
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
    raw = session.connection().connection.driver_connection
    columns = ", ".join(f'"{c}"' for c in _REWARD_COLUMNS)
    with raw.cursor() as cursor:
        with cursor.copy(f"COPY reward ({columns}) FROM STDIN") as copy:
            for r in rewards:
                copy.write_row(
                    (
                        r.rollout_id,
                        r.reward_fn,
                        r.outcome_revision,
                        r.value,
                        json.dumps(r.components),
                        r.voided,
                        r.provisional,
                        r.created_at,
                    )
                )
        return cursor.rowcount


def settle_backfill_queue(session: Session, scored: Iterable[PendingScore]) -> int:
    """Dequeue rollouts just given every applicable reward at `outcome_revision`: a rollout
    queued meanwhile at a newer revision stays. Returns the rollouts dequeued."""
    by_revision: dict[int, list[int]] = {}
    for item in scored:
        by_revision.setdefault(item.outcome_revision, []).append(item.rollout_id)
    dequeued = 0
    for revision, ids in by_revision.items():
        for chunk in _chunks(ids):
            result = session.connection().execute(
                delete(BackfillQueueRow).where(
                    _among(session, BackfillQueueRow.rollout_id, chunk),
                    BackfillQueueRow.outcome_revision <= revision,
                )
            )
            dequeued += int(result.rowcount or 0)
    return dequeued


def void_annulled_rewards(session: Session, *, as_of: datetime | None = None) -> int:
    """Void every unvoided reward of the queued rollouts whose question's current outcome (as
    of `as_of` when given) is annulled, and dequeue them. Returns the rewards voided."""
    queue, outcome = BackfillQueueRow, OutcomeRow
    annulled = [
        PendingScore(r, q, rev)
        for r, q, rev in session.connection().execute(
            select(queue.rollout_id, queue.question_id, outcome.revision)
            .join(
                outcome,
                (outcome.question_id == queue.question_id)
                & (outcome.revision >= queue.outcome_revision),
            )
            .where(outcome.status == str(OutcomeStatus.ANNULLED), _is_current(outcome, as_of))
        )
    ]
    voided = 0
    for chunk in _chunks([a.rollout_id for a in annulled]):
        result = session.connection().execute(
            update(RewardRow)
            .where(_among(session, RewardRow.rollout_id, chunk), RewardRow.voided.is_(False))
            .values(voided=True)
        )
        voided += int(result.rowcount or 0)
    settle_backfill_queue(session, annulled)
    return voided


def _chunks(ids: Sequence[int], size: int = 20_000) -> Iterator[Sequence[int]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def _among(session: Session, column: Any, ids: Sequence[int]) -> ColumnElement[bool]:
    """`column IN ids`: one array parameter on Postgres (`= ANY(:ids)`), where an IN list
    would be as many parameters as ids."""
    if dialect(session) == "postgresql":
        return column == any_(bindparam("ids", list(ids), type_=ARRAY(Integer)))
    return column.in_(list(ids))


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
