"""HTTP rollout benchmark: does predict keep an OpenAI-compatible server full?

The predict stage runs for real over the HTTP backend (64 questions × G = 8 claimed from
SQLite, rolled out through the engine, each group persisted as it completes) against the
loopback server of benchmarks/loopback_completions.py, started as its own process: no model,
`per_token_s` of sleep per generated token in a thread per request, so it is as fast as the
requests it is given overlap. The server's meter gives the mean number of requests in flight
over its busy window; the figure of merit is that mean over `max_concurrency` (target
>= 0.9), and generated tokens/s against the server's ideal, max_concurrency / per_token_s.

The "before" row is the path predict took until the rollout engine (d3c6510): one question
at a time, its G rollouts together, the group persisted before the next question starts, so
at most G requests are in flight. It runs here as `run_group` per question over the same
backend and corpus, then `insert_rollouts`, against the same server after a meter reset.

`--search-rate` makes a turn end with a search (a real corpus search on SQLite, then the
next turn) instead of an answer; with `--max-turns` > 1 rollouts of one group then differ in
length and later turns queue behind the first turns of newer groups.

What bounds the ratio: even a perfect client loses the drain of the last wave (random turn
lengths on 32 slots: about 0.95 for 512 requests of 64–256 tokens, by list scheduling), and
predict persists each group on the engine's own thread, during which finished requests are
not replaced; with short turns (16–48 tokens, 3 ms) persisting takes most of the run and the
ratio falls well below the target (see README, Benchmarks).

    .venv/bin/python benchmarks/predict_http.py [--questions 64 --samples 8 --per-token-ms 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from loopback_completions import (
    LoadStats,
    SimulatedPolicy,
    fetch_stats,
    reset_stats,
    spawn_loopback,
)
from predict_throughput import CUTOFF, bench_questions
from sqlalchemy import create_engine, text

from flows.context import build_context, open_engine
from flows.settings import Settings
from flows.stages.predicting import predict
from futureworld.agent.engine import run_group
from futureworld.agent.loop import rollout_seed
from futureworld.domain import Agent, BackendKind, GenerationSettings
from futureworld.policy.openai_http import HttpBackendConfig, OpenAIHttpBackend
from futureworld.policy.tiny import init_tiny_model
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, upsert_questions
from storage.repositories.rollouts import insert_rollouts

ADMIN = os.environ.get("FW_BENCH_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")


@dataclass(frozen=True)
class Run:
    name: str
    wall_s: float
    rollouts: int
    load: LoadStats

    def line(self, concurrency: int, ideal_tokens_per_s: float) -> str:
        tokens_per_s = self.load.tokens / self.wall_s
        return (
            f"{self.name:<28} {self.rollouts:>5} rollouts {self.load.requests:>5} requests "
            f"{self.wall_s:6.2f} s | in flight mean {self.load.mean_in_flight:5.1f} "
            f"(max {self.load.max_in_flight:>2}) = {self.load.mean_in_flight / concurrency:.2f}"
            f" × max_concurrency | {tokens_per_s:7.0f} tokens/s = "
            f"{tokens_per_s / ideal_tokens_per_s:.2f} of ideal"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--per-token-ms", type=float, default=3.0)
    parser.add_argument("--min-new-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256, help="max new tokens per turn")
    parser.add_argument("--max-turns", type=int, default=1)
    parser.add_argument("--search-rate", type=float, default=0.0)
    parser.add_argument(
        "--request-ms",
        type=float,
        help="every request lasts this long: turns of exactly --new-tokens tokens at "
        "request-ms / new-tokens per token (overrides --per-token-ms, --min-new-tokens)",
    )
    parser.add_argument("--skip-before", action="store_true", help="measure predict only")
    parser.add_argument("--postgres", action="store_true", help="a fresh Postgres database")
    args = parser.parse_args()
    if args.request_ms is not None:
        args.per_token_ms = args.request_ms / args.new_tokens
        args.min_new_tokens = args.new_tokens
    concurrency = HttpBackendConfig.max_concurrency  # what predict's backend is built with
    policy = SimulatedPolicy(
        per_token_s=args.per_token_ms / 1000,
        min_new_tokens=args.min_new_tokens,
        search_rate=args.search_rate,
    )
    generation = GenerationSettings(
        temperature=1.0,
        max_turns=args.max_turns,
        max_new_tokens=args.new_tokens,
        max_total_tokens=2048,
    )
    ideal = concurrency * policy.tokens_per_s
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_tiny_model(Path(tmp) / "model")
        with _database(tmp, args.postgres) as db_url, spawn_loopback(model_dir, policy) as url:
            settings = Settings(data_dir=Path(tmp), db_url=db_url)
            engine = open_engine(settings)
            with session_scope(engine) as session:
                upsert_questions(session, bench_questions(args.questions))
                for name in ("http", "http-before"):
                    ensure_agent(
                        session,
                        Agent(
                            name=name,
                            base_model=str(model_dir),
                            backend=BackendKind.OPENAI,
                            base_url=url,
                            generation=generation,
                        ),
                    )
            ctx = build_context(settings, engine, as_of=CUTOFF)
            reset_stats(url)
            started = time.perf_counter()
            report = predict(ctx, "http", samples=args.samples)
            after = Run(
                "predict (engine)", time.perf_counter() - started, report.rollouts, fetch_stats(url)
            )
            runs = [after]
            if not args.skip_before:
                runs.append(_one_question_at_a_time(ctx, url, model_dir, generation, args))
            engine.dispose()
    print(
        f"{'Postgres' if args.postgres else 'SQLite'}; loopback server: "
        f"{args.per_token_ms:g} ms/token, turns of {args.min_new_tokens}–"
        f"{args.new_tokens} tokens ({args.min_new_tokens * args.per_token_ms:g}–"
        f"{args.new_tokens * args.per_token_ms:g} ms a request), search rate "
        f"{args.search_rate:g}, max_turns {args.max_turns}; {args.questions} questions × G = {args.samples}; max_concurrency "
        f"{concurrency}; ideal {ideal:.0f} tokens/s (max_concurrency / per-token time)"
    )
    for run in runs:
        print(run.line(concurrency, ideal))
    if len(runs) == 2:
        speedup = (after.load.tokens / after.wall_s) / (runs[1].load.tokens / runs[1].wall_s)
        print(f"tokens/s, predict over one question at a time: {speedup:.1f}×")
    print(f"target: in flight >= {0.9 * concurrency:.1f} (0.9 × max_concurrency)")


@contextmanager
def _database(tmp: str, postgres: bool) -> Iterator[str]:
    """A SQLite file in `tmp`, or a fresh Postgres database dropped afterwards."""
    if not postgres:
        yield f"sqlite:///{tmp}/bench.db"
        return
    admin = create_engine(ADMIN, isolation_level="AUTOCOMMIT")
    name = f"fw_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield ADMIN.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _one_question_at_a_time(
    ctx, url: str, model_dir: Path, generation: GenerationSettings, args: argparse.Namespace
) -> Run:
    """The old predict path: each question's group alone, persisted before the next."""
    agent = ctx.agent("http-before")
    backend = OpenAIHttpBackend.from_tokenizer_dir(model_dir, base_url=url, model="model")
    with session_scope(ctx.engine) as session:
        questions = list_questions(session)
    reset_stats(url)
    started = time.perf_counter()
    rollouts = 0
    for question in questions:
        group = run_group(
            question,
            backend,
            ctx.corpus,
            samples=args.samples,
            agent_id=agent.id,
            policy_version=0,
            settings=generation,
            seed=rollout_seed(generation.seed, question.id, 0, 0),
            as_of=question.info_cutoff_at,
        )
        with session_scope(ctx.engine) as session:
            rollouts += insert_rollouts(session, group)
    wall_s = time.perf_counter() - started
    backend.close()
    return Run("one question at a time", wall_s, rollouts, fetch_stats(url))


if __name__ == "__main__":
    main()
