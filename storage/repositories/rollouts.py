"""Rollouts and turns: bulk, idempotent persistence (COPY on Postgres), loading for replay,
and the count of a question's failed prediction attempts (pipeline events of the predict
stage). The predict-time claims live in storage.repositories.claims.

Turn text is decoded from tokens, so it may hold any character, NUL included: the text
columns store NUL as U+FFFD (storage.types.SafeText; the token ids stay the truth)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg.errors import UniqueViolation
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from futureworld.domain import ParseStatus, StopReason, Trajectory, Turn
from storage import codec
from storage.repositories._sql import copy_rows, dialect, insert, insert_new
from storage.tables import (
    PipelineEventRow,
    RolloutRow,
    TurnRow,
)

PREDICT_STAGE = "predict"
"""The pipeline-event stage name predict records its failures under."""

_ROLLOUT_COLUMNS = (
    "idempotency_key",
    "question_id",
    "agent_id",
    "policy_version",
    "group_id",
    "sample_index",
    "prompt_token_ids",
    "completion_token_ids",
    "loss_mask",
    "behaviour_logprobs",
    "n_completion_tokens",
    "p_yes",
    "choice",
    "quantiles",
    "probabilities",
    "parse_status",
    "stop_reason",
    "sampling",
    "timings",
    "as_of",
    "created_at",
)
_TURN_COLUMNS = (
    "rollout_id",
    "index",
    "role",
    "text",
    "token_start",
    "token_end",
    "tool_name",
    "tool_args",
    "tool_result_ids",
    "belief",
)


def group_id(question_id: int, agent_id: int, policy_version: int) -> str:
    return f"q{question_id}-a{agent_id}-v{policy_version}"


def _rollout_values(t: Trajectory) -> dict[str, Any]:
    return {
        "idempotency_key": t.idempotency_key,
        "question_id": t.question_id,
        "agent_id": t.agent_id,
        "policy_version": t.policy_version,
        "group_id": group_id(*t.group_key),
        "sample_index": t.sample_index,
        "prompt_token_ids": codec.pack_ids(t.prompt_token_ids),
        "completion_token_ids": codec.pack_ids(t.completion_token_ids),
        "loss_mask": codec.pack_mask(t.loss_mask),
        "behaviour_logprobs": codec.pack_floats(t.behaviour_logprobs),
        "n_completion_tokens": len(t.completion_token_ids),
        "p_yes": t.p_yes,
        "choice": t.choice,
        "quantiles": list(t.quantiles),
        "probabilities": list(t.probabilities),
        "parse_status": str(t.parse_status),
        "stop_reason": str(t.stop_reason),
        "sampling": t.sampling,
        "timings": t.timings,
        "as_of": t.as_of,
        "created_at": t.created_at,
    }


def _turn_values(rollout_id: int, turn: Turn) -> dict[str, Any]:
    return {
        "rollout_id": rollout_id,
        "index": turn.index,
        "role": turn.role,
        "text": turn.text,
        "token_start": turn.token_start,
        "token_end": turn.token_end,
        "tool_name": turn.tool_name,
        "tool_args": turn.tool_args,
        "tool_result_ids": list(turn.tool_result_ids),
        "belief": turn.belief,
    }


def insert_rollouts(session: Session, trajectories: Sequence[Trajectory]) -> int:
    """Persist rollouts with their turns; rollouts whose (question, agent, version, sample)
    already exists are skipped, so a re-run never duplicates. Returns the number inserted."""
    if not trajectories:
        return 0
    if dialect(session) == "postgresql":
        inserted = _copy_rollouts(session, trajectories)
    else:
        rows = insert_new(
            session,
            RolloutRow,
            trajectories,
            _rollout_values,
            chunk_size=200,
            returning=[RolloutRow.id, RolloutRow.idempotency_key],
        )
        inserted = {key: rid for rid, key in rows}
    turns = [
        _turn_values(inserted[t.idempotency_key], turn)
        for t in trajectories
        if t.idempotency_key in inserted
        for turn in t.turns
    ]
    if turns:
        if dialect(session) == "postgresql":
            copy_rows(session, TurnRow.__table__, _TURN_COLUMNS, turns)
        else:
            session.execute(insert(session, TurnRow), turns)
    return len(inserted)


def _copy_rollouts(session: Session, trajectories: Sequence[Trajectory]) -> dict[str, int]:
    """COPY the rollouts not stored yet straight into `rollout` (claims keep concurrent
    workers off the same groups, so this is the common case); if another writer raced us to
    one of them, fall back to COPY into a staging table + INSERT … ON CONFLICT DO NOTHING."""
    keys = [t.idempotency_key for t in trajectories]
    existing = set(
        session.scalars(
            select(RolloutRow.idempotency_key).where(RolloutRow.idempotency_key.in_(keys))
        )
    )
    fresh = [t for t in trajectories if t.idempotency_key not in existing]
    if not fresh:
        return {}
    values = [_rollout_values(t) for t in fresh]
    try:
        with session.begin_nested():
            copy_rows(session, RolloutRow.__table__, _ROLLOUT_COLUMNS, values)
    except (IntegrityError, UniqueViolation):
        return _copy_rollouts_staged(session, values)
    rows = session.execute(
        select(RolloutRow.id, RolloutRow.idempotency_key).where(
            RolloutRow.idempotency_key.in_([t.idempotency_key for t in fresh])
        )
    ).all()
    return {key: rid for rid, key in rows}


def _copy_rollouts_staged(session: Session, values: Sequence[dict[str, Any]]) -> dict[str, int]:
    connection = session.connection()
    connection.execute(
        text(
            "CREATE TEMP TABLE IF NOT EXISTS rollout_stage "
            "(LIKE rollout INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )
    )
    connection.execute(text("TRUNCATE rollout_stage"))
    copy_rows(session, RolloutRow.__table__, _ROLLOUT_COLUMNS, values, into="rollout_stage")
    columns = ", ".join(f'"{c}"' for c in _ROLLOUT_COLUMNS)
    rows = connection.execute(
        text(
            f"INSERT INTO rollout ({columns}) SELECT {columns} FROM rollout_stage "
            "ON CONFLICT DO NOTHING RETURNING id, idempotency_key"
        )
    ).all()
    connection.execute(text("TRUNCATE rollout_stage"))
    return {key: rid for rid, key in rows}


def trajectory_from_row(row: RolloutRow, turns: Sequence[TurnRow] = ()) -> Trajectory:
    return Trajectory(
        id=row.id,
        question_id=row.question_id,
        agent_id=row.agent_id,
        policy_version=row.policy_version,
        sample_index=row.sample_index,
        prompt_token_ids=codec.unpack_ids(row.prompt_token_ids),
        completion_token_ids=codec.unpack_ids(row.completion_token_ids),
        loss_mask=codec.unpack_mask(row.loss_mask),
        behaviour_logprobs=codec.unpack_floats(row.behaviour_logprobs),
        turns=tuple(
            Turn(
                index=t.index,
                role=t.role,
                text=t.text,
                token_start=t.token_start,
                token_end=t.token_end,
                tool_name=t.tool_name,
                tool_args=t.tool_args,
                tool_result_ids=tuple(t.tool_result_ids or ()),
                belief=t.belief,
            )
            for t in sorted(turns, key=lambda t: t.index)
        ),
        p_yes=row.p_yes,
        choice=row.choice,
        quantiles=tuple(row.quantiles or ()),
        probabilities=tuple(row.probabilities or ()),
        parse_status=ParseStatus(row.parse_status),
        stop_reason=StopReason(row.stop_reason),
        sampling=dict(row.sampling or {}),
        timings=dict(row.timings or {}),
        as_of=row.as_of,
        created_at=row.created_at,
    )


def load_trajectories(session: Session, rollout_ids: Sequence[int]) -> list[Trajectory]:
    """Load full rollouts (tokens and turns) in the order of `rollout_ids`."""
    if not rollout_ids:
        return []
    rows = {
        r.id: r for r in session.scalars(select(RolloutRow).where(RolloutRow.id.in_(rollout_ids)))
    }
    turns: dict[int, list[TurnRow]] = {}
    for turn in session.scalars(select(TurnRow).where(TurnRow.rollout_id.in_(rollout_ids))):
        turns.setdefault(turn.rollout_id, []).append(turn)
    missing = [i for i in rollout_ids if i not in rows]
    if missing:
        raise LookupError(f"rollouts {missing[:5]} do not exist")
    return [trajectory_from_row(rows[i], turns.get(i, ())) for i in rollout_ids]


def rollouts_for(
    session: Session, *, agent_id: int | None = None, question_id: int | None = None
) -> list[Trajectory]:
    statement = select(RolloutRow.id).order_by(RolloutRow.id)
    if agent_id is not None:
        statement = statement.where(RolloutRow.agent_id == agent_id)
    if question_id is not None:
        statement = statement.where(RolloutRow.question_id == question_id)
    return load_trajectories(session, list(session.scalars(statement)))


@dataclass(frozen=True)
class Forecast:
    """A rollout's answer without its tokens: what evaluation needs."""

    rollout_id: int
    question_id: int
    policy_version: int
    p_yes: float | None
    as_of: datetime | None


