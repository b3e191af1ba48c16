"""Predict workers on two hosts share one Postgres store: a worker of host A is frozen
(SIGSTOP) while it holds claims mid-group; once its lease expires, host B's worker takes the
groups over and completes them; A, thawed, writes its groups late and they are absorbed
exactly once. A dead process on another host cannot be seen by pid, only by its lease.

Both moments come from the database, not from the clock: A is frozen once its claims are
seen, with its groups not all persisted, and B starts once the lease A's claims record has
run out (not after a guessed sleep)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import func, select

from flows.stages.predicting import predict
from futureworld.domain import Agent, GenerationSettings, Question, utc_now
from futureworld.policy.tiny import init_tiny_model
from storage.engine import make_engine, session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import upsert_questions
from storage.tables import PredictionClaimRow, RolloutRow
from tests.faults.conftest import count_rows, invariants, read_only_engine
from tests.flows.conftest import CUTOFF, make_context

QUESTIONS = 4
G = 2
LEASE_S = 3.0
PREDICT = (sys.executable, "-m", "flows", "predict", "--agent", "tiny")
GENERATION = GenerationSettings(
    temperature=1.0, max_turns=2, max_new_tokens=24, max_total_tokens=1024
)


def _setup(engine, model: Path) -> None:
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id=f"q{i}",
                    title=f"Will event {i} happen by June?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                    close_at=CUTOFF + timedelta(days=30),
                )
                for i in range(QUESTIONS)
            ],
        )
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )


def _claims_of(engine, worker: str) -> list[int]:
    with session_scope(engine) as session:
        return list(
            session.scalars(
                select(PredictionClaimRow.question_id).where(PredictionClaimRow.worker == worker)
            )
        )


def _lease_end(engine, worker: str) -> datetime:
    """When the last of `worker`'s claims runs out, as its rows record it."""
    with session_scope(engine) as session:
        end = session.scalar(
            select(func.max(PredictionClaimRow.lease_expires_at)).where(
                PredictionClaimRow.worker == worker
            )
        )
    assert end is not None, f"{worker} holds no claim"
    return end


def test_an_expired_claim_is_taken_over_by_another_host_and_the_late_write_absorbed(
    postgres_url: str, tmp_path: Path
) -> None:
    from tests.conftest import _truncate_postgres

    engine = make_engine(postgres_url)
    watch = read_only_engine(postgres_url)
    _truncate_postgres(engine)
    _setup(engine, init_tiny_model(tmp_path / "model", seed=1))
    host_a = "host-a.example:4242"
    env = {
        **os.environ,
        "FW_DB_URL": postgres_url,
        "FW_DATA_DIR": str(tmp_path / "host-a"),
        "FW_WORKER_ID": host_a,
        "FW_CLAIM_LEASE_S": str(LEASE_S),
    }
    worker_a = subprocess.Popen(
        [*PREDICT, "-G", str(G), "--as-of", CUTOFF.isoformat()],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        while not (held := _claims_of(watch, host_a)):
            assert worker_a.poll() is None, worker_a.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "host A never claimed a question"
            time.sleep(0.002)
        worker_a.send_signal(signal.SIGSTOP)  # Frozen mid-group, its claims held.
        persisted = count_rows(watch, f"SELECT count(*) FROM {RolloutRow.__tablename__}")
        assert _claims_of(watch, host_a) and persisted < QUESTIONS * G, persisted
        lease_end = _lease_end(watch, host_a)  # A, frozen, renews nothing
        while utc_now() <= lease_end:
            assert time.monotonic() < deadline, f"A's lease never ran out ({lease_end})"
            time.sleep(0.01)
        host_b = "host-b.example:7"
        ctx = make_context(engine, tmp_path / "host-b", worker_id=host_b, claim_lease_s=60)
        taken = predict(ctx, "tiny", samples=G)
        assert set(held) & set(_claims_of(engine, host_a)) == set(), "A's claims were not taken"
        assert taken.questions >= len(held)  # B completed the groups A was holding
        state = invariants(engine)
        assert (state.rollouts, state.duplicate_rollouts) == (QUESTIONS * G, 0)
    finally:
        worker_a.send_signal(signal.SIGCONT)
    _, stderr = worker_a.communicate(timeout=300)
    assert worker_a.returncode == 0, stderr.decode()[-2000:]
    state = invariants(engine)
    assert (state.rollouts, state.duplicate_rollouts, state.held_claims) == (QUESTIONS * G, 0, 0)
    watch.dispose()
    engine.dispose()
