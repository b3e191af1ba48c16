"""Every question kind's answer round-trips through the rollout table on Postgres (COPY) and
SQLite: P(yes), the chosen option and its probability vector (migration 0005), the quantiles;
and migration 0005 gives rollouts stored before it an empty vector without losing the
backfill queue's trigger."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import insert, select, text

from futureworld.domain import (
    Agent,
    NumericSpec,
    Outcome,
    OutcomeStatus,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)
from storage.engine import current_revision, make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import (
    list_questions,
    record_outcomes,
    resolved_history,
    upsert_questions,
)
from storage.repositories.rewards import rollout_answers
from storage.repositories.rollouts import _rollout_values, insert_rollouts, load_trajectories
from storage.tables import AgentRow, BackfillQueueRow, RolloutRow

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _questions() -> list[Question]:
    common = {"created_at": T0, "info_cutoff_at": T0, "source": "test"}
    return [
        Question(external_id="b", title="Will it rain?", **common),
        Question(
            external_id="c",
            title="Which team wins?",
            kind=QuestionKind.CHOICE,
            options=("North", "South", "East"),
            **common,
        ),
        Question(
            external_id="n",
            title="How many goals?",
            kind=QuestionKind.NUMERIC,
            extra=NumericSpec(lower=0.0, upper=10.0).to_extra(),
            **common,
        ),
    ]


def _answers(ids: dict[str, int], agent_id: int) -> list[Trajectory]:
    common = {"agent_id": agent_id, "policy_version": 0, "completion_token_ids": ()}
    return [
        Trajectory(question_id=ids["b"], sample_index=0, p_yes=0.3, **common),
        Trajectory(
            question_id=ids["c"],
            sample_index=0,
            p_yes=0.5,
            choice=1,
            probabilities=(0.2, 0.5, 0.3),
            **common,
        ),
        Trajectory(
            question_id=ids["n"],
            sample_index=0,
            quantiles=(1.0, 2.0, 3.0, 4.5, 8.0),
            **common,
        ),
        Trajectory(
            question_id=ids["c"], sample_index=1, parse_status=ParseStatus.BAD_SUM, **common
        ),
    ]


def test_every_kinds_answer_round_trips(engine) -> None:
    with session_scope(engine) as session:
        upsert_questions(session, _questions())
        ids = {q.external_id: q.id for q in list_questions(session)}
        agent = ensure_agent(session, Agent(name="a", base_model="m", backend="local"))
    answers = _answers(ids, agent.id)
    with session_scope(engine) as session:
        assert insert_rollouts(session, answers) == 4
    with session_scope(engine) as session:
        rollout_ids = sorted(session.scalars(select(RolloutRow.id)))
        loaded = load_trajectories(session, rollout_ids)
        light = rollout_answers(session, rollout_ids)
    for stored in (loaded, [light[i] for i in rollout_ids]):
        key = {(t.question_id, t.sample_index): t for t in stored}
        for original in answers:
            got = key[(original.question_id, original.sample_index)]
            assert (got.p_yes, got.choice, got.probabilities, got.quantiles, got.parse_status) == (
                original.p_yes,
                original.choice,
                original.probabilities,
                original.quantiles,
                original.parse_status,
            )


def test_migration_0005_gives_earlier_rollouts_an_empty_vector(tmp_path, postgres_url) -> None:
    server = postgres_url.rsplit("/", 1)[0]
    name = f"fw_m5_{uuid.uuid4().hex[:10]}"
    admin = make_engine(f"{server}/test", isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        for url in (f"sqlite:///{tmp_path / 'm5.db'}", f"{server}/{name}"):
            engine = make_engine(url)
            upgrade_database(engine, "0004")
            with session_scope(engine) as session:
                upsert_questions(session, _questions()[:1])
                [question] = list_questions(session)
                # the agent row as revision 0004 stored it (policy_version has later columns)
                agent_id = session.execute(
                    insert(AgentRow.__table__).values(
                        name="a", base_model="m", backend="local", generation={},
                        created_at=datetime(2026, 1, 1, tzinfo=UTC),
                    )
                ).inserted_primary_key[0]  # fmt: skip
            old = Trajectory(
                question_id=question.id, agent_id=agent_id, policy_version=0, sample_index=0
            )
            values = {k: v for k, v in _rollout_values(old).items() if k != "probabilities"}
            values["p_yes"] = 0.4
            with engine.begin() as connection:  # a rollout as revision 0004 stored it
                connection.execute(insert(RolloutRow.__table__).values(values))
            upgrade_database(engine)
            assert current_revision(engine) == "0009"
            with session_scope(engine) as session:
                [stored] = load_trajectories(session, list(session.scalars(select(RolloutRow.id))))
                assert stored.p_yes == 0.4 and stored.probabilities == ()
                later = Trajectory(
                    question_id=question.id,
                    agent_id=agent_id,
                    policy_version=0,
                    sample_index=1,
                    choice=0,
                    p_yes=0.9,
                    probabilities=(0.9, 0.1),
                )
                assert insert_rollouts(session, [later]) == 1
            with session_scope(engine) as session:  # the queue trigger survived the migration
                assert len(session.scalars(select(BackfillQueueRow.rollout_id)).all()) == 2
            engine.dispose()
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_resolved_history_holds_binary_outcomes_only(engine) -> None:
    """Base rates read it: an option index or a number is no YES frequency."""
    with session_scope(engine) as session:
        upsert_questions(session, _questions())
        ids = {q.external_id: q.id for q in list_questions(session)}
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=ids[key],
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=value,
                    resolved_at=T0,
                )
                for key, value in (("b", 1.0), ("c", 2.0), ("n", 7.5))
            ],
        )
    with session_scope(engine) as session:
        assert resolved_history(session) == [("test", T0, 1.0)]
