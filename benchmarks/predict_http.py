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

Two reference rows, measured in the same process against the same server: the closed loop
(max_concurrency threads on one connection pool, each sending its next request as its last
returns: no engine, no database, so the transport's own ceiling on this machine at this
moment), and a perfect client (no time at all between a response and the next request):
the scripted turns list-scheduled on max_concurrency slots in the engine's order, requests
in the order they became ready, and for comparison the order the engine used before (the
oldest group's requests first). The perfect client is short of 1.0 only by the drain of the
last requests: 1.00 for single turns of one length; for 32 questions × G = 8 with
--max-turns 3 --search-rate 0.5 (439 requests), 0.98 in ready order against 0.86 oldest
group first, whose last groups' second and third turns ran on a near-empty stream.

What bounds the ratio now: no longer the engine's thread. Finished groups are written on
predict's writer thread and tool calls run on the engine's tool workers, so the engine's
thread waits on the stream most of the run (1.7 of 1.9 s with 0.2 s single turns; it was
busy 0.56 s of 2 s persisting before). What is left is the client's transport: 32 Python
threads waking, parsing and sending under one interpreter lock (the closed loop's own mean
in flight, with no engine, was 0.83–0.95 × max_concurrency on the shared 2-core machine),
the ramp of the first wave (32 new connections), and the drain above. Measured with 0.2 s
requests (--request-ms 200 --new-tokens 40, SQLite, alternating with the code before):
single turns, 64 questions: 0.86–0.90 × max_concurrency (before 0.81–0.85; closed loop
0.92–0.94); 3 turns, search rate 0.5, 64 questions: 0.84–0.86 (before 0.62–0.64; closed loop
0.93, perfect client 0.95), 5.1–5.3k tokens/s against 3.8–3.9k; 32 questions: 0.73–0.77
(before 0.47–0.69; perfect client 0.86). With 6 s requests both codes reach 0.98 single-turn
and 0.99 of the perfect client multi-turn.

Requests in ready order, measured with two demo runs on the 2 cores beside (load 3–4), 32
questions, 3 turns, search rate 0.5, alternating with the oldest-group-first engine: 0.68–0.81
against 0.74–0.77, inside the noise at that load, though the perfect client moved from 0.86
to 0.98. Where the rest goes, from a client-side timeline of the same runs: the client holds
31 of 32 requests open through the whole run (ramp and drain aside), but each takes 0.215–
0.241 s at the median (p90 0.26–0.32 s) for the server's 0.2 s. The time between a response
and the next request is spent inside the request, in the transport: the process burns 4.6
ms of CPU a request (2.0 s over a 4.1 s run of 439 requests; single turns 3.4 ms), 32 HTTP
threads, the tool workers and the writer contending for one interpreter lock on cores the
demos hold. A 0.5 ms interpreter switch interval (sys.setswitchinterval) moved the same run
from 0.75 to 0.79 and the median request from 0.228 to 0.216 s; httpx's async client on one
event loop did worse than the threads in the closed loop (0.75–0.82 against 0.94).

The engine pulled jobs a few groups at a time then, so the later groups' first turns were not
yet queued when the first searches' next turns became ready: its ready order was the start
order (0.84–0.86 on idle cores, 32 questions, 3 turns). With first turns queued ahead up to
the engine's LOOKAHEAD_ROLLOUTS (256), alternating with that code on the 2 idle cores:
32 questions, 3 turns, search rate 0.5: 0.90–0.92 against 0.84–0.85 (closed loop 0.95–0.96);
64 questions, 3 turns: 0.93–0.94 against 0.88–0.91; single turns, 32 questions 0.89–0.93,
64 questions 0.88–0.92 (before 0.90–0.93: single turns of one length have no follow-ups to
reorder); the default long turns 0.95 (closed loop 0.94).

    .venv/bin/python benchmarks/predict_http.py [--questions 64 --samples 8 --per-token-ms 3]
    .venv/bin/python benchmarks/predict_http.py --questions 32 --request-ms 200 --new-tokens 40
        [--max-turns 3 --search-rate 0.5]   (short turns: every request 0.2 s)
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from loopback_completions import (
    LoadStats,
    ScriptedCompletions,
    SimulatedPolicy,
    fetch_stats,
    reset_stats,
    spawn_loopback,
)
from predict_throughput import CUTOFF, bench_questions
from sqlalchemy import create_engine, text
from transformers import AutoTokenizer

from flows.context import build_context, open_engine
from flows.settings import Settings
from flows.stages.predicting import predict
from futureworld.agent.engine import run_group
from futureworld.agent.loop import rollout_seed, turn_seed
from futureworld.agent.parsing import ACTION_STOP_STRINGS
from futureworld.agent.prompts import encode_prompt
from futureworld.domain import Agent, BackendKind, GenerationSettings, Question
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
            with session_scope(engine) as session:
                questions = list_questions(session)
            closed = _closed_loop(
                url, model_dir, questions[0], after.load.requests, concurrency, args.new_tokens
            )
            bound = _perfect_client(model_dir, policy, questions, args, generation, concurrency)
            by_start = _perfect_client(
                model_dir, policy, questions, args, generation, concurrency, ready_order=False
            )
            runs = [after, closed]
            if not args.skip_before:
                runs.append(_one_question_at_a_time(ctx, url, model_dir, generation, args))
            engine.dispose()
    print(
        f"{'Postgres' if args.postgres else 'SQLite'}; loopback server: "
        f"{args.per_token_ms:g} ms/token, turns of {args.min_new_tokens}–"
        f"{args.new_tokens} tokens ({args.min_new_tokens * args.per_token_ms:g}–"
        f"{args.new_tokens * args.per_token_ms:g} ms a request), search rate "
        f"{args.search_rate:g}, max_turns {args.max_turns}; {args.questions} questions × G = "
        f"{args.samples}; max_concurrency {concurrency}; ideal {ideal:.0f} tokens/s "
        "(max_concurrency / per-token time)"
    )
    for run in runs:
        print(run.line(concurrency, ideal))
    print(
        f"a perfect client (no time between a response and the next request, the engine's "
        f"ready order): in flight mean {bound:5.1f} = {bound / concurrency:.2f} × "
        f"max_concurrency; the oldest group's requests first: {by_start / concurrency:.2f}"
    )
    in_flight = after.load.mean_in_flight
    print(
        f"predict's in flight over the closed loop's: {in_flight / closed.load.mean_in_flight:.2f}"
        f"; over a perfect client's: {in_flight / bound:.2f}"
    )
    if len(runs) == 3:
        speedup = (after.load.tokens / after.wall_s) / (runs[2].load.tokens / runs[2].wall_s)
        print(f"tokens/s, predict over one question at a time: {speedup:.1f}×")
    print(f"target: in flight >= {0.9 * concurrency:.1f} (0.9 × max_concurrency)")


def _closed_loop(
    url: str, model_dir: Path, question: Question, requests: int, concurrency: int, max_tokens: int
) -> Run:
    """The transport's own ceiling on this machine now: `concurrency` threads on one shared
    connection pool, each sending its next request the moment its last one returns (one
    question's prompt, no engine, no database), as many requests as predict sent."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    prompt = encode_prompt(tokenizer, question, as_of=CUTOFF)
    keys = itertools.count()
    client = httpx.Client(
        base_url=url,
        timeout=300.0,
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
    )

    def send() -> None:
        while (key := next(keys)) < requests:
            body = {
                "model": "model",
                "prompt": prompt,
                "max_tokens": max_tokens,
                "seed": key,
                "stop": list(ACTION_STOP_STRINGS),
                "logprobs": 1,
            }
            client.post("/v1/completions", json=body).raise_for_status().json()

    threads = [threading.Thread(target=send) for _ in range(concurrency)]
    reset_stats(url)
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall_s = time.perf_counter() - started
    client.close()
    return Run("closed loop (no engine)", wall_s, 0, fetch_stats(url))


def _perfect_client(
    model_dir: Path,
    policy: SimulatedPolicy,
    questions: list[Question],
    args: argparse.Namespace,
    generation: GenerationSettings,
    concurrency: int,
    *,
    ready_order: bool = True,
) -> float:
    """Mean requests in flight of a client that loses no time between a response and the
    next request: the turns the scripted server will give each rollout, list-scheduled on
    `concurrency` slots, every group's first turns ready at once. `ready_order`: requests
    go in the order they became ready, as the engine sends them; else the oldest group's
    first (the engine's order before). Its shortfall from max_concurrency is the drain of
    the last requests."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    script = ScriptedCompletions(tokenizer, policy)
    stops = list(ACTION_STOP_STRINGS)

    def turn(seed: int) -> tuple[float, bool]:
        choice = script.complete({"max_tokens": args.new_tokens, "seed": seed, "stop": stops})
        duration = policy.prefill_s + len(choice["token_ids"]) * policy.per_token_s
        return duration, choice["stop_reason"] == "</search>"

    # priority, key, group, sample, seed, turn
    ready: list[tuple[int, int, int, int, int, int]] = []
    keys = itertools.count()

    def push(order: int, sample: int, seed: int, turn_no: int) -> None:
        key = next(keys)
        heapq.heappush(ready, (key if ready_order else order, key, order, sample, seed, turn_no))

    for order, question in enumerate(sorted(questions, key=lambda q: q.id or 0)):
        assert question.id is not None
        for sample in range(args.samples):
            push(order, sample, rollout_seed(generation.seed, question.id, 0, sample), 0)
    running: list[tuple[float, int, int, int, int, bool]] = []
    now = busy = 0.0
    while ready or running:
        while ready and len(running) < concurrency:
            _, _, order, sample, seed, turn_no = heapq.heappop(ready)
            duration, searched = turn(turn_seed(seed, turn_no))
            busy += duration
            heapq.heappush(running, (now + duration, order, sample, seed, turn_no, searched))
        now, order, sample, seed, turn_no, searched = heapq.heappop(running)
        if searched and turn_no + 1 < generation.max_turns:
            push(order, sample, seed, turn_no + 1)
    return busy / now


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
