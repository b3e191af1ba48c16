"""Agents and their policy versions (version 0 is the base model), each version's status
(candidate, promoted, rejected) and its promotion gate's validation record.

Two lookups answer two questions: `latest_policy_version` is the newest registered version,
whatever its status (registration numbers the next one after it); `served_policy_version` is
the newest promoted one, the version that samples the agent's rollouts and that the next
update starts from. Version 0 is promoted when the agent is registered and cannot be rejected,
so every agent always has a served version."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from futureworld.domain import (
    Agent,
    BackendKind,
    GenerationSettings,
    PolicyVersion,
    VersionStatus,
    utc_now,
)
from storage.tables import AgentRow, PolicyVersionRow


def _agent(row: AgentRow) -> Agent:
    return Agent(
        id=row.id,
        name=row.name,
        base_model=row.base_model,
        backend=BackendKind(row.backend),
        base_url=row.base_url,
        served_model=row.served_model,
        generation=GenerationSettings(**(row.generation or {})),
    )


def _version(row: PolicyVersionRow) -> PolicyVersion:
    return PolicyVersion(
        id=row.id,
        agent_id=row.agent_id,
        version=row.version,
        parent_version=row.parent_version,
        checkpoint_path=row.checkpoint_path,
        checkpoint_sha256=row.checkpoint_sha256,
        training_run_id=row.training_run_id,
        created_at=row.created_at,
        status=VersionStatus(row.status),
        status_reason=row.status_reason,
        validation_questions=row.validation_questions,
        validation_brier=row.validation_brier,
        validation_parse_rate=row.validation_parse_rate,
    )


def ensure_agent(session: Session, agent: Agent, *, checkpoint_sha256: str = "") -> Agent:
    """Register an agent with policy version 0 = its base model; an existing name is returned
    unchanged if its definition matches and rejected with a clear error if it does not."""
    row = session.scalar(select(AgentRow).where(AgentRow.name == agent.name))
    if row is not None:
        existing = _agent(row)
        if (existing.base_model, existing.backend, existing.base_url) != (
            agent.base_model,
            agent.backend,
            agent.base_url,
        ):
            raise ValueError(
                f"agent {agent.name!r} already exists with model {existing.base_model!r} "
                f"and backend {existing.backend!r}; choose another name"
            )
        return existing
    row = AgentRow(
        name=agent.name,
        base_model=agent.base_model,
        backend=str(agent.backend),
        base_url=agent.base_url,
        served_model=agent.served_model,
        generation=dataclasses.asdict(agent.generation),
        created_at=utc_now(),
    )
    session.add(row)
    session.flush()
    session.add(
        PolicyVersionRow(
            agent_id=row.id,
            version=0,
            checkpoint_path=agent.base_model,
            checkpoint_sha256=checkpoint_sha256,
            created_at=utc_now(),
            status=str(VersionStatus.PROMOTED),
            status_reason="the base model",
        )
    )
    session.flush()
    return _agent(row)


def get_agent(session: Session, name: str) -> Agent:
    row = session.scalar(select(AgentRow).where(AgentRow.name == name))
    if row is None:
        known = ", ".join(session.scalars(select(AgentRow.name).order_by(AgentRow.name))) or "none"
        raise LookupError(f"no agent named {name!r} (registered: {known})")
    return _agent(row)


def list_agents(session: Session) -> list[Agent]:
    return [_agent(row) for row in session.scalars(select(AgentRow).order_by(AgentRow.id))]


def latest_policy_version(session: Session, agent_id: int) -> PolicyVersion:
    """The agent's newest registered version, whatever its status: the one registration
    numbers after. Not the version to sample: that is `served_policy_version`."""
    row = session.scalar(
        select(PolicyVersionRow)
        .where(PolicyVersionRow.agent_id == agent_id)
        .order_by(PolicyVersionRow.version.desc())
        .limit(1)
    )
    if row is None:
        raise LookupError(f"agent {agent_id} has no policy version")
    return _version(row)


def served_policy_version(session: Session, agent_id: int) -> PolicyVersion:
    """The agent's newest promoted version: it samples the agent's rollouts and is the base of
    its next update. Candidates and rejected versions are passed over."""
    row = session.scalar(
        select(PolicyVersionRow)
        .where(
            PolicyVersionRow.agent_id == agent_id,
            PolicyVersionRow.status == str(VersionStatus.PROMOTED),
        )
        .order_by(PolicyVersionRow.version.desc())
        .limit(1)
    )
    if row is None:
        raise LookupError(f"agent {agent_id} has no promoted policy version")
    return _version(row)


def list_policy_versions(session: Session, agent_id: int) -> list[PolicyVersion]:
    """Every registered version of the agent, oldest first."""
    rows = session.scalars(
        select(PolicyVersionRow)
        .where(PolicyVersionRow.agent_id == agent_id)
        .order_by(PolicyVersionRow.version)
    )
    return [_version(row) for row in rows]


def get_policy_version(session: Session, agent_id: int, version: int) -> PolicyVersion:
    return _version(_row(session, agent_id, version))


def register_policy_version(session: Session, version: PolicyVersion) -> PolicyVersion:
    """Register a checkpoint that is already complete on disk as the agent's next version."""
    newest = session.scalar(
        select(func.max(PolicyVersionRow.version)).where(
            PolicyVersionRow.agent_id == version.agent_id
        )
    )
    if newest is not None and version.version != newest + 1:
        raise ValueError(
            f"agent {version.agent_id}: version {version.version} does not follow {newest}"
        )
    row = PolicyVersionRow(
        agent_id=version.agent_id,
        version=version.version,
        parent_version=version.parent_version,
        checkpoint_path=version.checkpoint_path,
        checkpoint_sha256=version.checkpoint_sha256,
        training_run_id=version.training_run_id,
        created_at=version.created_at,
        status=str(version.status),
        status_reason=version.status_reason,
    )
    session.add(row)
    session.flush()
    return replace(version, id=row.id)


