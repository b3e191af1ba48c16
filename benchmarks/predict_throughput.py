"""Predict throughput: generated tokens/s of the predict stage against one raw batched
`model.generate` over the same prompts, tiny model, local backend, in one process.

Predict runs for real: 64 questions × G = 8 claimed from SQLite, rolled out (one turn, up
to 32 new tokens), each group persisted as it completes. Raw generate then samples the same
512 prompts (left-padded, one batch) for exactly as many decode steps as predict's longest
rollout; it stores nothing. The ratio is predict's tokens/s over raw's (target >= 0.8).
Run it on another checkout (PYTHONPATH=that/checkout) to measure that code's predict the
same way, e.g. the old one-question-at-a-time path.

    .venv/bin/python benchmarks/predict_throughput.py [--questions 64 --samples 8]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import torch
from raw_generate import raw_generate

from flows.context import build_context, open_engine
from flows.settings import Settings
from flows.stages.predicting import predict
from futureworld.agent.prompts import encode_prompt
from futureworld.domain import Agent, BackendKind, GenerationSettings, Question
from futureworld.policy.local import LocalBackend
from futureworld.policy.tiny import init_tiny_model
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import upsert_questions
from storage.repositories.rollouts import rollouts_for

CUTOFF = datetime(2026, 3, 1, tzinfo=UTC)
TOPICS = ("rates", "oil", "the election", "the final", "the vaccine trial", "wheat prices")


def bench_questions(n: int) -> list[Question]:
    return [
        Question(
            source="bench",
            external_id=f"q{i}",
            title=f"Will {TOPICS[i % len(TOPICS)]} move before day {i}?",
            background="Prices rose for the third month in a row." * (1 + i % 3),
            created_at=CUTOFF,
            info_cutoff_at=CUTOFF,
            close_at=CUTOFF + timedelta(days=30),
        )
        for i in range(n)
    ]


@torch.inference_mode()
def _raw_generate_s(backend: LocalBackend, prompts: list[list[int]], steps: int) -> float:
    width = max(len(p) for p in prompts)
    pad = backend.tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    started = time.perf_counter()
    raw_generate(backend.model, input_ids, attention_mask, steps=steps, pad_token_id=pad)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()
    generation = GenerationSettings(
        temperature=1.0, max_turns=1, max_new_tokens=args.new_tokens, max_total_tokens=512
    )
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_tiny_model(Path(tmp) / "model")
        settings = Settings(data_dir=Path(tmp), db_url=f"sqlite:///{tmp}/bench.db")
        engine = open_engine(settings)
        questions = bench_questions(args.questions)
        with session_scope(engine) as session:
            upsert_questions(session, questions)
            ensure_agent(
                session,
                Agent(
                    name="tiny",
                    base_model=str(model_dir),
                    backend=BackendKind.LOCAL,
                    generation=generation,
                ),
            )
        ctx = build_context(settings, engine, as_of=CUTOFF)
        started = time.perf_counter()
        report = predict(ctx, "tiny", samples=args.samples)
        predict_s = time.perf_counter() - started
        with session_scope(engine) as session:
            trajectories = rollouts_for(session)
        engine.dispose()
        generated = sum(sum(t.loss_mask) for t in trajectories)
        steps = max(len(t.completion_token_ids) for t in trajectories)
        backend = LocalBackend.from_pretrained(model_dir)
        prompts = [
            encode_prompt(backend.tokenizer, q, as_of=CUTOFF)
            for q in questions
            for _ in range(args.samples)
        ]
        raw_s = _raw_generate_s(backend, prompts, steps)
    raw_tokens = len(prompts) * steps
    print(
        f"tiny model, {args.questions} questions × G = {args.samples}, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"predict: {report.rollouts} rollouts, {generated} tokens in {predict_s:.1f} s")
    print(f"raw generate: {len(prompts)} rows × {steps} steps in {raw_s:.1f} s")
    ratio = (generated / predict_s) / (raw_tokens / raw_s)
    print(
        f"tokens/s: predict {generated / predict_s:.0f}, raw {raw_tokens / raw_s:.0f}, "
        f"ratio {ratio:.2f} (target >= 0.8)"
    )


if __name__ == "__main__":
    main()
