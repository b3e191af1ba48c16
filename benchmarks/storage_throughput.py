"""Rollout persistence throughput on Postgres, as ratios against references in the same
process:

1. `insert_rollouts` (COPY into a staging table + INSERT … ON CONFLICT, turns by COPY)
   against a raw psycopg COPY of the same rollout and turn rows into bare tables (target ≥ 0.7);
2. the token arrays packed as bytea against Postgres int4[]/real[] arrays (why bytea).

Run: `python benchmarks/storage_throughput.py [--rollouts N] [--tokens T]`.
"""

from __future__ import annotations

import argparse
import os
import random
import time
import uuid

from sqlalchemy import create_engine, text

from futureworld.domain import Agent, Question, Trajectory, Turn
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, upsert_questions
from storage.repositories.rollouts import (
    _ROLLOUT_COLUMNS,
    _TURN_COLUMNS,
    _rollout_values,
    _turn_values,
    insert_rollouts,
)

ADMIN = os.environ.get("FW_BENCH_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")


def make_rollouts(question_ids: list[int], agent_id: int, n: int, tokens: int) -> list[Trajectory]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        length = max(8, int(rng.lognormvariate(0, 0.4) * tokens))
        out.append(
            Trajectory(
                question_id=question_ids[i % len(question_ids)],
                agent_id=agent_id,
                policy_version=0,
                sample_index=i // len(question_ids),
                prompt_token_ids=tuple(rng.randrange(32000) for _ in range(200)),
                completion_token_ids=tuple(rng.randrange(32000) for _ in range(length)),
                loss_mask=tuple(rng.randrange(2) for _ in range(length)),
                behaviour_logprobs=tuple(-rng.random() for _ in range(length)),
                turns=tuple(
                    Turn(
                        index=k,
                        role="assistant" if k % 2 == 0 else "tool",
                        text="x" * 80,
                        token_start=k,
                        token_end=k + 1,
                    )
                    for k in range(4)
                ),
                p_yes=rng.random(),
                sampling={"temperature": 1.0},
                timings={"generate_s": 0.1},
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=1000)
    args = parser.parse_args()
    admin = create_engine(ADMIN, isolation_level="AUTOCOMMIT")
    name = f"fw_bench_{uuid.uuid4().hex[:8]}"
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = ADMIN.rsplit("/", 1)[0] + f"/{name}"
    try:
        engine = make_engine(url)
        upgrade_database(engine)
        with session_scope(engine) as session:
            upsert_questions(
                session,
                [
                    Question(
                        source="bench",
                        external_id=str(i),
                        title="q",
                        created_at=_now(),
                        info_cutoff_at=_now(),
                    )
                    for i in range(100)
                ],
            )
            qids = [q.id for q in list_questions(session)]
            agent = ensure_agent(session, Agent(name="bench", base_model="m", backend="local"))
        rollouts = make_rollouts(qids, agent.id, args.rollouts, args.tokens)

        start = time.perf_counter()
        with session_scope(engine) as session:
            assert insert_rollouts(session, rollouts) == len(rollouts)
        ours = time.perf_counter() - start

        raw = _raw_copy(engine, rollouts)
        arrays = _array_columns(engine, rollouts)
        n = len(rollouts)
        print(f"{n} rollouts, ~{args.tokens} completion tokens each (+200 prompt), 4 turns each")
        print(f"{'path':44s} {'rollouts/s':>12s} {'ratio':>7s}")
        print(f"{'raw COPY into bare tables (reference)':44s} {n / raw:12.0f} {1.0:7.2f}")
        print(f"{'insert_rollouts (stage COPY + upsert)':44s} {n / ours:12.0f} {raw / ours:7.2f}")
        print(f"{'raw COPY with int4[]/real[] arrays':44s} {n / arrays:12.0f} {raw / arrays:7.2f}")
        engine.dispose()
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _now():
    from futureworld.domain import utc_now

    return utc_now()


def _raw_copy(engine, rollouts) -> float:
    """The reference: the same packed rows COPYed into tables without constraints or upsert."""
    import json

    with engine.begin() as c:
        c.execute(text("CREATE TABLE raw_rollout (LIKE rollout INCLUDING DEFAULTS)"))
        c.execute(text("CREATE TABLE raw_turn (LIKE turn INCLUDING DEFAULTS)"))
    raw = engine.raw_connection()
    start = time.perf_counter()
    try:
        with raw.cursor() as cur:
            cols = ", ".join(f'"{c}"' for c in _ROLLOUT_COLUMNS)
            with cur.copy(f"COPY raw_rollout ({cols}) FROM STDIN") as copy:
                for t in rollouts:
                    v = _rollout_values(t)
                    copy.write_row(
                        [
                            json.dumps(x) if isinstance(x, dict | list) else x
                            for x in (v[c] for c in _ROLLOUT_COLUMNS)
                        ]
                    )
            cols = ", ".join(f'"{c}"' for c in _TURN_COLUMNS)
            with cur.copy(f"COPY raw_turn ({cols}) FROM STDIN") as copy:
                for i, t in enumerate(rollouts):
                    for turn in t.turns:
                        v = _turn_values(i + 1, turn)
                        copy.write_row(
                            [
                                json.dumps(x) if isinstance(x, dict | list) else x
                                for x in (v[c] for c in _TURN_COLUMNS)
                            ]
                        )
        raw.commit()
    finally:
        raw.close()
    return time.perf_counter() - start


def _array_columns(engine, rollouts) -> float:
    with engine.begin() as c:
        c.execute(
            text(
                "CREATE TABLE array_rollout (id serial, prompt int4[], completion int4[], "
                "mask int2[], logprobs real[])"
            )
        )
    raw = engine.raw_connection()
    start = time.perf_counter()
    try:
        with (
            raw.cursor() as cur,
            cur.copy("COPY array_rollout (prompt, completion, mask, logprobs) FROM STDIN") as copy,
        ):
            for t in rollouts:
                copy.write_row(
                    [
                        list(t.prompt_token_ids),
                        list(t.completion_token_ids),
                        list(t.loss_mask),
                        list(t.behaviour_logprobs),
                    ]
                )
        raw.commit()
    finally:
        raw.close()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
