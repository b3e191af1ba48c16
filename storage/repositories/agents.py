"""Agents and their policy versions (version 0 is the base model)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from futureworld.domain import Agent, BackendKind, GenerationSettings, PolicyVersion, utc_now
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
    row = session.scalar(
        select(PolicyVersionRow)
        .where(PolicyVersionRow.agent_id == agent_id)
        .order_by(PolicyVersionRow.version.desc())
        .limit(1)
    )
    if row is None:
        raise LookupError(f"agent {agent_id} has no policy version")
    return _version(row)


def get_policy_version(session: Session, agent_id: int, version: int) -> PolicyVersion:
    row = session.scalar(
        select(PolicyVersionRow).where(
            PolicyVersionRow.agent_id == agent_id, PolicyVersionRow.version == version
        )
    )
    if row is None:
        raise LookupError(f"agent {agent_id} has no policy version {version}")
    return _version(row)


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
    )
    session.add(row)
    session.flush()
    return replace(version, id=row.id)
