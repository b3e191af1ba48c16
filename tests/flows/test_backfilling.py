"""The backfill stage on real Postgres and SQLite: exactly once per (rollout, reward function,
outcome revision) for binary, choice and numeric questions; re-resolutions, late rollouts and
annulments; an unscorable outcome reported while the rest goes on; concurrent backfills on
Postgres."""

from __future__ import annotations

import random
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select

from flows.stages.backfilling import BackfillReport, backfill_rewards, reward_functions_by_kind
from futureworld.domain import (
    Agent,
    Outcome,
    OutcomeStatus,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)
from futureworld.rewards import REWARD_FUNCTIONS, RewardFn
from storage.engine import make_engine, session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.backfill_queue import queue_rollouts, rollouts_missing_rewards
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.repositories.rewards import current_rewards
from storage.repositories.rollouts import insert_rollouts, trajectory_from_row
from storage.tables import BackfillQueueRow, PipelineEventRow, RewardRow, RolloutRow
from tests.flows.conftest import make_context

T0 = datetime(2026, 3, 1, tzinfo=UTC)
KINDS = (QuestionKind.BINARY, QuestionKind.CHOICE, QuestionKind.NUMERIC)
SAMPLES = 3
REWARDS_PER_ROLLOUT = {QuestionKind.BINARY: 2, QuestionKind.CHOICE: 1, QuestionKind.NUMERIC: 1}


def _question(i: int, kind: QuestionKind) -> Question:
    return Question(
        source="test",
        external_id=f"{kind}-{i}",
        title=f"Question {i}",
        kind=kind,
        options=("red", "green", "blue") if kind is QuestionKind.CHOICE else (),
        extra={"numeric": {"lower": 0.0, "upper": 20.0}} if kind is QuestionKind.NUMERIC else {},
        created_at=T0,
        info_cutoff_at=T0,
        close_at=T0 + timedelta(days=1),
    )


def _rollout(question: Question, agent_id: int, sample: int) -> Trajectory:
    answer: dict[str, object] = {"p_yes": 0.2 + 0.3 * (sample % 3)}
    if question.kind is QuestionKind.CHOICE:
        answer["choice"] = sample % 3
    if question.kind is QuestionKind.NUMERIC:
        answer = {"quantiles": tuple(float(sample + k) for k in (1, 3, 5, 7, 9))}
    return Trajectory(
        question_id=question.id, agent_id=agent_id, policy_version=0, sample_index=sample, **answer
    )


def _outcome(question: Question, value: float | None) -> Outcome:
    return Outcome(
        question_id=question.id,
        revision=0,
        status=OutcomeStatus.RESOLVED if value is not None else OutcomeStatus.ANNULLED,
        value=value,
        resolved_at=T0 + timedelta(days=2),
    )


def _value(question: Question) -> float:
    return {QuestionKind.BINARY: 1.0, QuestionKind.CHOICE: 2.0, QuestionKind.NUMERIC: 6.5}[
        question.kind
    ]


def _world(engine, per_kind: int = 2) -> tuple[list[Question], int]:
    with session_scope(engine) as session:
        upsert_questions(session, [_question(i, k) for k in KINDS for i in range(per_kind)])
        questions = list_questions(session)
        agent = ensure_agent(session, Agent(name="a", base_model="m", backend="local"))
        insert_rollouts(
            session, [_rollout(q, agent.id, s) for q in questions for s in range(SAMPLES)]
        )
    return questions, agent.id


def _count(engine, statement) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(statement) or 0)


def _nothing_left(engine) -> None:
    with session_scope(engine) as session:
        assert rollouts_missing_rewards(session, reward_functions_by_kind()) == []


