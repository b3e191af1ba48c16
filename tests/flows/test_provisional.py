"""The provisional-rewards stage (provisional_consensus) on real Postgres and SQLite: one
reliability-weighted consensus of the group's and earlier versions' forecasts, shared by the
group, written once as provisional rewards at revision 0; voided when the outcome is revealed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from flows.cli import app
from flows.stages.backfilling import backfill_rewards
from flows.stages.provisional import with_provisional_groups, write_provisional_rewards
from futureworld.domain import (
    Agent,
    Outcome,
    OutcomeStatus,
    ParseStatus,
    PolicyVersion,
    Question,
    Trajectory,
)
from futureworld.rewards import UNPARSEABLE_REWARD
from futureworld.rl.advantages import version_reliability
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent, register_policy_version
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.repositories.rollouts import insert_rollouts
from storage.repositories.training import select_replay_batch
from storage.tables import RewardRow, RolloutRow
from tests.flows.conftest import make_context

T0 = datetime(2026, 3, 1, 6, tzinfo=UTC)


def _question(name: str) -> Question:
    return Question(
        source="test",
        external_id=name,
        title=f"Will {name} happen?",
        created_at=T0,
        info_cutoff_at=T0,
        close_at=T0 + timedelta(days=6),
    )


def _rollout(question_id: int, agent_id: int, version: int, sample: int, p: float | None):
    return Trajectory(
        question_id=question_id,
        agent_id=agent_id,
        policy_version=version,
        sample_index=sample,
        p_yes=p,
        parse_status=ParseStatus.OK if p is not None else ParseStatus.MISSING,
        as_of=T0 + timedelta(days=version),
    )


def _world(engine) -> tuple[int, int, int]:
    """Agent with versions 0 and 1; `open` forecast by both, `done` by version 0 and resolved
    yes at T0 + 1 day (version 0's track record)."""
    with session_scope(engine) as session:
        upsert_questions(session, [_question("open"), _question("done")])
        ids = {q.external_id: q.id for q in list_questions(session)}
        agent = ensure_agent(session, Agent(name="learner", base_model="m", backend="local"))
        register_policy_version(
            session,
            PolicyVersion(agent_id=agent.id, version=1, parent_version=0, checkpoint_path="m"),
        )
        insert_rollouts(
            session,
            [
                _rollout(ids["open"], agent.id, 0, 0, 0.2),
                _rollout(ids["open"], agent.id, 0, 1, 0.6),
                _rollout(ids["open"], agent.id, 0, 2, None),
                _rollout(ids["open"], agent.id, 1, 0, 0.8),
                _rollout(ids["open"], agent.id, 1, 1, 0.4),
                _rollout(ids["done"], agent.id, 0, 0, 0.9),
                _rollout(ids["done"], agent.id, 0, 1, 0.7),
            ],
        )
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=ids["done"],
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=1.0,
                    resolved_at=T0 + timedelta(days=1),
                )
            ],
        )
    return agent.id, ids["open"], ids["done"]


def _provisional(engine) -> dict[tuple[int, int, int], RewardRow]:
    """(question, version, sample) → provisional reward row."""
    with session_scope(engine) as session:
        rows = session.execute(
            select(RewardRow, RolloutRow.question_id, RolloutRow.policy_version,
                   RolloutRow.sample_index)
            .join(RolloutRow, RolloutRow.id == RewardRow.rollout_id)
            .where(RewardRow.provisional.is_(True))
        ).all()  # fmt: skip
        for row, *_ in rows:
            session.expunge(row)
    return {(q, v, s): row for row, q, v, s in rows}


def _brier_expectation(p: float, y_hat: float) -> float:
    return -((p - y_hat) ** 2) - y_hat * (1 - y_hat)


def test_provisional_rewards_are_the_groups_shared_reliability_weighted_consensus(engine, tmp_path):
    _agent, open_id, done_id = _world(engine)
    ctx = make_context(engine, tmp_path, as_of=T0 + timedelta(days=2))
    report = write_provisional_rewards(ctx, "learner")
    assert (report.rewards_written, report.without_consensus, report.errors) == (5, 0, [])
    got = _provisional(engine)
    assert all(q == open_id for q, _v, _s in got)  # the resolved question gets none
    w0 = version_reliability((0.9 - 1) ** 2 + (0.7 - 1) ** 2, 2)  # version 0 on `done`
    w1 = version_reliability(0.0, 0)  # version 1: nothing resolved yet
    # Version 0's group: its own two parsed forecasts, one consensus for both.
    assert got[(open_id, 0, 0)].value == pytest.approx(_brier_expectation(0.2, 0.4))
    assert got[(open_id, 0, 1)].value == pytest.approx(_brier_expectation(0.6, 0.4))
    assert got[(open_id, 0, 2)].value == pytest.approx(UNPARSEABLE_REWARD)
    # Version 1's group: version 0's forecasts (weight w0) and its own two (w1), shared.
    y_hat = (w0 * 0.2 + w0 * 0.6 + w1 * 0.8 + w1 * 0.4) / (2 * w0 + 2 * w1)
    for sample, p in ((0, 0.8), (1, 0.4)):
        assert got[(open_id, 1, sample)].value == pytest.approx(_brier_expectation(p, y_hat))
        assert got[(open_id, 1, sample)].components["consensus"] == pytest.approx(y_hat)
    assert all(r.outcome_revision == 0 and not r.voided for r in got.values())
    assert done_id not in {q for q, _v, _s in got}


