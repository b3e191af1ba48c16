"""The backfill queue on real Postgres and SQLite: what the pending query returns for binary,
choice and numeric questions, that it always agrees with the full-history definition
(`rollouts_missing_rewards`), that it names only new work, and that migration 0003 seeds it
from an existing database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from futureworld.domain import (
    Agent,
    Outcome,
    OutcomeStatus,
    Question,
    QuestionKind,
    Reward,
    Trajectory,
)
from futureworld.rewards import rewards_for_kind
from storage.engine import current_revision, make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent
from storage.repositories.backfill_queue import (
    PendingScore,
    queue_rollouts,
    rollouts_missing_rewards,
    rollouts_pending_rewards,
    settle_backfill_queue,
    void_annulled_rewards,
)
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.repositories.rewards import insert_rewards
from storage.repositories.rollouts import insert_rollouts
from storage.tables import BackfillQueueRow

T0 = datetime(2026, 3, 1, tzinfo=UTC)
APPLICABLE = {kind: [str(fn) for fn in rewards_for_kind(kind)] for kind in QuestionKind}
KINDS = (QuestionKind.BINARY, QuestionKind.CHOICE, QuestionKind.NUMERIC)


def _question(i: int, kind: QuestionKind) -> Question:
    extra = {"numeric": {"lower": 0.0, "upper": 20.0}} if kind is QuestionKind.NUMERIC else {}
    options = ("red", "green", "blue") if kind is QuestionKind.CHOICE else ()
    return Question(
        source="test",
        external_id=f"{kind}-{i}",
        title=f"Question {i}",
        kind=kind,
        options=options,
        extra=extra,
        created_at=T0,
        info_cutoff_at=T0,
        close_at=T0 + timedelta(days=1),
    )


def _rollout(question: Question, agent_id: int, sample: int) -> Trajectory:
    answer: dict[str, object] = {"p_yes": 0.25 + 0.1 * sample}
    if question.kind is QuestionKind.CHOICE:
        answer["choice"] = sample % 3
    if question.kind is QuestionKind.NUMERIC:
        answer = {"quantiles": tuple(float(sample + k) for k in (1, 3, 5, 7, 9))}
    return Trajectory(
        question_id=question.id, agent_id=agent_id, policy_version=0, sample_index=sample, **answer
    )


def _outcome(question: Question, value: float | None, *, annul: bool = False) -> Outcome:
    return Outcome(
        question_id=question.id,
        revision=0,
        status=OutcomeStatus.ANNULLED if annul else OutcomeStatus.RESOLVED,
        value=value,
        resolved_at=T0 + timedelta(days=2),
    )


def _resolution(question: Question) -> float:
    return {QuestionKind.BINARY: 1.0, QuestionKind.CHOICE: 2.0, QuestionKind.NUMERIC: 6.5}[
        question.kind
    ]


def _world(session, per_kind: int = 2, samples: int = 3) -> tuple[list[Question], int]:
    upsert_questions(session, [_question(i, k) for k in KINDS for i in range(per_kind)])
    questions = list_questions(session)
    agent = ensure_agent(session, Agent(name="a", base_model="m", backend="local"))
    insert_rollouts(session, [_rollout(q, agent.id, s) for q in questions for s in range(samples)])
    return questions, agent.id


def _rewards_for(pending: list[PendingScore], kinds: dict[int, QuestionKind]) -> list[Reward]:
    return [
        Reward(
            rollout_id=p.rollout_id, reward_fn=fn, outcome_revision=p.outcome_revision, value=-0.1
        )
        for p in pending
        for fn in APPLICABLE[kinds[p.question_id]]
    ]


def _agree(session) -> list[PendingScore]:
    """The queue-backed pending query and the full-history definition return the same."""
    pending = rollouts_pending_rewards(session, APPLICABLE)
    assert pending == rollouts_missing_rewards(session, APPLICABLE)
    return pending


def test_pending_query_is_correct_for_every_question_kind(engine) -> None:
    with session_scope(engine) as session:
        questions, _ = _world(session)
        kinds = {q.id: q.kind for q in questions}
        assert _agree(session) == []  # queued, but nothing is resolved yet
        record_outcomes(session, [_outcome(q, _resolution(q)) for q in questions])
        pending = _agree(session)
        assert len(pending) == 18
        assert {p.outcome_revision for p in pending} == {1}

        # A binary rollout with its Brier but not its log score is still pending; one with
        # every applicable reward is not, whatever its kind.
        binary = [p for p in pending if kinds[p.question_id] is QuestionKind.BINARY]
        insert_rewards(
            session,
            [
                Reward(rollout_id=p.rollout_id, reward_fn="brier", outcome_revision=1, value=-0.1)
                for p in binary
            ],
        )
        assert _agree(session) == pending
        done = [pending[0], pending[7], pending[14]]  # binary, choice, numeric
        assert {kinds[p.question_id] for p in done} == set(KINDS)
        insert_rewards(session, _rewards_for(done, kinds))
        remaining = _agree(session)
        assert remaining == [p for p in pending if p not in done]

        # Rewards of a function that does not apply to the kind do not count.
        choice = [p for p in remaining if kinds[p.question_id] is QuestionKind.CHOICE]
        insert_rewards(
            session,
            [
                Reward(rollout_id=p.rollout_id, reward_fn="brier", outcome_revision=1, value=-0.1)
                for p in choice
            ],
        )
        assert _agree(session) == remaining

        insert_rewards(session, _rewards_for(remaining, kinds))
        assert _agree(session) == []
        assert settle_backfill_queue(session, pending) == 18
        assert session.scalars(select(BackfillQueueRow)).all() == []


def test_a_new_revision_and_a_late_rollout_are_the_only_pending_work(engine) -> None:
    with session_scope(engine) as session:
        questions, agent_id = _world(session)
        kinds = {q.id: q.kind for q in questions}
        record_outcomes(session, [_outcome(q, _resolution(q)) for q in questions])
        scored = _agree(session)
        insert_rewards(session, _rewards_for(scored, kinds))
        settle_backfill_queue(session, scored)
        assert _agree(session) == []

        # The choice question is re-resolved: its rollouts are pending at revision 2.
        choice = next(q for q in questions if q.kind is QuestionKind.CHOICE)
        record_outcomes(session, [_outcome(choice, 0.0)])
        pending = _agree(session)
        assert {(p.question_id, p.outcome_revision) for p in pending} == {(choice.id, 2)}
        assert len(pending) == 3

        # A rollout stored after its question was scored is pending on its own.
        numeric = next(q for q in questions if q.kind is QuestionKind.NUMERIC)
        insert_rollouts(session, [_rollout(numeric, agent_id, 9)])
        late = [p for p in _agree(session) if p.question_id == numeric.id]
        assert len(late) == 1 and late[0].outcome_revision == 1

        # An annulment leaves nothing to score and voids the question's rewards.
        binary = next(q for q in questions if q.kind is QuestionKind.BINARY)
        record_outcomes(session, [_outcome(binary, None, annul=True)])
        assert binary.id not in {p.question_id for p in _agree(session)}
        assert void_annulled_rewards(session) == 6  # 3 rollouts × (brier, log_score)
        assert void_annulled_rewards(session) == 0


def test_queue_rollouts_repairs_what_the_queue_lost(engine) -> None:
    with session_scope(engine) as session:
        questions, _ = _world(session, per_kind=1, samples=2)
        record_outcomes(session, [_outcome(q, _resolution(q)) for q in questions])
        missing = rollouts_missing_rewards(session, APPLICABLE)
        session.execute(BackfillQueueRow.__table__.delete())
        assert rollouts_pending_rewards(session, APPLICABLE) == []
        assert queue_rollouts(session, missing) == 6
        assert queue_rollouts(session, missing) == 0
        assert _agree(session) == missing


def _migrate(engine, revision: str, *, down: bool = False) -> None:
    from alembic import command
    from alembic.config import Config

    from storage.engine import MIGRATIONS_DIR

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        (command.downgrade if down else command.upgrade)(config, revision)


def test_migration_0003_queues_what_an_existing_database_left_unscored(db_url: str) -> None:
    """The database is filled at head, taken back to 0002 (which keeps its rows and drops
    the queue) and brought to head again: 0003 seeds the queue from what it finds."""
    engine = make_engine(db_url)
    head = current_revision(engine)
    with session_scope(engine) as session:
        questions, _ = _world(session, per_kind=1, samples=2)
        kinds = {q.id: q.kind for q in questions}
        binary, choice, numeric = questions
        record_outcomes(session, [_outcome(binary, 1.0), _outcome(choice, 1.0)])
        scored = rollouts_missing_rewards(session, APPLICABLE)
        record_outcomes(session, [_outcome(binary, 0.0)])  # binary now at revision 2
        # Binary was scored at its old revision 1 only, choice at its current one.
        insert_rewards(session, _rewards_for(scored, kinds))
    _migrate(engine, "0002", down=True)
    try:
        assert current_revision(engine) == "0002"
    finally:
        upgrade_database(engine)
    assert current_revision(engine) == head
    with session_scope(engine) as session:
        queued = {
            (r.question_id, r.outcome_revision) for r in session.scalars(select(BackfillQueueRow))
        }
        assert queued == {(binary.id, 0), (numeric.id, 0)}
        pending = _agree(session)
        assert {(p.question_id, p.outcome_revision) for p in pending} == {(binary.id, 2)}
    engine.dispose()


def test_a_revision_stored_while_scoring_keeps_the_rollout_queued(engine) -> None:
    with session_scope(engine) as session:
        questions, _ = _world(session, per_kind=1, samples=2)
        kinds = {q.id: q.kind for q in questions}
        binary = questions[0]
        record_outcomes(session, [_outcome(binary, 1.0)])
        scoring = _agree(session)  # a backfill read this …
        record_outcomes(session, [_outcome(binary, 0.0)])  # … then revision 2 arrived
        insert_rewards(session, _rewards_for(scoring, kinds))
        assert settle_backfill_queue(session, scoring) == 0
        pending = _agree(session)
        assert [(p.rollout_id, p.outcome_revision) for p in pending] == [
            (p.rollout_id, 2) for p in scoring
        ]


def test_rollout_answers_are_the_trajectory_but_its_tokens_and_circumstances(engine) -> None:
    from dataclasses import fields

    from storage.repositories.rewards import rollout_answers
    from storage.repositories.rollouts import load_trajectories

    not_read = {
        "prompt_token_ids",
        "completion_token_ids",
        "loss_mask",
        "behaviour_logprobs",
        "turns",
        "sampling",
        "timings",
        "created_at",
        "as_of",
    }
    with session_scope(engine) as session:
        _world(session, per_kind=1, samples=2)
        ids = list(session.scalars(select(BackfillQueueRow.rollout_id)))
        full = load_trajectories(session, ids)
        answers = rollout_answers(session, ids)
    assert len(full) == len(answers) == 6
    assert any(t.choice is not None for t in full) and any(t.quantiles for t in full)
    for trajectory in full:
        answer = answers[trajectory.id]
        for name in {f.name for f in fields(Trajectory)} - not_read:
            assert getattr(answer, name) == getattr(trajectory, name), name
