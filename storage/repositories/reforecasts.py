"""Which open questions an agent's current policy version should forecast: the re-forecast
policy (ARCHITECTURE §7: each question once per agent unless re-forecasting is configured).

Decisions:
- A group is one (question, agent, policy version), so a re-forecast is a new group of a
  newer version: a question is due again when the agent's newest forecast of it (its `as_of`,
  else when it was stored) is at least `every_days` old at the predict's as-of and the current
  version has not forecast it yet.
- A question the current version has already started stays due, so a partial group is
  completed whatever the policy says (predict asks only for the missing samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.tables import RolloutRow


def questions_due(
    session: Session,
    question_ids: Sequence[int],
    *,
    agent_id: int,
    policy_version: int,
    as_of: datetime,
    every_days: float | None,
) -> list[int]:
    """The questions of `question_ids` (in their order) this agent's `policy_version` should
    forecast at `as_of`: never forecast by the agent, already begun by this version, or (with
    `every_days`) last forecast at least that many days before `as_of`."""
    if not question_ids:
        return []
    forecast_at = func.coalesce(RolloutRow.as_of, RolloutRow.created_at)
    rows = session.execute(
        select(
            RolloutRow.question_id,
            func.max(forecast_at),
            func.max(RolloutRow.policy_version),
        )
        .where(RolloutRow.agent_id == agent_id, RolloutRow.question_id.in_(list(question_ids)))
        .group_by(RolloutRow.question_id)
    ).all()
    latest = {qid: (at, version) for qid, at, version in rows}
    horizon = None if every_days is None else as_of - timedelta(days=every_days)

    def due(question_id: int) -> bool:
        if question_id not in latest:
            return True
        at, newest_version = latest[question_id]
        if newest_version >= policy_version:
            # Begun by this version (complete it) or by a newer one (not ours to redo).
            return newest_version == policy_version
        if horizon is None:
            return False
        return _aware(at) <= horizon

    return [q for q in question_ids if due(q)]


def _aware(at: datetime) -> datetime:
    """An aggregate may come back naive (UTC) where the column type is not applied."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
