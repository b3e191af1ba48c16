"""Replay selection, training runs, per-step metrics and consumption records.

A group is the rollouts of one (question, agent, policy version). It is replayable when its
question's current outcome is resolved and at least two of its rollouts carry a current,
unvoided reward; consumption is recorded per (training run, rollout, outcome revision), so
a lineage never trains twice on the same data by accident, while a re-resolved question
(new revision) becomes trainable again. Replay is oldest first; staleness is never a reason
to drop data (the trainer corrects for it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session

from futureworld.domain import OutcomeStatus, TrainingRun, TrainStep, utc_now
from storage.repositories._sql import insert
from storage.repositories.questions import current_outcomes
from storage.tables import (
    ReplayConsumptionRow,
    RewardRow,
    RolloutRow,
    TrainingRunRow,
    TrainStepRow,
)


@dataclass(frozen=True)
class ReplayItem:
    rollout_id: int
    question_id: int
    policy_version: int
    reward: float
    outcome_value: float
    outcome_revision: int
    created_at: datetime


@dataclass
class ReplaySelection:
    groups: list[list[ReplayItem]] = field(default_factory=list)
    skipped_small_groups: int = 0
    """Groups with fewer than `min_group_size` scored rollouts."""
    remaining_groups: int = 0
    """Eligible groups left for a later run by `max_groups`."""

    @property
    def items(self) -> list[ReplayItem]:
        return [item for group in self.groups for item in group]


def select_replay_groups(
    session: Session,
    agent_id: int,
    *,
    reward_fn: str,
    max_groups: int | None = None,
    reuse: bool = False,
    min_group_size: int = 2,
) -> ReplaySelection:
    current = current_outcomes()
    consumed = exists().where(
        ReplayConsumptionRow.agent_id == agent_id,
        ReplayConsumptionRow.rollout_id == RolloutRow.id,
        ReplayConsumptionRow.outcome_revision == RewardRow.outcome_revision,
        ReplayConsumptionRow.provisional.is_(False),
    )
    statement = (
        select(
            RolloutRow.id,
            RolloutRow.question_id,
            RolloutRow.policy_version,
            RewardRow.value,
            current.c.value,
            RewardRow.outcome_revision,
            RolloutRow.created_at,
        )
        .join(RewardRow, RewardRow.rollout_id == RolloutRow.id)
        .join(
            current,
            (current.c.question_id == RolloutRow.question_id)
            & (current.c.revision == RewardRow.outcome_revision),
        )
        .where(
            RolloutRow.agent_id == agent_id,
            RewardRow.reward_fn == reward_fn,
            RewardRow.voided.is_(False),
            RewardRow.provisional.is_(False),
            current.c.status == str(OutcomeStatus.RESOLVED),
        )
        .order_by(RolloutRow.created_at, RolloutRow.id)
    )
    if not reuse:
        statement = statement.where(~consumed)
    groups: dict[tuple[int, int], list[ReplayItem]] = {}
    for rid, qid, version, reward, value, revision, created in session.execute(statement):
        groups.setdefault((qid, version), []).append(
            ReplayItem(rid, qid, version, float(reward), float(value), revision, created)
        )
    selection = ReplaySelection()
    eligible = []
    for group in groups.values():  # dicts keep insertion order: oldest group first
        if len(group) < min_group_size:
            selection.skipped_small_groups += 1
        else:
            eligible.append(group)
    cut = len(eligible) if max_groups is None else max_groups
    selection.groups = eligible[:cut]
    selection.remaining_groups = len(eligible) - len(selection.groups)
    return selection


def start_training_run(session: Session, run: TrainingRun) -> TrainingRun:
    row = TrainingRunRow(
        agent_id=run.agent_id,
        from_version=run.from_version,
        config=run.config,
        status="running",
        started_at=run.started_at,
    )
    session.add(row)
    session.flush()
    return replace(run, id=row.id)


def record_train_steps(session: Session, steps: Sequence[TrainStep]) -> None:
    if not steps:
        return
    values: list[dict[str, Any]] = [
        {
            "training_run_id": s.training_run_id,
            "step": s.step,
            "loss": s.loss,
            "clip_fraction": s.metrics.get("clip_fraction"),
            "kl_behaviour": s.metrics.get("kl_behaviour"),
            "staleness": s.metrics.get("staleness_mean"),
            "tokens_per_s": s.metrics.get("tokens_per_s"),
            "grad_norm": s.metrics.get("grad_norm"),
            "metrics": s.metrics,
        }
        for s in steps
    ]
    session.execute(
        insert(session, TrainStepRow)
        .values(values)
        .on_conflict_do_nothing(index_elements=["training_run_id", "step"])
    )


def record_consumption(
    session: Session, run_id: int, agent_id: int, items: Sequence[ReplayItem]
) -> None:
    if not items:
        return
    session.execute(
        insert(session, ReplayConsumptionRow)
        .values(
            [
                {
                    "training_run_id": run_id,
                    "agent_id": agent_id,
                    "rollout_id": i.rollout_id,
                    "outcome_revision": i.outcome_revision,
                    "provisional": False,
                }
                for i in items
            ]
        )
        .on_conflict_do_nothing()
    )


def finish_training_run(
    session: Session,
    run_id: int,
    *,
    status: str,
    to_version: int | None = None,
    rollouts_consumed: int = 0,
    error: str | None = None,
) -> None:
    session.execute(
        update(TrainingRunRow)
        .where(TrainingRunRow.id == run_id)
        .values(
            status=status,
            to_version=to_version,
            rollouts_consumed=rollouts_consumed,
            error=error,
            finished_at=utc_now(),
        )
    )


def train_steps(session: Session, run_id: int) -> list[TrainStep]:
    rows = session.scalars(
        select(TrainStepRow)
        .where(TrainStepRow.training_run_id == run_id)
        .order_by(TrainStepRow.step)
    )
    return [
        TrainStep(
            id=r.id,
            training_run_id=r.training_run_id,
            step=r.step,
            loss=r.loss,
            metrics=dict(r.metrics or {}),
        )
        for r in rows
    ]


def train_steps_by_version(session: Session, agent_id: int) -> dict[int, float]:
    """Mean staleness of the data that produced each trained version of an agent."""
    rows = session.execute(
        select(TrainingRunRow.to_version, func.avg(TrainStepRow.staleness))
        .join(TrainStepRow, TrainStepRow.training_run_id == TrainingRunRow.id)
        .where(TrainingRunRow.agent_id == agent_id, TrainingRunRow.to_version.is_not(None))
        .group_by(TrainingRunRow.to_version)
    ).all()
    return {int(v): float(s) for v, s in rows if s is not None}
