"""Predict's writer thread and the engine's tool workers, over the HTTP backend against the
loopback server: the rollouts stored through the writer equal a one-at-a-time loop's (each
turn one `generate` call, each tool call inline), token for token; a write that fails stops
the stage with that error, the groups written before it stored and no claim held, and a
rerun completes the rest exactly once. The HTTP stream's `wake` returns a blocked `advance`."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from benchmarks.loopback_completions import SimulatedPolicy, serve_loopback
from flows.stages.predicting import predict
from futureworld.agent.loop import (
    Rollout,
    append_generation,
    call_tool,
    fit_prompt,
    rollout_seed,
    turn_seed,
)
from futureworld.agent.parsing import action_stop_strings
from futureworld.agent.prompts import observation_frame
from futureworld.domain import (
    Agent,
    Article,
    BackendKind,
    GenerationSettings,
    Question,
    StopReason,
)
from futureworld.policy.base import SamplingParams
from futureworld.policy.openai_http import OpenAIHttpBackend
from futureworld.policy.streaming import StreamRequest
from futureworld.policy.tiny import init_tiny_model
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.articles import Visibility, insert_articles
from storage.repositories.questions import list_questions, upsert_questions
from storage.repositories.rollouts import rollouts_for
from storage.search import ArticleCorpus
from storage.tables import PredictionClaimRow, RolloutRow
from tests.flows.conftest import make_context

CUTOFF = datetime(2026, 5, 1, tzinfo=UTC)
"""The contexts' default as-of (tests.flows.conftest.CUTOFF)."""
GENERATION = GenerationSettings(
    temperature=1.0, max_turns=3, max_new_tokens=24, max_total_tokens=1024
)
SAMPLES = 3
POLICY = SimulatedPolicy(per_token_s=0.0, min_new_tokens=4, search_rate=0.5)
"""Instant turns; half of them search (a real corpus query), so rollouts run 1–3 turns."""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=5)


def _setup(engine, model: Path, url: str, n_questions: int) -> None:
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id=f"q{i}",
                    title=f"Will the rates decision {i} come before June?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                    close_at=CUTOFF + timedelta(days=30),
                )
                for i in range(n_questions)
            ],
        )
        insert_articles(
            session,
            [
                Article(
                    feed="news",
                    guid=f"g{i}",
                    link=f"https://news.example/{i}",
                    title=f"Rates decision {i} delayed",
                    published_at=CUTOFF - timedelta(days=1 + i),
                    fetched_at=CUTOFF - timedelta(days=1 + i),
                    summary="The committee's rates decision is expected later.",
                    body="The rates decision was put off again. " * 5,
                )
                for i in range(4)
            ],
            visibility=Visibility.STATED,
        )
        ensure_agent(
            session,
            Agent(
                name="remote",
                base_model=str(model),
                backend=BackendKind.OPENAI,
                base_url=url,
                generation=GENERATION,
            ),
        )


def _one_at_a_time(backend: OpenAIHttpBackend, corpus, question: Question, sample: int):
    """The slow loop: one rollout alone, each turn one `generate` call, each tool call inline
    on this thread, seeded as predict seeds sample `sample` of version 0."""
    assert question.id is not None
    tokenizer = backend.tokenizer
    as_of = min(CUTOFF, question.close_at or CUTOFF)
    prompt = fit_prompt(tokenizer, question, as_of=as_of, settings=GENERATION).ids
    frame = observation_frame(tokenizer, GENERATION.observation_role)
    seed = rollout_seed(GENERATION.seed, question.id, 0, sample)
    rollout = Rollout(index=sample, seed=seed)
    for turn_no in range(GENERATION.max_turns):
        budget = GENERATION.max_total_tokens - len(prompt) - len(rollout.completion)
        params = SamplingParams(
            temperature=GENERATION.temperature,
            top_p=GENERATION.top_p,
            max_new_tokens=min(GENERATION.max_new_tokens, budget),
            seed=turn_seed(seed, turn_no),
            stop=action_stop_strings(question.kind),
        )
        [generation] = backend.generate([prompt + rollout.completion], params)
        action = append_generation(rollout, generation, budget, tokenizer, question.kind)
        if rollout.stop is not None:
            break
        if turn_no + 1 == GENERATION.max_turns:
            rollout.stop = StopReason.MAX_TURNS
            break
        call_tool(rollout, action, corpus, as_of, prompt, frame, GENERATION, tokenizer)
        if rollout.stop is not None:
            break
    return prompt, rollout


