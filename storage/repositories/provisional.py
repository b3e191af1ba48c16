"""Provisional (label-free) rewards of the provisional_consensus estimator: the forecasts they
are computed from, each policy version's track record, their replay selection and their voiding.

Decisions:
- A provisional reward is a reward row with `provisional = True` at outcome revision 0 (no
  real revision is 0), so it is written at most once per (rollout, reward function) and the
  real rewards of revision ≥ 1 sit next to it.
- Unresolved at T means: no outcome revision of the question revealed by T (resolved_at <=
  T, the definition of storage.repositories.questions), closed or not.
- Once an outcome (resolved or annulled) is revealed, the question's provisional rewards are
  voided; their provisional consumption records stay, and the real rewards replay through
  `select_replay_batch`, which skips only non-provisional consumption.
- Replay of provisional groups: a group whose every scored rollout carries an unvoided
  provisional reward, not yet consumed provisionally by the agent, oldest first.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, exists, func, select, update
from sqlalchemy.orm import Session

from futureworld.domain import (
    OutcomeStatus,
    ParseStatus,
    QuestionKind,
    ReplayBatch,
)
from storage.repositories.questions import current_outcomes
from storage.repositories.rollouts import FORECAST_COLUMNS
from storage.repositories.training import consumed_by_a_kept_update, replay_groups
from storage.tables import (
    OutcomeRow,
    QuestionRow,
    RewardRow,
    RolloutRow,
)

PROVISIONAL_REVISION = 0
"""The outcome revision a provisional reward is stored under."""


@dataclass(frozen=True)
class PoolForecast:
    """One forecast of an unresolved binary question by the agent."""

    rollout_id: int
    question_id: int
    policy_version: int
    p_yes: float | None
    """None when the answer could not be parsed (it then has no vote in any consensus)."""
    has_provisional: bool
    """A provisional reward of the asked reward function exists already."""


def _revealed(as_of: datetime) -> ColumnElement[bool]:
    return exists().where(
        OutcomeRow.question_id == RolloutRow.question_id, OutcomeRow.resolved_at <= as_of
    )


def _forecast_at() -> ColumnElement[datetime]:
    return func.coalesce(RolloutRow.as_of, RolloutRow.created_at)


def unresolved_forecasts(
    session: Session, agent_id: int, *, reward_fn: str, as_of: datetime
) -> list[PoolForecast]:
    """Every forecast the agent made by `as_of` of a binary question with no outcome revealed
    by `as_of`, by rollout id."""
    have = exists().where(
        RewardRow.rollout_id == RolloutRow.id,
        RewardRow.reward_fn == reward_fn,
        RewardRow.outcome_revision == PROVISIONAL_REVISION,
    )
    rows = session.execute(
        select(*FORECAST_COLUMNS, RolloutRow.parse_status, have.label("has_provisional"))
        .join(QuestionRow, QuestionRow.id == RolloutRow.question_id)
        .where(
            RolloutRow.agent_id == agent_id,
            QuestionRow.kind == str(QuestionKind.BINARY),
            _forecast_at() <= as_of,
            ~_revealed(as_of),
        )
        .order_by(RolloutRow.id)
    ).all()
    return [
        PoolForecast(
            rollout_id=rid,
            question_id=qid,
            policy_version=version,
            p_yes=p if status == str(ParseStatus.OK) and p is not None else None,
            has_provisional=bool(has),
        )
        for rid, qid, version, p, status, has in rows
    ]


def version_track_record(
    session: Session, agent_id: int, *, as_of: datetime
) -> dict[int, tuple[float, int]]:
    """policy version → (Σ (p − y)², n) over the agent's parsed binary forecasts whose
    question's current outcome as of `as_of` is resolved."""
    current = current_outcomes(as_of)
    rows = session.execute(
        select(
            RolloutRow.policy_version,
            func.sum((RolloutRow.p_yes - current.c.value) * (RolloutRow.p_yes - current.c.value)),
            func.count(),
        )
        .join(current, current.c.question_id == RolloutRow.question_id)
        .join(QuestionRow, QuestionRow.id == RolloutRow.question_id)
        .where(
            RolloutRow.agent_id == agent_id,
            QuestionRow.kind == str(QuestionKind.BINARY),
            current.c.status == str(OutcomeStatus.RESOLVED),
            RolloutRow.parse_status == str(ParseStatus.OK),
            RolloutRow.p_yes.is_not(None),
            _forecast_at() <= as_of,
        )
        .group_by(RolloutRow.policy_version)
    ).all()
    return {int(v): (float(total or 0.0), int(n)) for v, total, n in rows}


def void_provisional_rewards(session: Session, *, as_of: datetime) -> int:
    """Void the unvoided provisional rewards of every question with an outcome revealed by
    `as_of`. Returns the rewards voided."""
    revealed = exists().where(
        RolloutRow.id == RewardRow.rollout_id,
        exists().where(
            OutcomeRow.question_id == RolloutRow.question_id, OutcomeRow.resolved_at <= as_of
        ),
    )
    result = session.execute(
        update(RewardRow)
        .where(RewardRow.provisional.is_(True), RewardRow.voided.is_(False), revealed)
        .values(voided=True)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)


def select_provisional_batch(
    session: Session,
    agent_id: int,
    *,
    reward_fn: str,
    current_version: int,
    as_of: datetime,
    max_groups: int | None = None,
    reuse: bool = False,
    exclude_question_ids: Collection[int] = frozenset(),
) -> ReplayBatch:
    """The agent's unresolved groups with unvoided provisional rewards of `reward_fn`, oldest
    first, as scored rollouts (outcome_value None, revision 0, the consensus ŷ their reward
    was computed with) with their tokens; none of `exclude_question_ids` (the validation
    slice)."""
    consumed = consumed_by_a_kept_update(agent_id, PROVISIONAL_REVISION, provisional=True)
    statement = (
        select(
            RolloutRow.id,
            RolloutRow.question_id,
            RolloutRow.policy_version,
            RewardRow.value,
            RewardRow.components,
        )
        .join(RewardRow, RewardRow.rollout_id == RolloutRow.id)
        .where(
            RolloutRow.agent_id == agent_id,
            RewardRow.reward_fn == reward_fn,
            RewardRow.outcome_revision == PROVISIONAL_REVISION,
            RewardRow.provisional.is_(True),
            RewardRow.voided.is_(False),
            ~_revealed(as_of),
        )
        .order_by(RolloutRow.created_at, RolloutRow.id)
    )
    if not reuse:
        statement = statement.where(~consumed)
    excluded = frozenset(exclude_question_ids)
    consensus: dict[int, float] = {}
    rows = []
    for rid, qid, version, reward, components in session.execute(statement):
        if qid in excluded:
            continue
        rows.append((rid, qid, version, reward, None, PROVISIONAL_REVISION))
        if (components or {}).get("consensus") is not None:
            consensus[rid] = float(components["consensus"])
    return replay_groups(
        session,
        agent_id,
        rows,
        current_version=current_version,
        max_groups=max_groups,
        consensus=consensus,
    )