FORECAST_COLUMNS = (
    RolloutRow.id,
    RolloutRow.question_id,
    RolloutRow.policy_version,
    RolloutRow.p_yes,
)
"""A rollout's forecast without its token arrays: rollout id, question, policy version, P(yes)."""


def forecasts_of(session: Session, agent_id: int) -> list[Forecast]:
    """Every rollout's answer of one agent, oldest first, without loading token arrays."""
    rows = session.execute(
        select(*FORECAST_COLUMNS, RolloutRow.as_of)
        .where(RolloutRow.agent_id == agent_id)
        .order_by(RolloutRow.id)
    ).all()
    return [Forecast(*row) for row in rows]


@dataclass(frozen=True)
class ForecastGroup:
    """An agent version's forecast of a question at one forecast time: its group's answers."""

    question_id: int
    policy_version: int
    as_of: datetime | None
    answers: tuple[float | None, ...]
    """Each rollout's P(yes), None where it did not parse, in rollout order."""


def forecast_groups(session: Session, agent_id: int) -> list[ForecastGroup]:
    """Every forecast of one agent, its rollouts grouped by (question, version, forecast
    time), oldest first (by each group's first rollout)."""
    groups: dict[tuple[int, int, datetime | None], list[float | None]] = {}
    for forecast in forecasts_of(session, agent_id):
        key = (forecast.question_id, forecast.policy_version, forecast.as_of)
        groups.setdefault(key, []).append(forecast.p_yes)
    return [ForecastGroup(q, v, t, tuple(answers)) for (q, v, t), answers in groups.items()]


