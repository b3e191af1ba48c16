"""Replay selection, training runs, per-step metrics and consumption records.

A group is the rollouts of one (question, agent, policy version). It is replayable when its
question's current outcome is resolved and at least two of its rollouts carry a current,
unvoided reward; consumption is recorded per (training run, rollout, outcome revision), so
a lineage never trains twice on the same data by accident, while a re-resolved question
(new revision) becomes trainable again. Replay is oldest first; staleness is never a reason
to drop data (the trainer corrects for it).

As of an instant (a backtest's clock), replay sees only outcome revisions revealed by then
(resolved_at <= the clock, storage.repositories.questions): a group whose question resolves
later is not trainable yet, and one re-resolved later is trained on its earlier revision.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, exists, func, select, update
from sqlalchemy.orm import Session

from futureworld.domain import (
    MIN_GROUP_SIZE,
    GroupKey,
    OutcomeStatus,
    ReplayBatch,
    ScoredRollout,
    TrainingRun,
    TrainStep,
    VersionStatus,
    utc_now,
)
from storage.repositories._sql import insert
from storage.repositories.questions import current_outcomes
from storage.repositories.rollouts import load_trajectories
from storage.tables import (
    PolicyVersionRow,
    QuestionRow,
    ReplayConsumptionRow,
    RewardRow,
    RolloutRow,
    TrainingRunRow,
    TrainStepRow,
)


def consumed_by_a_kept_update(
    agent_id: int, outcome_revision: Any, *, provisional: bool
) -> ColumnElement[bool]:
    """Whether the agent already trained on the rollout (RolloutRow.id) at `outcome_revision`
    in an update whose version was not rejected. A rejected version's data never reached a
    served version, and the next update starts from the served one, so it may train on that
    data again; the rejected run's consumption records stay, for the audit (and count again
    if a person promotes that version)."""
    rejected = exists().where(
        PolicyVersionRow.training_run_id == ReplayConsumptionRow.training_run_id,
        PolicyVersionRow.status == str(VersionStatus.REJECTED),
    )
    return exists().where(
        ReplayConsumptionRow.agent_id == agent_id,
        ReplayConsumptionRow.rollout_id == RolloutRow.id,
        ReplayConsumptionRow.outcome_revision == outcome_revision,
        ReplayConsumptionRow.provisional.is_(provisional),
        ~rejected,
    )


def select_replay_batch(
    session: Session,
    agent_id: int,
    *,
    reward_fn: str,
    current_version: int,
    max_groups: int | None = None,
    reuse: bool = False,
    as_of: datetime | None = None,
    exclude_question_ids: Collection[int] = frozenset(),
) -> ReplayBatch:
    """The agent's replayable groups, oldest first, as scored rollouts with their tokens.

    Each rollout carries the reward `reward_fn` gave it under its question's current outcome
    revision, and its staleness against `current_version`. Groups with fewer than
    MIN_GROUP_SIZE scored rollouts are counted, not returned; `max_groups` leaves the rest
    for a later update. With `as_of`, only outcome revisions revealed by then count. Rollouts
    of `exclude_question_ids` (the held-out validation questions, `held_out_question_ids`) are
    not replayed, nor counted.
    """
    current = current_outcomes(as_of)
    consumed = consumed_by_a_kept_update(agent_id, RewardRow.outcome_revision, provisional=False)
    statement = (
        select(
            RolloutRow.id,
            RolloutRow.question_id,
            RolloutRow.policy_version,
            RewardRow.value,
            current.c.value,
            RewardRow.outcome_revision,
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
    rows: Iterable[Any] = session.execute(statement)
    if exclude_question_ids:
        # Filtered here, not in SQL: a validation slice can hold more ids than a bound IN list.
        excluded = frozenset(exclude_question_ids)
        rows = (row for row in rows if row[1] not in excluded)
    return replay_groups(
        session, agent_id, rows, current_version=current_version, max_groups=max_groups
    )


def held_out_question_ids(
    session: Session, is_held_out: Callable[[str, str], bool]
) -> frozenset[int]:
    """Ids of the stored questions `is_held_out(source, external_id)` puts in the validation
    slice (futureworld.validation.is_held_out with the configured fraction): what replay
    leaves out, so no update trains on the questions its promotion gate scores it on."""
    rows = session.execute(select(QuestionRow.id, QuestionRow.source, QuestionRow.external_id))
    return frozenset(qid for qid, source, external_id in rows if is_held_out(source, external_id))


def trained_question_ids(session: Session, training_run_id: int) -> frozenset[int]:
    """Ids of the questions whose rollouts the training run trained on (on any reward, real or
    provisional): the promotion gate's fit rule scores a candidate on those resolved."""
    statement = (
        select(RolloutRow.question_id)
        .join(ReplayConsumptionRow, ReplayConsumptionRow.rollout_id == RolloutRow.id)
        .where(ReplayConsumptionRow.training_run_id == training_run_id)
        .distinct()
    )
    return frozenset(session.scalars(statement))


