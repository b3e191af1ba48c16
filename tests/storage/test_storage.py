"""Storage on real Postgres and SQLite: migrations, idempotent upserts, outcome revisions,
bulk rollouts, rewards exactly once, and search that never leaks the future."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import inspect

from futureworld.domain import (
    Agent,
    Article,
    Outcome,
    OutcomeStatus,
    Question,
    QuestionKind,
    QuestionStatus,
    Reward,
    Trajectory,
    Turn,
)
from storage.engine import current_revision, make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent, latest_policy_version
from storage.repositories.articles import insert_articles
from storage.repositories.backfill_queue import rollouts_pending_rewards, void_annulled_rewards
from storage.repositories.questions import (
    count_rows,
    latest_outcomes,
    list_questions,
    open_binary_questions,
    record_outcomes,
    upsert_questions,
)
from storage.repositories.rewards import current_rewards, insert_rewards
from storage.repositories.rollouts import insert_rollouts, load_trajectories
from storage.search import ArticleCorpus
from storage.tables import OutcomeRow, QuestionRow, RolloutRow, TurnRow

T0 = datetime(2026, 3, 1, tzinfo=UTC)
BRIER_ONLY = {QuestionKind.BINARY: ["brier"]}


def make_question(i: int, **overrides) -> Question:
    values = dict(
        source="test",
        external_id=f"q{i}",
        title=f"Will event {i} happen?",
        created_at=T0,
        info_cutoff_at=T0,
        close_at=T0 + timedelta(days=3),
        crowd_probability=0.4,
    )
    values.update(overrides)
    return Question(**values)


def test_migrations_run_from_empty(tmp_path, postgres_url: str) -> None:
    for url in (f"sqlite:///{tmp_path / 'empty.db'}", postgres_url):
        engine = make_engine(url)
        upgrade_database(engine)
        upgrade_database(engine)  # idempotent
        assert current_revision(engine) == "0009"
        names = set(inspect(engine).get_table_names())
        assert {
            "question",
            "article",
            "outcome",
            "agent",
            "policy_version",
            "rollout",
            "turn",
            "reward",
            "training_run",
            "train_step",
        } <= names
        for table in ("reward", "training_run"):  # the run's as-of beside the wall clock
            assert "made_at" in {c["name"] for c in inspect(engine).get_columns(table)}
        engine.dispose()


def test_question_upsert_is_idempotent_and_keeps_first_harvest(engine) -> None:
    with session_scope(engine) as session:
        first = upsert_questions(session, [make_question(i) for i in range(3)])
    with session_scope(engine) as session:
        again = upsert_questions(
            session, [make_question(i, crowd_probability=0.9) for i in range(4)]
        )
        questions = list_questions(session)
        assert count_rows(session, QuestionRow) == 4
    assert (first.inserted, again.inserted, again.existing) == (3, 1, 3)
    assert [q.crowd_probability for q in questions] == [0.4, 0.4, 0.4, 0.9]
    assert all(q.info_cutoff_at.tzinfo is not None for q in questions)


def test_outcome_revisions_only_on_change(engine) -> None:
    with session_scope(engine) as session:
        upsert_questions(session, [make_question(1)])
        qid = list_questions(session)[0].id
        yes = Outcome(
            question_id=qid,
            revision=0,
            status=OutcomeStatus.RESOLVED,
            value=1.0,
            resolved_at=T0 + timedelta(days=4),
        )
        assert len(record_outcomes(session, [yes])) == 1
        assert record_outcomes(session, [yes]) == []
        no = Outcome(
            question_id=qid,
            revision=0,
            status=OutcomeStatus.RESOLVED,
            value=0.0,
            resolved_at=T0 + timedelta(days=5),
        )
        [changed] = record_outcomes(session, [no])
        assert changed.revision == 2
        assert latest_outcomes(session)[qid].value == 0.0
        assert count_rows(session, OutcomeRow) == 2
        annul = Outcome(
            question_id=qid,
            revision=0,
            status=OutcomeStatus.ANNULLED,
            value=None,
            resolved_at=T0 + timedelta(days=6),
        )
        record_outcomes(session, [annul])
        assert list_questions(session)[0].status is QuestionStatus.ANNULLED


def test_open_binary_questions_are_those_posed_and_unresolved_as_of_newest_first(engine) -> None:
    day = timedelta(days=1)
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                make_question(1, info_cutoff_at=T0),
                make_question(2, info_cutoff_at=T0 + day),  # resolves on day 2
                make_question(3, info_cutoff_at=T0 + 2 * day),
                make_question(4, created_at=T0 + 5 * day, info_cutoff_at=T0 + 5 * day),
                make_question(
                    5,
                    kind=QuestionKind.CHOICE,
                    options=("North", "South"),
                    crowd_probability=None,
                ),
            ],
        )
        ids = {q.external_id: q.id for q in list_questions(session)}
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=ids["q2"],
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=1.0,
                    resolved_at=T0 + 2 * day,
                )
            ],
        )
        at = T0 + 3 * day
        assert [q.external_id for q in open_binary_questions(session, as_of=at, limit=None)] == [
            "q3",
            "q1",
        ]  # q2 resolved by then, q4 not yet posed, q5 a choice question
        assert [q.external_id for q in open_binary_questions(session, as_of=at, limit=1)] == ["q3"]
        before = open_binary_questions(session, as_of=T0 + day, limit=None)
        assert [q.external_id for q in before] == ["q2", "q1"]  # its outcome came later


def _trajectory(qid: int, agent_id: int, sample: int, n_tokens: int = 5) -> Trajectory:
    return Trajectory(
        question_id=qid,
        agent_id=agent_id,
        policy_version=0,
        sample_index=sample,
        prompt_token_ids=(1, 2, 3),
        completion_token_ids=tuple(range(10, 10 + n_tokens)),
        loss_mask=tuple(1 if i % 2 == 0 else 0 for i in range(n_tokens)),
        behaviour_logprobs=tuple(-0.5 * i if i % 2 == 0 else 0.0 for i in range(n_tokens)),
        turns=(
            Turn(index=0, role="assistant", text="<search>x</search>", token_start=0, token_end=1),
            Turn(
                index=1,
                role="tool",
                text="[1] x",
                token_start=1,
                token_end=2,
                tool_name="search",
                tool_args="x",
                tool_result_ids=(7,),
            ),
        ),
        p_yes=0.25,
        sampling={"temperature": 1.0},
        timings={"generate_s": 0.1},
    )


def test_rollouts_round_trip_token_for_token_and_never_duplicate(engine) -> None:
    with session_scope(engine) as session:
        upsert_questions(session, [make_question(1)])
        qid = list_questions(session)[0].id
        agent = ensure_agent(session, Agent(name="a", base_model="m", backend="local"))
        assert latest_policy_version(session, agent.id).version == 0
    trajectories = [_trajectory(qid, agent.id, s, n_tokens=4 + s) for s in range(4)]
    with session_scope(engine) as session:
        assert insert_rollouts(session, trajectories) == 4
    with session_scope(engine) as session:
        assert insert_rollouts(session, trajectories) == 0
        assert count_rows(session, RolloutRow) == 4
        assert count_rows(session, TurnRow) == 8
        ids = sorted(
            session.scalars(RolloutRow.__table__.select().with_only_columns(RolloutRow.id))
        )
        loaded = load_trajectories(session, ids)
    for original, stored in zip(trajectories, loaded, strict=True):
        assert stored.completion_token_ids == original.completion_token_ids
        assert stored.loss_mask == original.loss_mask
        assert stored.behaviour_logprobs == pytest.approx(original.behaviour_logprobs)
        assert stored.turns[1].tool_result_ids == (7,)
        assert stored.prompt_token_ids == (1, 2, 3)


def test_rewards_exactly_once_per_revision_and_voided_by_annulment(engine) -> None:
    with session_scope(engine) as session:
        upsert_questions(session, [make_question(1)])
        qid = list_questions(session)[0].id
        agent = ensure_agent(session, Agent(name="a", base_model="m", backend="local"))
        insert_rollouts(session, [_trajectory(qid, agent.id, s) for s in range(2)])
        assert rollouts_pending_rewards(session, BRIER_ONLY) == []
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=qid,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=1.0,
                    resolved_at=T0,
                )
            ],
        )
        pending = rollouts_pending_rewards(session, BRIER_ONLY)
        assert len(pending) == 2
        rewards = [
            Reward(rollout_id=p.rollout_id, reward_fn="brier", outcome_revision=1, value=-0.5625)
            for p in pending
        ]
        assert insert_rewards(session, rewards) == 2
        assert insert_rewards(session, rewards) == 0
        assert rollouts_pending_rewards(session, BRIER_ONLY) == []
        assert len(current_rewards(session, "brier")) == 2
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=qid,
                    revision=0,
                    status=OutcomeStatus.ANNULLED,
                    value=None,
                    resolved_at=T0,
                )
            ],
        )
        assert void_annulled_rewards(session) == 2
        assert void_annulled_rewards(session) == 0
        assert current_rewards(session, "brier") == {}


def test_search_never_returns_articles_after_the_cutoff(engine) -> None:
    cutoff = datetime(2026, 3, 10, 0, 0, tzinfo=UTC)
    times = {
        "before": cutoff - timedelta(hours=1),
        "exact": cutoff,
        "same-day-later": cutoff + timedelta(hours=23, minutes=59),
        "one-second-after": cutoff + timedelta(seconds=1),
    }
    articles = [
        Article(
            feed="f",
            guid=name,
            link=f"https://news.test/{name}",
            title=f"Reservoir flood warning {name}",
            summary="dam levels",
            published_at=at,
            fetched_at=at,
        )
        for name, at in times.items()
    ]
    with session_scope(engine) as session:
        assert insert_articles(session, articles) == 4
        assert insert_articles(session, articles) == 0
    corpus = ArticleCorpus(engine)
    found = {a.guid for a in corpus.search("reservoir flood", cutoff, k=10)}
    assert found == {"before", "exact"}
    # The same instant expressed in another time zone is the same cut-off.
    plus_five = cutoff.astimezone(__import__("datetime").timezone(timedelta(hours=5)))
    assert {a.guid for a in corpus.search("reservoir", plus_five, k=10)} == found
    ids = {a.guid: a.id for a in corpus.search("reservoir", cutoff + timedelta(days=2), k=10)}
    assert corpus.open(ids["one-second-after"], cutoff) is None
    assert corpus.open(ids["exact"], cutoff).guid == "exact"
    with pytest.raises(ValueError, match="timezone-aware"):
        corpus.search("reservoir", datetime(2026, 3, 10), k=3)
    assert corpus.search("!!! ''", cutoff, k=3) == []


def test_rollout_copy_falls_back_to_upsert_when_another_writer_races(postgres_url: str) -> None:
    """Writer B holds uncommitted copies of two of A's rollouts; A's COPY waits on them, B
    commits, A's COPY hits the unique key and A falls back to INSERT … ON CONFLICT."""
    import threading

    from tests.conftest import _truncate_postgres

    engine = make_engine(postgres_url)
    _truncate_postgres(engine)
    with session_scope(engine) as session:
        upsert_questions(session, [make_question(1)])
        qid = list_questions(session)[0].id
        agent = ensure_agent(session, Agent(name="a", base_model="m", backend="local"))
    batch = [_trajectory(qid, agent.id, s) for s in range(4)]
    result: dict[str, int] = {}
    with session_scope(engine) as writer_b:
        insert_rollouts(writer_b, batch[:2])

        def writer_a() -> None:
            with session_scope(engine) as session:
                result["inserted"] = insert_rollouts(session, batch)

        thread = threading.Thread(target=writer_a)
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive(), "A should wait on B's uncommitted keys"
    thread.join(timeout=30)
    assert result["inserted"] == 2
    with session_scope(engine) as session:
        assert count_rows(session, RolloutRow) == 4
        assert count_rows(session, TurnRow) == 8
    engine.dispose()