def test_backfill_is_exactly_once_for_every_question_kind(engine, tmp_path) -> None:
    ctx = make_context(engine, tmp_path)
    questions, agent_id = _world(engine)
    assert backfill_rewards(ctx) == BackfillReport()  # nothing resolved yet
    with session_scope(engine) as session:
        record_outcomes(session, [_outcome(q, _value(q)) for q in questions])
    first = backfill_rewards(ctx)
    expected = sum(REWARDS_PER_ROLLOUT[q.kind] * SAMPLES for q in questions)
    assert (first.rollouts_scored, first.rewards_inserted, first.errors) == (18, expected, [])
    assert _count(engine, select(func.count()).select_from(RewardRow)) == expected
    assert _count(engine, select(func.count()).select_from(BackfillQueueRow)) == 0
    assert backfill_rewards(ctx) == BackfillReport()
    _nothing_left(engine)
    with session_scope(engine) as session:
        brier = current_rewards(session, "brier")
    assert sorted({round(r.value, 6) for r in brier.values()}) == [-0.64, -0.25, -0.04]

    # The choice question is re-resolved: its rollouts, and only they, are scored again.
    choice = next(q for q in questions if q.kind is QuestionKind.CHOICE)
    numeric = next(q for q in questions if q.kind is QuestionKind.NUMERIC)
    with session_scope(engine) as session:
        record_outcomes(session, [_outcome(choice, 0.0)])
        insert_rollouts(session, [_rollout(numeric, agent_id, SAMPLES)])  # a late rollout
    again = backfill_rewards(ctx)
    assert (again.rollouts_scored, again.rewards_inserted) == (SAMPLES + 1, SAMPLES + 1)
    with session_scope(engine) as session:
        revisions = session.execute(
            select(RewardRow.outcome_revision, func.count())
            .where(RewardRow.reward_fn == "rlcr")
            .group_by(RewardRow.outcome_revision)
        ).all()
    assert dict(revisions) == {1: 2 * SAMPLES, 2: SAMPLES}
    assert backfill_rewards(ctx) == BackfillReport()
    _nothing_left(engine)

    # An annulment voids the question's rewards once; nothing is scored for it.
    binary = questions[0]
    with session_scope(engine) as session:
        record_outcomes(session, [_outcome(binary, None)])
    annulled = backfill_rewards(ctx)
    assert (annulled.rollouts_scored, annulled.rewards_voided) == (0, 2 * SAMPLES)
    assert backfill_rewards(ctx) == BackfillReport()
    with session_scope(engine) as session:
        assert len(current_rewards(session, "brier")) == SAMPLES  # the other binary question


def test_an_unscorable_outcome_is_reported_and_the_rest_goes_on(engine, tmp_path) -> None:
    ctx = make_context(engine, tmp_path)
    questions, _ = _world(engine, per_kind=1)
    binary = questions[0]
    with session_scope(engine) as session:
        record_outcomes(
            session, [_outcome(binary, 0.5)] + [_outcome(q, _value(q)) for q in questions[1:]]
        )
    report = backfill_rewards(ctx)
    assert report.rollouts_scored == 2 * SAMPLES
    [error] = report.errors
    assert f"question {binary.external_id} (id {binary.id}) outcome revision 1" in error
    assert "expected 0 or 1" in error
    assert _count(engine, select(func.count()).select_from(PipelineEventRow)) == 1
    assert backfill_rewards(ctx).errors == [error]  # still queued, still reported

    with session_scope(engine) as session:
        record_outcomes(session, [_outcome(binary, 1.0)])  # the corrected revision
    fixed = backfill_rewards(ctx)
    assert (fixed.rollouts_scored, fixed.rewards_inserted, fixed.errors) == (SAMPLES, 6, [])
    _nothing_left(engine)


def test_a_queued_rollout_that_has_some_rewards_gets_only_the_missing_ones(
    engine, tmp_path
) -> None:
    """A rollout queued again though some of its rewards exist (a repair after a crash or a
    new reward function): backfill writes only the missing ones and keeps the existing ones
    as they were (on Postgres the plain insert of binary rewards fails on the unique key and
    the batch is written again skipping what exists)."""
    ctx = make_context(engine, tmp_path)
    questions, _ = _world(engine, per_kind=1)
    with session_scope(engine) as session:
        record_outcomes(session, [_outcome(q, _value(q)) for q in questions])
    backfill_rewards(ctx)
    binary = questions[0]
    with session_scope(engine) as session:
        rows = session.scalars(
            select(RewardRow).join(RolloutRow).where(RolloutRow.question_id == binary.id)
        ).all()
        kept = {(r.rollout_id, r.reward_fn): r.value for r in rows}
        lost = [r for r in rows if r.reward_fn == "log_score" and r.rollout_id % 2 == 0]
        for row in lost:
            session.delete(row)
        session.flush()
        queue_rollouts(session, rollouts_missing_rewards(session, reward_functions_by_kind()))
    repaired = backfill_rewards(ctx)
    assert (repaired.rollouts_scored, repaired.rewards_inserted) == (len(lost), len(lost))
    with session_scope(engine) as session:
        rows = session.scalars(
            select(RewardRow).join(RolloutRow).where(RolloutRow.question_id == binary.id)
        ).all()
        assert {(r.rollout_id, r.reward_fn): r.value for r in rows} == kept
    assert _count(engine, select(func.count()).select_from(BackfillQueueRow)) == 0
    _nothing_left(engine)