def _row(session: Session, agent_id: int, version: int) -> PolicyVersionRow:
    row = session.scalar(
        select(PolicyVersionRow).where(
            PolicyVersionRow.agent_id == agent_id, PolicyVersionRow.version == version
        )
    )
    if row is None:
        raise LookupError(f"agent {agent_id} has no policy version {version}")
    return row


def set_version_status(
    session: Session,
    agent_id: int,
    version: int,
    status: VersionStatus,
    reason: str,
    *,
    validation_questions: int | None = None,
    validation_brier: float | None = None,
    validation_parse_rate: float | None = None,
) -> PolicyVersion:
    """Mark a version promoted, rejected or a candidate again, with why; with
    `validation_questions`, also its gate's record (Brier and parse rate, None when unknown).
    Version 0, the base model, stays promoted: it is what an agent serves when nothing else is."""
    if version == 0 and status is not VersionStatus.PROMOTED:
        raise ValueError("version 0 is the base model; it stays promoted")
    row = _row(session, agent_id, version)
    row.status = str(status)
    row.status_reason = reason
    if validation_questions is not None:
        row.validation_questions = validation_questions
        row.validation_brier = validation_brier
        row.validation_parse_rate = validation_parse_rate
    session.flush()
    return _version(row)


def record_validation_forecasts(
    session: Session,
    agent_id: int,
    version: int,
    forecasts: Mapping[int, Sequence[float | None]],
) -> None:
    """Keep a version's forecasts of held-out questions (question id → each rollout's P(yes),
    None where it did not parse), merged over what it had: a later gate reuses them."""
    row = _row(session, agent_id, version)
    merged = dict(row.validation_forecasts or {})
    merged.update(
        {str(q): [None if p is None else float(p) for p in ps] for q, ps in forecasts.items()}
    )
    row.validation_forecasts = merged
    session.flush()


def validation_forecasts(
    session: Session, agent_id: int, version: int
) -> dict[int, tuple[float | None, ...]]:
    """A version's stored forecasts of held-out questions (`record_validation_forecasts`)."""
    stored = _row(session, agent_id, version).validation_forecasts or {}
    return {int(q): tuple(None if p is None else float(p) for p in ps) for q, ps in stored.items()}
