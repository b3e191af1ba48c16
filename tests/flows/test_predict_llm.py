"""Predict with a real tiny transformer agent: rollouts persisted token for token, a run
killed midway and rerun creates no duplicates, and concurrent workers on Postgres never
produce the same (question, agent, policy version, sample) twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from flows.stages.predicting import predict
from futureworld.domain import Agent, GenerationSettings, Question
from futureworld.policy.tiny import init_tiny_model
from storage.engine import make_engine, session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import upsert_questions
from storage.repositories.rollouts import rollouts_for
from storage.tables import PredictionClaimRow, RolloutRow
from tests.flows.conftest import make_context

CUTOFF = datetime(2026, 5, 1, tzinfo=UTC)
"""The same instant as tests.flows.conftest.CUTOFF, the contexts' default as-of."""
GENERATION = GenerationSettings(
    temperature=1.0, max_turns=2, max_new_tokens=24, max_total_tokens=1024
)
SAMPLES = 2


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=1)


def _setup(engine, model: Path, n_questions: int) -> None:
    questions = [
        Question(
            source="test",
            external_id=f"q{i}",
            title=f"Will event {i} happen by June?",
            created_at=CUTOFF,
            info_cutoff_at=CUTOFF,
            close_at=CUTOFF + timedelta(days=30),
        )
        for i in range(n_questions)
    ]
    with session_scope(engine) as session:
        upsert_questions(session, questions)
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )


def _count(engine, table=RolloutRow) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def _duplicates(engine) -> int:
    with session_scope(engine) as session:
        keys = (
            RolloutRow.question_id,
            RolloutRow.agent_id,
            RolloutRow.policy_version,
            RolloutRow.sample_index,
        )
        groups = select(*keys).group_by(*keys).having(func.count() > 1).subquery()
        return int(session.scalar(select(func.count()).select_from(groups)))


def _predict_process(db_url: str, data_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "FW_DB_URL": db_url, "FW_DATA_DIR": str(data_dir)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows",
            "predict",
            "--agent",
            "tiny",
            "-G",
            str(SAMPLES),
            "--as-of",
            CUTOFF.isoformat(),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def test_llm_predict_persists_token_faithful_rollouts_once(engine, tiny_model, tmp_path) -> None:
    _setup(engine, tiny_model, n_questions=3)
    ctx = make_context(engine, tmp_path)
    first = predict(ctx, "tiny", samples=SAMPLES, limit=2)
    assert (first.questions, first.rollouts) == (2, 2 * SAMPLES)
    rest = predict(ctx, "tiny", samples=SAMPLES)
    assert (rest.questions, rest.rollouts) == (1, SAMPLES)
    again = predict(ctx, "tiny", samples=SAMPLES)
    assert again.rollouts == 0
    with session_scope(engine) as session:
        trajectories = rollouts_for(session)
    assert len(trajectories) == 3 * SAMPLES
    for t in trajectories:
        assert len(t.completion_token_ids) == len(t.loss_mask) == len(t.behaviour_logprobs) > 0
        assert t.prompt_token_ids
        generated = [lp for lp, m in zip(t.behaviour_logprobs, t.loss_mask, strict=True) if m]
        assert all(lp <= 0.0 for lp in generated)
        assert all(
            lp == 0.0 for lp, m in zip(t.behaviour_logprobs, t.loss_mask, strict=True) if not m
        )
        assert t.sampling["temperature"] == 1.0


def test_predict_killed_midway_then_rerun_creates_no_duplicates(
    engine, db_url: str, tiny_model, tmp_path
) -> None:
    n_questions = 10
    _setup(engine, tiny_model, n_questions=n_questions)
    process = _predict_process(db_url, tmp_path)
    deadline = time.monotonic() + 120
    while _count(engine) == 0:
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "no rollout appeared"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    partial = _count(engine)
    assert 0 < partial < n_questions * SAMPLES
    rerun = predict(make_context(engine, tmp_path), "tiny", samples=SAMPLES)
    assert rerun.rollouts == n_questions * SAMPLES - partial
    assert _count(engine) == n_questions * SAMPLES
    assert _duplicates(engine) == 0
    assert _count(engine, PredictionClaimRow) == 0


def test_concurrent_predict_workers_on_postgres_never_duplicate(
    postgres_url: str, tiny_model, tmp_path
) -> None:
    from tests.conftest import _truncate_postgres

    engine = make_engine(postgres_url)
    _truncate_postgres(engine)
    n_questions = 8
    _setup(engine, tiny_model, n_questions=n_questions)
    workers = [_predict_process(postgres_url, tmp_path) for _ in range(2)]
    for worker in workers:
        assert worker.wait(timeout=300) == 0, worker.stderr.read().decode()
    assert _count(engine) == n_questions * SAMPLES
    assert _duplicates(engine) == 0
    engine.dispose()