def test_concurrent_backfills_write_each_reward_once(postgres_url: str, tmp_path) -> None:
    from tests.conftest import _truncate_postgres

    engine = make_engine(postgres_url)
    _truncate_postgres(engine)
    questions, _ = _world(engine, per_kind=20)
    with session_scope(engine) as session:
        record_outcomes(session, [_outcome(q, _value(q)) for q in questions])
    reports: list[BackfillReport] = []
    barrier = threading.Barrier(3)

    def run() -> None:
        barrier.wait()
        reports.append(backfill_rewards(make_context(engine, tmp_path), batch_size=7))

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    expected = sum(REWARDS_PER_ROLLOUT[q.kind] * SAMPLES for q in questions)
    assert len(reports) == 3 and all(r.errors == [] for r in reports)
    assert sum(r.rewards_inserted for r in reports) == expected
    assert _count(engine, select(func.count()).select_from(RewardRow)) == expected
    assert _count(engine, select(func.count()).select_from(BackfillQueueRow)) == 0
    engine.dispose()


def test_binary_rewards_scored_in_postgres_equal_the_python_functions(
    postgres_url: str, tmp_path
) -> None:
    """On Postgres binary questions are scored by the SQL twins of their reward functions:
    every stored Brier reward equals brier_reward bit for bit, every log score log_score_reward
    to 1e-15, components included, for answers across [0, 1] (clipped ends included),
    unparseable ones and both outcomes; the SQLite path runs the Python functions themselves."""
    from tests.conftest import _truncate_postgres

    engine = make_engine(postgres_url)
    _truncate_postgres(engine)
    rng = random.Random(7)
    answers = [0.0, 1.0, 0.004, 0.995, 0.5, 0.01, 0.99] + [rng.random() for _ in range(33)]
    with session_scope(engine) as session:
        upsert_questions(session, [_question(i, QuestionKind.BINARY) for i in range(2)])
        questions = list_questions(session)
        agent = ensure_agent(session, Agent(name="a", base_model="m", backend="local"))
        rollouts = [
            Trajectory(
                question_id=q.id,
                agent_id=agent.id,
                policy_version=0,
                sample_index=i,
                p_yes=None if i % 9 == 4 else p,
                parse_status=ParseStatus.MISSING if i % 9 in (4, 5) else ParseStatus.OK,
            )
            for q in questions
            for i, p in enumerate(answers)
        ]
        insert_rollouts(session, rollouts)
        record_outcomes(session, [_outcome(q, float(n)) for n, q in enumerate(questions)])
    report = backfill_rewards(make_context(engine, tmp_path))
    assert (report.rollouts_scored, report.rewards_inserted, report.errors) == (80, 160, [])
    with session_scope(engine) as session:
        stored = session.execute(select(RewardRow, RolloutRow).join(RolloutRow)).all()
        outcomes = {q.id: _outcome(q, float(n)) for n, q in enumerate(questions)}
        by_id = {q.id: q for q in questions}
        assert len(stored) == 160
        for reward, row in stored:
            trajectory = trajectory_from_row(row)
            question = by_id[row.question_id]
            outcome = replace(outcomes[row.question_id], revision=reward.outcome_revision)
            want = REWARD_FUNCTIONS[RewardFn(reward.reward_fn)](trajectory, question, outcome)
            assert want is not None
            if reward.reward_fn == "brier":
                assert reward.value == want.value
            else:
                assert reward.value == pytest.approx(want.value, rel=1e-15, abs=1e-15)
            assert reward.components == pytest.approx(want.components, rel=1e-15, abs=1e-15)
    engine.dispose()