def existing_samples(
    session: Session, question_ids: Sequence[int], agent_id: int, policy_version: int
) -> dict[int, set[int]]:
    """Sample indices already persisted per question for this agent's policy version."""
    rows = session.execute(
        select(RolloutRow.question_id, RolloutRow.sample_index).where(
            RolloutRow.agent_id == agent_id,
            RolloutRow.policy_version == policy_version,
            RolloutRow.question_id.in_(list(question_ids)),
        )
    ).all()
    found: dict[int, set[int]] = {}
    for question_id, sample_index in rows:
        found.setdefault(question_id, set()).add(sample_index)
    return found


def count_rollouts(session: Session, agent_id: int | None = None) -> int:
    statement = select(func.count()).select_from(RolloutRow)
    if agent_id is not None:
        statement = statement.where(RolloutRow.agent_id == agent_id)
    return int(session.scalar(statement) or 0)


def prediction_failure_source(question_id: int, agent_id: int) -> str:
    """The pipeline-event `source` of a failed prediction of one question by one agent."""
    return f"q{question_id}-a{agent_id}"


def prediction_failures(session: Session, agent_id: int) -> dict[int, int]:
    """question id → failed prediction attempts recorded for this agent (error-level events
    of the predict stage, any policy version)."""
    source = PipelineEventRow.source
    rows = session.execute(
        select(source, func.count())
        .where(
            PipelineEventRow.stage == PREDICT_STAGE,
            PipelineEventRow.level == "error",
            source.like(f"q%-a{agent_id}"),
        )
        .group_by(source)
    ).all()
    failures: dict[int, int] = {}
    for name, count in rows:
        question, _, agent = name[1:].partition("-a")
        if question.isdigit() and agent == str(agent_id):
            failures[int(question)] = int(count)
    return failures
