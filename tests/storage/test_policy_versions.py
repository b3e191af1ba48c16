"""Policy versions' status on real Postgres and SQLite: version 0 is promoted, the served
version is the newest promoted one while registration numbers after the newest of all, the
base cannot be rejected, the gate's forecasts are kept and merged; and migration 0008 makes
every version registered before it promoted."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy import Engine, text

from futureworld.domain import Agent, PolicyVersion, VersionStatus
from storage.engine import current_revision, make_engine, session_scope, upgrade_database
from storage.repositories.agents import (
    ensure_agent,
    get_policy_version,
    latest_policy_version,
    list_policy_versions,
    record_validation_forecasts,
    register_policy_version,
    served_policy_version,
    set_version_status,
    validation_forecasts,
)
from storage.types import JSONType, UTCDateTime
from tests.conftest import POSTGRES_ADMIN_URL

CREATED = datetime(2026, 4, 1, tzinfo=UTC)


def _agent(session) -> int:
    agent = ensure_agent(session, Agent(name="a", base_model="m", backend="local"))
    assert agent.id is not None
    return agent.id


def _candidate(session, agent_id: int, version: int) -> None:
    register_policy_version(
        session,
        PolicyVersion(
            agent_id=agent_id,
            version=version,
            parent_version=0,
            checkpoint_path=f"/ckpt/v{version}",
            status=VersionStatus.CANDIDATE,
        ),
    )


def test_the_served_version_is_the_newest_promoted_one(engine: Engine) -> None:
    with session_scope(engine) as session:
        agent_id = _agent(session)
        base = served_policy_version(session, agent_id)
        assert (base.version, base.status, base.status_reason) == (
            0,
            VersionStatus.PROMOTED,
            "the base model",
        )
        _candidate(session, agent_id, 1)
        _candidate(session, agent_id, 2)
        assert served_policy_version(session, agent_id).version == 0
        assert latest_policy_version(session, agent_id).version == 2
        set_version_status(session, agent_id, 2, VersionStatus.PROMOTED, "passed")
        set_version_status(
            session,
            agent_id,
            1,
            VersionStatus.REJECTED,
            "rejected: parse rate",
            validation_questions=12,
            validation_brier=0.3,
            validation_parse_rate=0.0,
        )
        assert served_policy_version(session, agent_id).version == 2
        set_version_status(session, agent_id, 2, VersionStatus.REJECTED, "by hand: no")
        assert served_policy_version(session, agent_id).version == 0
        rejected = get_policy_version(session, agent_id, 1)
        assert (rejected.status, rejected.status_reason) == (
            VersionStatus.REJECTED,
            "rejected: parse rate",
        )
        assert (rejected.validation_questions, rejected.validation_brier) == (12, 0.3)
        assert rejected.validation_parse_rate == 0.0
        assert [v.version for v in list_policy_versions(session, agent_id)] == [0, 1, 2]
        with pytest.raises(ValueError, match="version 0 is the base model"):
            set_version_status(session, agent_id, 0, VersionStatus.REJECTED, "no")


def test_validation_forecasts_are_kept_and_merged(engine: Engine) -> None:
    with session_scope(engine) as session:
        agent_id = _agent(session)
        assert validation_forecasts(session, agent_id, 0) == {}
        record_validation_forecasts(session, agent_id, 0, {3: [0.5, None], 4: [1.0]})
        record_validation_forecasts(session, agent_id, 0, {4: [0.25], 7: [None]})
    with session_scope(engine) as session:
        assert validation_forecasts(session, agent_id, 0) == {
            3: (0.5, None),
            4: (0.25,),
            7: (None,),
        }


AGENT = sa.table(
    "agent",
    sa.column("name", sa.String()),
    sa.column("base_model", sa.String()),
    sa.column("backend", sa.String()),
    sa.column("generation", JSONType),
    sa.column("created_at", UTCDateTime()),
)
POLICY_VERSION = sa.table(
    "policy_version",
    sa.column("agent_id", sa.Integer()),
    sa.column("version", sa.Integer()),
    sa.column("parent_version", sa.Integer()),
    sa.column("checkpoint_path", sa.String()),
    sa.column("checkpoint_sha256", sa.String()),
    sa.column("created_at", UTCDateTime()),
)


def _migrate(url: str) -> None:
    engine = make_engine(url)
    try:
        upgrade_database(engine, "0007")
        with engine.begin() as connection:  # an agent and two versions as 0007 stored them
            connection.execute(
                AGENT.insert().values(
                    name="old", base_model="m", backend="local", generation={}, created_at=CREATED
                )
            )
            agent_id = connection.scalar(text("SELECT id FROM agent"))
            connection.execute(
                POLICY_VERSION.insert(),
                [
                    {
                        "agent_id": agent_id,
                        "version": v,
                        "parent_version": None if v == 0 else v - 1,
                        "checkpoint_path": f"/ckpt/v{v}",
                        "checkpoint_sha256": "",
                        "created_at": CREATED,
                    }
                    for v in (0, 1)
                ],
            )
        upgrade_database(engine)
        assert current_revision(engine) == "0009"
        with session_scope(engine) as session:
            versions = list_policy_versions(session, agent_id)
            assert [(v.version, v.status, v.status_reason) for v in versions] == [
                (0, VersionStatus.PROMOTED, ""),
                (1, VersionStatus.PROMOTED, ""),
            ]
            assert all(v.validation_questions == 0 and v.validation_brier is None for v in versions)
            assert served_policy_version(session, agent_id).version == 1
            assert validation_forecasts(session, agent_id, 1) == {}
    finally:
        engine.dispose()


def test_migration_0008_makes_earlier_versions_promoted(tmp_path, postgres_url) -> None:
    server = postgres_url.rsplit("/", 1)[0]
    name = f"fw_m8_{uuid.uuid4().hex[:10]}"
    admin = make_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        _migrate(f"sqlite:///{tmp_path / 'm8.db'}")
        _migrate(f"{server}/{name}")
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