def test_the_stage_is_idempotent(engine, tmp_path):
    _world(engine)
    ctx = make_context(engine, tmp_path, as_of=T0 + timedelta(days=2))
    write_provisional_rewards(ctx, "learner")
    before = {k: r.value for k, r in _provisional(engine).items()}
    again = write_provisional_rewards(ctx, "learner")
    assert (again.rewards_written, again.rewards_voided) == (0, 0)
    assert {k: r.value for k, r in _provisional(engine).items()} == before


def test_forecasts_made_after_the_as_of_have_no_vote_and_no_reward(engine, tmp_path):
    _world(engine)
    # As of day 0.5, version 1 (made on day 1) has not forecast yet, and `done` is still
    # unresolved (revealed on day 1): version 0's three and two forecasts get theirs.
    ctx = make_context(engine, tmp_path, as_of=T0 + timedelta(hours=12))
    assert write_provisional_rewards(ctx, "learner").rewards_written == 5
    assert {v for _q, v, _s in _provisional(engine)} == {0}


def test_a_lone_forecast_has_no_consensus(engine, tmp_path):
    with session_scope(engine) as session:
        upsert_questions(session, [_question("lone")])
        (question,) = list_questions(session)
        agent = ensure_agent(session, Agent(name="learner", base_model="m", backend="local"))
        insert_rollouts(session, [_rollout(question.id, agent.id, 0, 0, 0.3)])
    report = write_provisional_rewards(make_context(engine, tmp_path, as_of=T0), "learner")
    assert (report.rewards_written, report.without_consensus) == (0, 1)


def test_revealed_outcomes_void_the_provisional_rewards(engine, tmp_path):
    _agent, open_id, _done = _world(engine)
    ctx = make_context(engine, tmp_path, as_of=T0 + timedelta(days=2))
    write_provisional_rewards(ctx, "learner")
    with session_scope(engine) as session:
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=open_id,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=0.0,
                    resolved_at=T0 + timedelta(days=3),
                )
            ],
        )
    # Not yet revealed at day 2.5: nothing voided.
    early = write_provisional_rewards(
        make_context(engine, tmp_path, as_of=T0 + timedelta(days=2, hours=12)), "learner"
    )
    assert early.rewards_voided == 0
    late = write_provisional_rewards(
        make_context(engine, tmp_path, as_of=T0 + timedelta(days=4)), "learner"
    )
    assert (late.rewards_voided, late.rewards_written) == (5, 0)
    assert all(r.voided for r in _provisional(engine).values())


def test_the_provisional_command_writes_them_and_names_an_unknown_agent(engine, db_url, tmp_path):
    _world(engine)
    env = {"FW_DATA_DIR": str(tmp_path)}
    as_of = (T0 + timedelta(days=2)).isoformat()
    args = ["provisional", "--as-of", as_of, "--db", db_url]
    result = CliRunner().invoke(app, [*args, "--agent", "learner"], env=env)
    assert result.exit_code == 0, result.output
    assert "learner: 5 provisional rewards written, 0 voided" in result.output
    unknown = CliRunner().invoke(app, [*args, "--agent", "nobody"], env=env)
    assert unknown.exit_code == 2
    assert "unknown agent" in unknown.output


def test_provisional_replay_takes_a_group_once_even_when_its_outcome_is_stored_after_the_as_of(
    engine, tmp_path
):
    agent_id, open_id, _done = _world(engine)
    day2 = make_context(engine, tmp_path, as_of=T0 + timedelta(days=2))
    write_provisional_rewards(day2, "learner")
    with session_scope(engine) as session:
        provisional_only = with_provisional_groups(
            session,
            select_replay_batch(session, agent_id, reward_fn="brier", current_version=1),
            agent_id,
            reward_fns=["brier"],
            current_version=1,
            as_of=day2.as_of,
            max_groups=None,
            reuse=False,
        )
    # Before any real reward: `done` has none backfilled, `open`'s two groups are provisional.
    assert [(g[0].trajectory.question_id, len(g)) for g in provisional_only.groups] == [
        (open_id, 3),
        (open_id, 2),
    ]
    # Each carries the consensus its rewards were computed with (siop's target).
    stored = _provisional(engine)
    for group in provisional_only.groups:
        for rollout in group:
            key = (open_id, rollout.trajectory.policy_version, rollout.trajectory.sample_index)
            assert rollout.consensus == stored[key].components.get("consensus")
    assert all(r.consensus is not None for g in provisional_only.groups for r in g)
    # `open` resolves with a resolved_at after day 2 and is backfilled: live replay (no as-of)
    # finds its real rewards while the day-2 provisional selection still sees it unresolved.
    with session_scope(engine) as session:
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=open_id,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=1.0,
                    resolved_at=T0 + timedelta(days=5),
                )
            ],
        )
    backfill_rewards(make_context(engine, tmp_path, as_of=T0 + timedelta(days=6)))
    with session_scope(engine) as session:
        real = select_replay_batch(session, agent_id, reward_fn="brier", current_version=1)
        merged = with_provisional_groups(
            session,
            real,
            agent_id,
            reward_fns=["brier"],
            current_version=1,
            as_of=day2.as_of,
            max_groups=None,
            reuse=False,
        )
    keys = [g[0].trajectory.group_key for g in merged.groups]
    assert len(keys) == len(set(keys)) == len(real.groups)
    assert all(r.outcome_revision >= 1 for g in merged.groups for r in g)
