"""SIGKILL in the middle of predict, backfill and train (subprocesses), on Postgres and SQLite,
then a run to completion: nothing lost, duplicated or corrupted.

Every kill point is a unit of the stage's own work, read from the database it persists to
(a read-only connection polled every few milliseconds), never a time: `FW_FAULT_KILLS` runs
per database (default 5) are each given fresh work first (new questions, new outcomes; train
replays with --reuse), a target is drawn (seeded, so a failure replays) between the first and
the last unit of that work, and the process is killed as soon as its persisted progress
reaches it. The units: groups of rollouts persisted (predict), rollouts scored (backfill,
one rollout a transaction), optimiser steps recorded (train, written every
STEP_FLUSH_EVERY steps). Every kill must be seen to land inside the work (0 < units persisted
< total once the process is dead), so a slow or loaded machine moves the kill with the work
instead of before it starts or after it ended. Between kills, what must hold at every instant
is checked (whole groups only, no duplicate rollout or reward, every registered version's
checkpoint matching its sha256); after the final run, the counts: rollouts = questions × G,
no held claim, no training run left `running`, one completed run per registered version.

The other faults of the suite live where their stage is tested: three concurrent predict
workers, a kill mid-batch and the poison inputs in tests/flows/test_predict_llm.py; the
Postgres crash in test_database_restart.py; claims across hosts in
test_claims_across_hosts.py; concurrent `train` processes in test_training_recovery.py."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from flows.stages.training import STEP_FLUSH_EVERY
from futureworld.domain import Agent, Outcome, OutcomeStatus, Question, QuestionKind
from futureworld.policy.tiny import init_tiny_model
from futureworld.rewards import rewards_for_kind
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.tables import RewardRow, RolloutRow, TrainingRunRow
from tests.faults.conftest import (
    ProgressKill,
    count_rows,
    invariants,
    kill_at_progress,
    read_only_engine,
)
from tests.flows.conftest import CUTOFF, GENERATION

KILLS = int(os.environ.get("FW_FAULT_KILLS", "5"))
G = 2
PER_ROUND = 24
"""Questions added (predict) or resolved (backfill) before each run. The engine generates a
run's groups together and persists them one after another (about 10 ms each), so a run needs
this many for its persisting to span many polls."""
TRAIN = ["--max-groups", "4", "--set", "groups_per_step=1", "--set", "ppo_epochs=8"]
"""32 optimiser steps a run (4 groups, 8 epochs): step 25's are recorded 7 steps before the
end, where a kill can be seen to land."""
BACKFILL_ONE_ROLLOUT_A_TRANSACTION = (
    "from flows.cli.common import cli_context\n"
    "from flows.stages.backfilling import backfill_rewards\n"
    "with cli_context(None) as ctx:\n"
    "    backfill_rewards(ctx, batch_size=1)\n"
)
"""Backfill as `flows backfill` runs it, but scoring one rollout a transaction (the CLI's
batches of thousands would make a test's work one transaction, with no inside to kill in)."""


def _questions(start: int, n: int) -> list[Question]:
    return [
        Question(
            source="test",
            external_id=f"q{i}",
            title=f"Will event {i} happen?",
            created_at=CUTOFF,
            info_cutoff_at=CUTOFF,
            close_at=CUTOFF + timedelta(days=2),
        )
        for i in range(start, start + n)
    ]


def _resolve(engine: Engine, start: int, n: int) -> None:
    """Give questions `start` … `start + n - 1` (in id order) an outcome: work for backfill."""
    with session_scope(engine) as session:
        todo = sorted(list_questions(session), key=lambda q: q.id or 0)[start : start + n]
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=q.id,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=float(q.id % 2),
                    resolved_at=CUTOFF + timedelta(days=3),
                )
                for q in todo
            ],
        )


def _whole_groups_only(engine: Engine) -> None:
    with session_scope(engine) as session:
        sizes = session.execute(
            select(func.count()).select_from(RolloutRow).group_by(RolloutRow.question_id)
        ).all()
    assert {n for (n,) in sizes} <= {G}, sizes


