"""The backfill queue: what backfill has left to do, read from `backfill_queue` (kept by the
triggers of migration 0003: a row per stored rollout and per rollout of a question given a new
outcome revision), so finding the work costs what arrived since the last run, never the
resolved history.

Decisions:
- A queued rollout is pending when its question's current outcome is resolved and one of the
  reward functions that apply to the question's kind has no reward at that revision. The
  caller says which functions apply to which kind (storage does not know the registry).
- Queue rows are settled (deleted) only for rollouts that then have every applicable reward
  at the current revision, or whose current outcome is annulled once their rewards are voided.
  A revision that arrives meanwhile queues new rows, which stay; a rollout whose scoring
  failed stays queued and is retried on the next run.
- As of an instant (a backtest's clock), only outcome revisions revealed by then (resolved_at
  <= the clock) are current: a queued rollout whose outcome resolves later stays queued.
- On Postgres, binary questions' rollouts are found, scored and settled by one statement a
  batch (storage.repositories.binary_rewards); these queries serve the other kinds, SQLite,
  annulments and repairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, case, delete, exists, false, func, select, tuple_, update
from sqlalchemy.orm import Session, aliased

from futureworld.domain import OutcomeStatus, QuestionKind
from storage.repositories._sql import among, insert_new
from storage.repositories.questions import current_outcomes
from storage.tables import BackfillQueueRow, OutcomeRow, QuestionRow, RewardRow, RolloutRow

ApplicableRewards = Mapping[QuestionKind, Sequence[str]]
"""Question kind → the names of the reward functions that score it."""


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
                    among(session, BackfillQueueRow.rollout_id, chunk),
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
            .where(among(session, RewardRow.rollout_id, chunk), RewardRow.voided.is_(False))
            .values(voided=True)
        )
        voided += int(result.rowcount or 0)
    settle_backfill_queue(session, annulled)
    return voided


def _chunks(ids: Sequence[int], size: int = 20_000) -> Iterator[Sequence[int]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]