def replay_groups(
    session: Session,
    agent_id: int,
    rows: Iterable[tuple[int, int, int, float, float | None, int]],
    *,
    current_version: int,
    max_groups: int | None,
    consensus: Mapping[int, float] | None = None,
) -> ReplayBatch:
    """Scored rows (rollout id, question id, policy version, reward, outcome value, outcome
    revision), oldest first, as the ReplayBatch of their groups: groups of fewer than
    MIN_GROUP_SIZE are counted, not returned; `max_groups` leaves the rest for later.
    `consensus` (rollout id → ŷ) is what provisional rewards were computed with."""
    groups: dict[GroupKey, list[tuple[int, float, float | None, int]]] = {}
    for rid, qid, version, reward, value, revision in rows:
        scored = (rid, float(reward), None if value is None else float(value), revision)
        groups.setdefault((qid, agent_id, version), []).append(scored)
    # dicts keep insertion order: oldest group first
    eligible = [g for g in groups.values() if len(g) >= MIN_GROUP_SIZE]
    chosen = eligible if max_groups is None else eligible[:max_groups]
    trajectories = iter(load_trajectories(session, [rid for g in chosen for rid, *_ in g]))
    return ReplayBatch(
        groups=tuple(
            tuple(
                ScoredRollout(
                    trajectory=(trajectory := next(trajectories)),
                    reward=reward,
                    outcome_value=value,
                    outcome_revision=revision,
                    staleness=current_version - trajectory.policy_version,
                    consensus=(consensus or {}).get(rid),
                )
                for rid, reward, value, revision in group
            )
            for group in chosen
        ),
        skipped_small_groups=len(groups) - len(eligible),
        remaining_groups=len(eligible) - len(chosen),
    )


def start_training_run(session: Session, run: TrainingRun) -> TrainingRun:
    row = TrainingRunRow(
        agent_id=run.agent_id,
        from_version=run.from_version,
        config=run.config,
        status="running",
        started_at=run.started_at,
        made_at=run.made_at,
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
    session: Session, run_id: int, agent_id: int, rollouts: Sequence[ScoredRollout]
) -> None:
    """Mark the rollouts (under their outcome revisions) as trained on by this run; a rollout
    trained on its provisional reward (revision 0) is recorded as provisional."""
    if not rollouts:
        return
    session.execute(
        insert(session, ReplayConsumptionRow)
        .values(
            [
                {
                    "training_run_id": run_id,
                    "agent_id": agent_id,
                    "rollout_id": r.trajectory.id,
                    "outcome_revision": r.outcome_revision,
                    # Revision 0 is a provisional reward's (storage.repositories.provisional).
                    "provisional": r.outcome_revision == 0,
                }
                for r in rollouts
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
    summary: Mapping[str, float] | None = None,
) -> None:
    values: dict[str, Any] = dict(
        status=status,
        to_version=to_version,
        rollouts_consumed=rollouts_consumed,
        error=error,
        finished_at=utc_now(),
    )
    if summary is not None:
        values["summary"] = dict(summary)
    session.execute(update(TrainingRunRow).where(TrainingRunRow.id == run_id).values(**values))


def fail_abandoned_training_runs(session: Session, agent_id: int, *, error: str) -> list[int]:
    """Mark every `running` training run of this agent failed, with `error`. Call only while
    holding the agent's training lock: then no live update of the agent exists, so a run
    still `running` belongs to a process that died (killed, or its machine lost)."""
    ids = list(
        session.scalars(
            select(TrainingRunRow.id).where(
                TrainingRunRow.agent_id == agent_id, TrainingRunRow.status == "running"
            )
        )
    )
    if ids:
        session.execute(
            update(TrainingRunRow)
            .where(TrainingRunRow.id.in_(ids))
            .values(status="failed", error=error, finished_at=utc_now())
        )
    return ids


def training_run_statuses(session: Session, agent_id: int) -> dict[int, str]:
    """Training run id → status, for one agent."""
    rows = session.execute(
        select(TrainingRunRow.id, TrainingRunRow.status).where(TrainingRunRow.agent_id == agent_id)
    ).all()
    return {run_id: status for run_id, status in rows}


def agent_train_steps(session: Session, agent_id: int) -> int:
    """Optimiser steps recorded for the agent's updates, every run counted (a tracker's
    x-axis continues across updates from here)."""
    statement = (
        select(func.count())
        .select_from(TrainStepRow)
        .join(TrainingRunRow, TrainingRunRow.id == TrainStepRow.training_run_id)
        .where(TrainingRunRow.agent_id == agent_id)
    )
    return int(session.scalar(statement) or 0)


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


HEALTH_STEP_METRICS = ("entropy", "clip_fraction", "kl_prox", "grad_norm", "sampler_gap")
"""Per-step metrics `update_health` averages over each update's optimiser steps."""


def update_health(session: Session, agent_id: int) -> dict[int, dict[str, float]]:
    """Each version an update of the agent produced → that update's health: its stored
    summary (flows.tracking_summary.update_summary) and, over its optimiser steps, the mean
    of each of HEALTH_STEP_METRICS it reported (`<name>_mean`) and the largest kl_prox and
    grad norm (`<name>_max`)."""
    runs = session.execute(
        select(TrainingRunRow.id, TrainingRunRow.to_version, TrainingRunRow.summary).where(
            TrainingRunRow.agent_id == agent_id,
            TrainingRunRow.to_version.is_not(None),
            TrainingRunRow.status == "completed",
        )
    ).all()
    version_of = {run_id: int(version) for run_id, version, _ in runs}
    health = {int(version): dict(summary or {}) for _, version, summary in runs}
    values: dict[int, dict[str, list[float]]] = {}
    steps = session.execute(
        select(TrainStepRow.training_run_id, TrainStepRow.metrics).where(
            TrainStepRow.training_run_id.in_(list(version_of))
        )
    )
    for run_id, metrics in steps:
        per_run = values.setdefault(version_of[run_id], {})
        for name in HEALTH_STEP_METRICS:
            value = (metrics or {}).get(name)
            if isinstance(value, int | float):
                per_run.setdefault(name, []).append(float(value))
    for version, per_name in values.items():
        for name, series in per_name.items():
            health[version][f"{name}_mean"] = sum(series) / len(series)
            if name in ("kl_prox", "grad_norm"):
                health[version][f"{name}_max"] = max(series)
    return health