def _target(rng: random.Random, total: int) -> int:
    """A unit between the first and the last, in the first three quarters of the work: the
    kill comes one poll after the target, and the last quarter keeps it before the end."""
    return rng.randint(1, max(1, total - total // 4))


def _since(read: Callable[[], int]) -> Callable[[], int]:
    """Progress of the run about to start: what `read` counts beyond its value now."""
    before = read()
    return lambda: read() - before


class _Stage:
    """Runs one stage as a subprocess, whole or killed at a unit of its work."""

    def __init__(self, what: str, command: list[str], env: dict[str, str]) -> None:
        self.what = what
        self.command = command
        self.env = env
        self.kills: list[ProgressKill] = []

    def run_whole(self) -> None:
        done = subprocess.run(self.command, env=self.env, capture_output=True, timeout=600)
        assert done.returncode == 0, done.stderr.decode()[-3000:]

    def run_killed(self, progress: Callable[[], int], target: int, total: int) -> None:
        kill = kill_at_progress(
            self.command, self.env, progress, target=target, total=total, what=self.what
        )
        assert kill.landed_mid_work(), kill
        self.kills.append(kill)


@pytest.mark.timeout(2400)  # about 30 stage processes, each loading torch: minutes on 2 cores
def test_sigkill_mid_work_of_predict_backfill_and_train(
    engine, db_url: str, tmp_path: Path
) -> None:
    rng = random.Random(20261201)
    model = init_tiny_model(tmp_path / "tiny-model", seed=1)
    with session_scope(engine) as session:
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )
    watch = read_only_engine(db_url)
    env = {**os.environ, "FW_DB_URL": db_url, "FW_DATA_DIR": str(tmp_path / "data")}
    flows = [sys.executable, "-m", "flows"]
    as_of = ["--as-of", CUTOFF.isoformat()]

    # predict: each run finds PER_ROUND new questions (and what the last kill left); its
    # units are whole groups persisted.
    predict = _Stage("predict", [*flows, "predict", "--agent", "tiny", "-G", str(G), *as_of], env)
    n_questions = 0

    def add_questions() -> None:
        nonlocal n_questions
        with session_scope(engine) as session:
            upsert_questions(session, _questions(n_questions, PER_ROUND))
        n_questions += PER_ROUND

    def groups() -> int:
        return count_rows(watch, f"SELECT count(*) FROM {RolloutRow.__tablename__}") // G

    add_questions()
    predict.run_whole()
    for _ in range(KILLS):
        add_questions()
        total = n_questions - groups()
        predict.run_killed(_since(groups), _target(rng, total), total)
        _whole_groups_only(engine)
        assert invariants(engine).duplicate_rollouts == 0
    predict.run_whole()
    state = invariants(engine)
    assert (state.rollouts, state.duplicate_rollouts, state.held_claims) == (n_questions * G, 0, 0)

    # backfill: each run finds PER_ROUND newly resolved questions; its units are rollouts
    # scored (every reward function of the kind, one transaction).
    fns = len(rewards_for_kind(QuestionKind.BINARY))
    backfill = _Stage("backfill", [sys.executable, "-c", BACKFILL_ONE_ROLLOUT_A_TRANSACTION], env)

    def scored() -> int:
        return count_rows(
            watch, f"SELECT count(DISTINCT rollout_id) FROM {RewardRow.__tablename__}"
        )

    _resolve(engine, 0, PER_ROUND)
    subprocess.run([*flows, "backfill"], env=env, check=True, capture_output=True, timeout=600)
    for round_ in range(1, KILLS + 1):
        _resolve(engine, round_ * PER_ROUND, PER_ROUND)
        total = (round_ + 1) * PER_ROUND * G - scored()
        backfill.run_killed(_since(scored), _target(rng, total), total)
        assert invariants(engine).duplicate_rewards == 0
    backfill_cli = subprocess.run([*flows, "backfill"], env=env, capture_output=True, timeout=600)
    assert backfill_cli.returncode == 0, backfill_cli.stderr.decode()[-3000:]
    with session_scope(engine) as session:
        rewards = int(session.scalar(select(func.count()).select_from(RewardRow)))
    assert rewards == n_questions * G * fns
    assert invariants(engine).duplicate_rewards == 0

    # train: every run replays the same groups again (--reuse), so every run has the same
    # work; its units are optimiser steps, which the stage records every STEP_FLUSH_EVERY.
    train = _Stage(
        "train",
        [*flows, "train", "--agent", "tiny", "--reuse", "--learning-rate", "1e-3", *TRAIN],
        env,
    )

    def last_run() -> int:
        return count_rows(watch, f"SELECT coalesce(max(id), 0) FROM {TrainingRunRow.__tablename__}")

    def steps_after(run_id: int) -> Callable[[], int]:
        sql = f"SELECT count(*) FROM train_step WHERE training_run_id > {run_id}"
        return lambda: count_rows(watch, sql)

    before = last_run()
    train.run_whole()
    steps = steps_after(before)()
    recorded = list(range(STEP_FLUSH_EVERY, steps, STEP_FLUSH_EVERY))
    assert recorded, f"a train run of {steps} steps records none before its end"
    for _ in range(KILLS):
        train.run_killed(steps_after(last_run()), rng.choice(recorded), steps)
        state = invariants(engine)
        assert state.versions_without_matching_checkpoint == 0
    train.run_whole()
    state = invariants(engine)
    assert state.versions_without_matching_checkpoint == 0
    with session_scope(engine) as session:
        statuses = list(session.scalars(select(TrainingRunRow.status)))
    assert "running" not in statuses
    assert statuses.count("completed") == state.versions == 2
    assert statuses.count("failed") == KILLS  # each killed run, marked at the next start
    assert (state.duplicate_rollouts, state.duplicate_rewards, state.held_claims) == (0, 0, 0)
    assert [len(s.kills) for s in (predict, backfill, train)] == [KILLS] * 3
    watch.dispose()