def test_rollouts_written_by_the_writer_equal_the_one_at_a_time_loop(
    engine, tiny_model, tmp_path
) -> None:
    n_questions = 6
    with serve_loopback(tiny_model, POLICY) as server:
        _setup(engine, tiny_model, server.url, n_questions)
        report = predict(make_context(engine, tmp_path), "remote", samples=SAMPLES)
        assert (report.questions, report.rollouts, report.failed) == (
            n_questions,
            n_questions * SAMPLES,
            0,
        )
        backend = OpenAIHttpBackend.from_tokenizer_dir(
            tiny_model, base_url=server.url, model=tiny_model.name
        )
        corpus = ArticleCorpus(engine)
        with session_scope(engine) as session:
            questions = {q.id: q for q in list_questions(session)}
            stored = rollouts_for(session)
        searched = 0
        try:
            for trajectory in stored:
                question = questions[trajectory.question_id]
                prompt, expected = _one_at_a_time(
                    backend, corpus, question, trajectory.sample_index
                )
                assert list(trajectory.prompt_token_ids) == prompt
                assert list(trajectory.completion_token_ids) == expected.completion
                assert list(trajectory.loss_mask) == expected.mask
                assert trajectory.behaviour_logprobs == pytest.approx(expected.logprobs, abs=1e-6)
                assert [(t.role, t.text, t.tool_result_ids) for t in trajectory.turns] == [
                    (t.role, t.text, t.tool_result_ids) for t in expected.turns
                ]
                assert trajectory.stop_reason is expected.stop
                searched += any(t.tool_result_ids for t in trajectory.turns)
        finally:
            backend.close()
    assert searched > 0  # tool turns with real search results are compared, not only answers


def test_a_failing_write_stops_the_stage_with_its_error_and_keeps_earlier_groups(
    engine, tiny_model, tmp_path
) -> None:
    n_questions = 8
    written: list[int] = []

    def fails_on_the_third(n_rollouts: int) -> None:
        written.append(n_rollouts)
        if len(written) == 3:
            raise RuntimeError("progress sink gone")

    with serve_loopback(tiny_model, POLICY) as server:
        _setup(engine, tiny_model, server.url, n_questions)
        with pytest.raises(RuntimeError, match="progress sink gone"):
            predict(
                make_context(engine, tmp_path),
                "remote",
                samples=SAMPLES,
                on_group=fails_on_the_third,
            )
        with session_scope(engine) as session:
            sizes = session.execute(
                select(func.count()).select_from(RolloutRow).group_by(RolloutRow.question_id)
            ).all()
            held = session.scalar(select(func.count()).select_from(PredictionClaimRow))
        # The third group was written before its progress call failed; none after it.
        assert sorted(n for (n,) in sizes) == [SAMPLES] * 3 and held == 0
        rest = predict(make_context(engine, tmp_path), "remote", samples=SAMPLES)
    assert (rest.questions, rest.rollouts) == (n_questions - 3, (n_questions - 3) * SAMPLES)
    with session_scope(engine) as session:
        assert len(rollouts_for(session)) == n_questions * SAMPLES


def test_wake_returns_a_blocked_advance_with_the_request_still_in_flight(tiny_model) -> None:
    slow = SimulatedPolicy(per_token_s=0.0, prefill_s=1.0, min_new_tokens=4)
    with serve_loopback(tiny_model, slow) as server:
        backend = OpenAIHttpBackend.from_tokenizer_dir(
            tiny_model, base_url=server.url, model=tiny_model.name
        )
        stream = backend.open_stream()
        params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=1)
        assert stream.offer(StreamRequest(key=1, prompt=(5, 6, 7), params=params))
        waker = threading.Thread(target=stream.wake)  # before or while advance waits
        waker.start()
        woken = stream.advance()
        waker.join()
        assert woken == [] and stream.in_flight == 1
        results = []
        while not results:  # the request itself still comes back
            results = stream.advance()
        stream.close()
        backend.close()
    assert [r.key for r in results] == [1] and results[0].generation is not None
