"""Predict with a real tiny transformer agent: rollouts persisted token for token, group by
group; a run killed or crashing midway leaves no partial group and no held claim, and its
rerun creates no duplicates; three concurrent workers on Postgres never produce the same
(question, agent, policy version, sample) twice; poison inputs (a prompt over
max_total_tokens, a generated NUL, a question with U+0000) are isolated, recorded, and the
question parked after `predict_max_failures`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import torch
from sqlalchemy import func, select

from flows.stages.predicting import predict
from futureworld.agent.prompts import encode_prompt
from futureworld.domain import Agent, GenerationSettings, Question
from futureworld.policy.local import LocalBackend
from futureworld.policy.tiny import init_tiny_model
from storage.engine import make_engine, session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, upsert_questions
from storage.repositories.rollouts import rollouts_for
from storage.tables import PipelineEventRow, PredictionClaimRow, RolloutRow
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


def _question(i: int, **fields) -> Question:
    return Question(
        **{
            "source": "test",
            "external_id": f"q{i}",
            "title": f"Will event {i} happen by June?",
            "created_at": CUTOFF,
            "info_cutoff_at": CUTOFF,
            "close_at": CUTOFF + timedelta(days=30),
            **fields,
        }
    )


def _setup(engine, model: Path, n_questions: int, extra: tuple[Question, ...] = ()) -> None:
    questions = [_question(i) for i in range(n_questions)] + list(extra)
    with session_scope(engine) as session:
        upsert_questions(session, questions)
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )


def _count(engine, table=RolloutRow) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def _group_sizes(engine) -> list[int]:
    with session_scope(engine) as session:
        rows = session.execute(
            select(func.count()).select_from(RolloutRow).group_by(RolloutRow.question_id)
        ).all()
    return sorted(n for (n,) in rows)


def _events(engine, kind: str | None = None) -> list[PipelineEventRow]:
    with session_scope(engine) as session:
        statement = select(PipelineEventRow).where(PipelineEventRow.stage == "predict")
        if kind is not None:
            statement = statement.where(PipelineEventRow.kind == kind)
        rows = list(session.scalars(statement))
        session.expunge_all()
        return rows


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
    # Enough groups that persisting them outlasts the poll and the kill: the engine runs
    # them all at once, so they finish together.
    n_questions = 48
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
    assert set(_group_sizes(engine)) == {SAMPLES}  # whole groups only, never part of one
    rerun = predict(make_context(engine, tmp_path), "tiny", samples=SAMPLES)
    assert rerun.rollouts == n_questions * SAMPLES - partial
    assert _count(engine) == n_questions * SAMPLES
    assert _duplicates(engine) == 0
    assert _count(engine, PredictionClaimRow) == 0


def test_three_concurrent_predict_workers_on_postgres_never_duplicate(
    postgres_url: str, tiny_model, tmp_path
) -> None:
    from tests.conftest import _truncate_postgres

    engine = make_engine(postgres_url)
    _truncate_postgres(engine)
    n_questions = 40
    _setup(engine, tiny_model, n_questions=n_questions)
    workers = [_predict_process(postgres_url, tmp_path) for _ in range(3)]
    for worker in workers:
        assert worker.wait(timeout=600) == 0, worker.stderr.read().decode()
    assert _count(engine) == n_questions * SAMPLES
    assert _group_sizes(engine) == [SAMPLES] * n_questions
    assert _duplicates(engine) == 0
    assert _count(engine, PredictionClaimRow) == 0
    engine.dispose()


def test_a_crash_mid_batch_leaves_no_partial_group_and_no_held_claim(
    engine, tiny_model, tmp_path
) -> None:
    n_questions = 12
    _setup(engine, tiny_model, n_questions=n_questions)
    persisted: list[int] = []

    def interrupted_after_two(n_rollouts: int) -> None:
        persisted.append(n_rollouts)
        if len(persisted) == 2:
            raise KeyboardInterrupt  # the operator's Ctrl-C, mid-batch

    with pytest.raises(KeyboardInterrupt):
        predict(
            make_context(engine, tmp_path), "tiny", samples=SAMPLES, on_group=interrupted_after_two
        )
    assert _group_sizes(engine) == [SAMPLES, SAMPLES]
    assert _count(engine, PredictionClaimRow) == 0
    rest = predict(make_context(engine, tmp_path), "tiny", samples=SAMPLES)
    assert rest.questions == n_questions - 2
    assert _group_sizes(engine) == [SAMPLES] * n_questions and _duplicates(engine) == 0


def test_a_prompt_over_max_total_tokens_is_recorded_skipped_then_parked(
    engine, tiny_model, tmp_path
) -> None:
    poison = _question(99, title="Will it rain in every town of the valley? " * 150)
    _setup(engine, tiny_model, n_questions=2, extra=(poison,))
    ctx = make_context(engine, tmp_path, predict_max_failures=2)
    first = predict(ctx, "tiny", samples=SAMPLES)
    assert (first.questions, first.rollouts, first.failed) == (2, 2 * SAMPLES, 1)
    [event] = _events(engine, "prompt_too_long")
    with session_scope(engine) as session:
        [poison_id] = [q.id for q in list_questions(session) if q.external_id == "q99"]
    assert event.level == "error" and event.source == f"q{poison_id}-a1"
    assert "over max_total_tokens" in event.detail
    second = predict(ctx, "tiny", samples=SAMPLES)
    assert (second.questions, second.failed, second.parked) == (0, 1, (poison_id,))
    third = predict(ctx, "tiny", samples=SAMPLES)
    assert (third.failed, third.parked) == (0, (poison_id,))
    assert len(_events(engine, "prompt_too_long")) == 2  # parked: not tried again
    assert _count(engine, PredictionClaimRow) == 0


def test_a_long_background_is_cut_and_the_question_forecast(engine, tiny_model, tmp_path) -> None:
    long = _question(7, background="Rain fell across the valley all week. " * 400)
    _setup(engine, tiny_model, n_questions=0, extra=(long,))
    report = predict(make_context(engine, tmp_path), "tiny", samples=SAMPLES)
    assert (report.questions, report.failed) == (1, 0)
    [note] = _events(engine, "prompt_cut")
    assert note.level == "warning" and note.detail.startswith("background")
    with session_scope(engine) as session:
        [trajectory, _] = rollouts_for(session)
    assert (
        len(trajectory.prompt_token_ids) <= GENERATION.max_total_tokens - GENERATION.max_new_tokens
    )


@pytest.fixture(scope="module")
def nul_model(tmp_path_factory) -> Path:
    """A tiny model taught to open its answer with a NUL character."""
    directory = init_tiny_model(tmp_path_factory.mktemp("nul") / "model", seed=3)
    backend = LocalBackend.from_pretrained(directory)
    tokenizer = backend.tokenizer
    prompt = encode_prompt(tokenizer, _question(0, title="Will NUL appear?"), as_of=CUTOFF)
    target = tokenizer.encode("\x00<probability>0.4</probability>", add_special_tokens=False)
    inputs = torch.tensor([prompt + target])
    labels = torch.full_like(inputs, -100)
    labels[0, len(prompt) :] = torch.tensor(target)
    model = backend.model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        loss = model(input_ids=inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval().save_pretrained(directory)
    return directory


def test_nul_in_generated_text_and_in_question_text_is_stored_as_replacement(
    engine, nul_model, tmp_path
) -> None:
    _setup(
        engine,
        nul_model,
        n_questions=0,
        extra=(_question(0, title="Will NUL appear?", background="Imported\x00text."),),
    )
    report = predict(make_context(engine, tmp_path), "tiny", samples=SAMPLES)
    assert (report.questions, report.failed) == (1, 0)
    with session_scope(engine) as session:
        [question] = list_questions(session)
        trajectories = rollouts_for(session)
    assert question.background == "Imported\ufffdtext."
    nul_id = LocalBackend.from_pretrained(nul_model).tokenizer.encode("\x00")[0]
    with_nul = [t for t in trajectories if nul_id in t.completion_token_ids]
    assert with_nul, "the taught model never generated NUL"
    for trajectory in with_nul:
        assert "\ufffd" in trajectory.turns[0].text and "\x00" not in trajectory.turns[0].text
