"""A Postgres server crash in the middle of predict, backfill and train: the server of a
throwaway cluster is stopped (immediate mode, every connection cut) inside a stage's
transaction and started again once the stage has met the outage (its first retry warning,
not a delay: a slow machine cannot restart the server before the stage noticed it was gone).
Each stage retries at its transaction boundary, keeps what it computed in memory (a generated
group, the rewards, a written checkpoint), finishes, and has persisted everything exactly
once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select

from flows.stages.backfilling import backfill_rewards
from flows.stages.predicting import predict
from flows.stages.training import TrainOptions, replay_and_train
from futureworld.domain import Agent, Question, QuestionKind
from futureworld.policy.tiny import init_tiny_model
from futureworld.rewards import rewards_for_kind
from futureworld.rl.config import TrainConfig
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent, get_agent, latest_policy_version
from storage.repositories.questions import upsert_questions
from storage.tables import BackfillQueueRow, RewardRow, TrainingRunRow
from tests.faults.conftest import ThrowawayPostgres, invariants
from tests.flows.conftest import (
    CUTOFF,
    GENERATION,
    RESOLVED_AT,
    make_context,
    resolve_every_question,
)

QUESTIONS = 3
G = 3


class _StartOnRetry(logging.Handler):
    """Starts the stopped server in the background at the first retry warning of
    `storage.engine`: the stage has met the outage and waits it out."""

    def __init__(self, cluster: ThrowawayPostgres) -> None:
        super().__init__(logging.WARNING)
        self.cluster = cluster
        self.starting: threading.Thread | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.starting is None and "transient database error" in record.getMessage():
            self.starting = self.cluster.start_in_background()


@contextmanager
def crash_server_at(
    engine: Engine, cluster: ThrowawayPostgres, statement: str, *, nth: int = 1
) -> Iterator[list[str]]:
    """Stop the server just before the `nth` SQL statement containing `statement` is sent
    (so it meets a dead connection, inside its transaction); start it again as the stage
    logs its first retry. Yields a list that holds the statement once the crash happened."""
    seen: list[str] = []
    crashed: list[str] = []
    restart = _StartOnRetry(cluster)
    retries = logging.getLogger("storage.engine")

    def before(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        if crashed or statement not in sql:
            return
        seen.append(sql)
        if len(seen) == nth:
            crashed.append(sql)
            cluster.stop()

    event.listen(engine, "before_cursor_execute", before)
    retries.addHandler(restart)
    try:
        yield crashed
    finally:
        retries.removeHandler(restart)
        event.remove(engine, "before_cursor_execute", before)
        if crashed:
            assert restart.starting is not None, "the stage never retried after the crash"
            restart.starting.join(timeout=120)


def _setup(engine: Engine, model: Path) -> None:
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id=f"q{i}",
                    title=f"Will event {i} happen?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                    close_at=CUTOFF + timedelta(days=2),
                )
                for i in range(QUESTIONS)
            ],
        )
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )


def _count(engine: Engine, table: Any) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def _retried(caplog: pytest.LogCaptureFixture, stage: str) -> bool:
    messages = [r.getMessage() for r in caplog.records if r.name == "storage.engine"]
    return any(m.startswith(f"{stage}") for m in messages)


def test_predict_backfill_and_train_survive_a_server_crash_exactly_once(
    throwaway_postgres: ThrowawayPostgres, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="storage.engine")
    cluster = throwaway_postgres
    engine = make_engine(cluster.url)
    upgrade_database(engine)
    _setup(engine, init_tiny_model(tmp_path / "tiny-model", seed=2))
    ctx = make_context(engine, tmp_path)

    # predict: the server dies while the second group is being written.
    with crash_server_at(engine, cluster, "rollout.idempotency_key IN", nth=2) as crashed:
        report = predict(ctx, "tiny", samples=G)
    assert crashed, "the server was never stopped during predict"
    assert _retried(caplog, "predict: persist")
    assert (report.questions, report.rollouts, report.failed) == (QUESTIONS, QUESTIONS * G, 0)
    state = invariants(engine)
    assert (state.rollouts, state.duplicate_rollouts, state.held_claims) == (QUESTIONS * G, 0, 0)

    resolve_every_question(engine)
    ctx = ctx.at(RESOLVED_AT)

    # backfill: the server dies inside the transaction, as the statement that writes the
    # rewards and settles the queue is sent.
    queue = BackfillQueueRow.__tablename__
    with crash_server_at(engine, cluster, f"DELETE FROM {queue}") as crashed:
        backfilled = backfill_rewards(ctx)
    assert crashed, "the server was never stopped during backfill"
    assert _retried(caplog, "backfill: binary rewards")
    expected_rewards = QUESTIONS * G * len(rewards_for_kind(QuestionKind.BINARY))
    assert backfilled.rewards_inserted == expected_rewards
    assert _count(engine, RewardRow) == expected_rewards
    assert backfill_rewards(ctx).rewards_inserted == 0
    assert _count(engine, queue_table := BackfillQueueRow) == 0, queue_table

    # train: the server dies while the new version is being registered.
    with crash_server_at(engine, cluster, "INSERT INTO policy_version") as crashed:
        trained = replay_and_train(
            ctx, "tiny", TrainOptions(config=TrainConfig(learning_rate=1e-3))
        )
    assert crashed, "the server was never stopped during train"
    assert _retried(caplog, "train: register version")
    assert trained is not None and trained.to_version == 1
    state = invariants(engine)
    assert (state.versions, state.versions_without_matching_checkpoint) == (1, 0)
    assert (state.duplicate_rollouts, state.duplicate_rewards, state.held_claims) == (0, 0, 0)
    with session_scope(engine) as session:
        agent = get_agent(session, "tiny")
        assert latest_policy_version(session, agent.id).version == 1
        statuses = list(session.scalars(select(TrainingRunRow.status)))
    assert statuses == ["completed"]
    engine.dispose()
