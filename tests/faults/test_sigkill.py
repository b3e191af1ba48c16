"""SIGKILL at random points of predict, backfill and train (`python -m flows …` subprocesses),
on Postgres and SQLite, then a run to completion: nothing lost, duplicated or corrupted.

Each stage is first run once whole on fresh work, which measures its wall time T; then
`FW_FAULT_KILLS` runs per database (default 5, so 10 kill points per stage over SQLite and
Postgres; every run is a fresh Python process that loads torch, so the default keeps the
suite to minutes on two cores) are each killed at a point drawn uniformly from
[0.2·T, 1.2·T] (seeded, so a failure replays), each given fresh work first (new questions,
new outcomes; train replays with --reuse), so the kills land in the stage's work, not in an
idle process. Between kills, what must hold at every instant is checked (whole groups only,
no duplicate rollout or reward, every registered version's checkpoint matching its sha256);
after the final run, the counts: rollouts = questions × G, no held claim, no training run
left `running`, one completed run per registered version.

The other faults of the suite live where their stage is tested: three concurrent predict
workers, a kill mid-batch and the poison inputs in tests/flows/test_predict_llm.py; the
Postgres crash in test_database_restart.py; claims across hosts in
test_claims_across_hosts.py; concurrent `train` processes in test_training_recovery.py."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from sqlalchemy import Engine, func, select

from futureworld.domain import Agent, Outcome, OutcomeStatus, Question, QuestionKind
from futureworld.policy.tiny import init_tiny_model
from futureworld.rewards import rewards_for_kind
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.tables import RewardRow, RolloutRow, TrainingRunRow
from tests.faults.conftest import invariants
from tests.flows.conftest import CUTOFF, GENERATION

KILLS = int(os.environ.get("FW_FAULT_KILLS", "5"))
G = 2
PER_ROUND = 2
"""Questions added (predict) or resolved (backfill) before each run."""


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


class _Stage:
    """Runs one CLI stage as a subprocess, whole or killed at a random point."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        rng: random.Random,
        window: tuple[float, float] = (0.2, 1.2),
    ) -> None:
        self.command = [sys.executable, "-m", "flows", *args]
        self.env = env
        self.rng = rng
        self.window = window
        """Kill points, as fractions of a whole run's wall time."""
        self.whole_s = 0.0

    def run_whole(self) -> None:
        """Run to completion; the shortest whole run so far is T, the kill points' scale."""
        started = time.monotonic()
        done = subprocess.run(self.command, env=self.env, capture_output=True, timeout=600)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        took = time.monotonic() - started
        self.whole_s = min(self.whole_s, took) if self.whole_s else took

    def run_killed(self) -> bool:
        """Kill the stage at a random point; False when it finished first."""
        process = subprocess.Popen(
            self.command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            process.wait(timeout=self.rng.uniform(*self.window) * self.whole_s)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return True
        _, stderr = process.communicate()
        assert process.returncode == 0, stderr.decode()[-3000:]
        return False


def test_sigkill_at_random_points_of_predict_backfill_and_train(
    engine, db_url: str, tmp_path: Path
) -> None:
    rng = random.Random(20261201)
    model = init_tiny_model(tmp_path / "tiny-model", seed=1)
    with session_scope(engine) as session:
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )
    env = {**os.environ, "FW_DB_URL": db_url, "FW_DATA_DIR": str(tmp_path / "data")}
    as_of = ["--as-of", CUTOFF.isoformat()]
    killed: dict[str, int] = {}

    # predict: each run finds PER_ROUND new questions (and what the last kill left).
    predict = _Stage(["predict", "--agent", "tiny", "-G", str(G), *as_of], env, rng)
    n_questions = 0

    def add_questions() -> None:
        nonlocal n_questions
        with session_scope(engine) as session:
            upsert_questions(session, _questions(n_questions, PER_ROUND))
        n_questions += PER_ROUND

    add_questions()
    predict.run_whole()
    for _ in range(KILLS):
        add_questions()
        killed["predict"] = killed.get("predict", 0) + predict.run_killed()
        _whole_groups_only(engine)
        assert invariants(engine).duplicate_rollouts == 0
    predict.run_whole()
    state = invariants(engine)
    assert (state.rollouts, state.duplicate_rollouts, state.held_claims) == (n_questions * G, 0, 0)

    # backfill: each run finds PER_ROUND newly resolved questions.
    # Its work is short next to the start-up, so its kill points lie late in the run (and
    # before T: a run only slightly faster than the fastest whole one escapes a later kill).
    backfill = _Stage(["backfill"], env, rng, window=(0.5, 1.0))
    _resolve(engine, 0, PER_ROUND)
    backfill.run_whole()
    for round_ in range(1, KILLS + 1):
        _resolve(engine, round_ * PER_ROUND, PER_ROUND)
        killed["backfill"] = killed.get("backfill", 0) + backfill.run_killed()
        assert invariants(engine).duplicate_rewards == 0
    backfill.run_whole()
    with session_scope(engine) as session:
        rewards = int(session.scalar(select(func.count()).select_from(RewardRow)))
    assert rewards == n_questions * G * len(rewards_for_kind(QuestionKind.BINARY))
    assert invariants(engine).duplicate_rewards == 0

    # train: every run replays the same groups again (--reuse), so every run has work. The
    # first update starts from the base model and is not like the rest: T is the shorter of
    # two whole runs, or most kill points fall after a later, faster run has finished.
    train = _Stage(["train", "--agent", "tiny", "--reuse", "--learning-rate", "1e-3"], env, rng)
    train.run_whole()
    train.run_whole()
    for _ in range(KILLS):
        killed["train"] = killed.get("train", 0) + train.run_killed()
        state = invariants(engine)
        assert state.versions_without_matching_checkpoint == 0
    train.run_whole()
    state = invariants(engine)
    assert state.versions_without_matching_checkpoint == 0
    with session_scope(engine) as session:
        statuses = list(session.scalars(select(TrainingRunRow.status)))
    assert "running" not in statuses
    assert statuses.count("completed") == state.versions
    assert (state.duplicate_rollouts, state.duplicate_rewards, state.held_claims) == (0, 0, 0)
    # Most draws must land inside the work, or the suite tests nothing.
    assert all(n >= KILLS // 2 for n in killed.values()), killed
