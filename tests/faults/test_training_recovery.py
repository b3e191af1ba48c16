"""Crash leftovers of training: two `train` processes started at once on one agent are
serialised (advisory lock on Postgres, file lock on SQLite) and register exactly one new
version whose files match its sha256; a run whose process died is marked failed at the next
start; temporary and unregistered checkpoints older than a day are removed, newer ones kept."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import select

from flows.stages.training import TrainOptions, replay_and_train
from flows.stages.training_lock import ABANDONED
from futureworld.domain import TrainingRun
from futureworld.rl.config import TrainConfig
from storage.engine import session_scope
from storage.repositories.agents import get_agent
from storage.repositories.training import start_training_run, training_run_statuses
from storage.tables import TrainingRunRow
from tests.faults.conftest import invariants
from tests.flows.conftest import RESOLVED_AT, make_context

DAY_S = 86_400


def test_two_train_processes_at_once_register_exactly_one_version(
    engine, db_url: str, scored_tiny_agent, tmp_path: Path
) -> None:
    scored_tiny_agent(db_url, tmp_path)
    env = {**os.environ, "FW_DB_URL": db_url, "FW_DATA_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "flows", "train", "--agent", "tiny", "--learning-rate", "1e-3"]
    trainers = [
        subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outputs = [trainer.communicate(timeout=600) for trainer in trainers]
    for trainer, (_, stderr) in zip(trainers, outputs, strict=True):
        assert trainer.returncode == 0, stderr.decode()[-2000:]
    said = sorted(" ".join(out.decode().split()) for out, _ in outputs)
    assert "v0 → v1" in said[1] and said[0].startswith("nothing to train on"), said
    state = invariants(engine)
    assert (state.versions, state.versions_without_matching_checkpoint) == (1, 0)
    with session_scope(engine) as session:
        statuses = list(session.scalars(select(TrainingRunRow.status)))
    assert statuses == ["completed"]
    leftovers = [p.name for p in (tmp_path / "checkpoints" / "tiny").iterdir() if p.is_dir()]
    assert sorted(leftovers) == ["v1"]


def test_a_dead_run_is_failed_and_old_crash_checkpoints_removed_at_the_next_start(
    engine, db_url: str, scored_tiny_agent, tmp_path: Path
) -> None:
    scored_tiny_agent(db_url, tmp_path)
    with session_scope(engine) as session:
        agent = get_agent(session, "tiny")
        dead = start_training_run(session, TrainingRun(agent_id=agent.id, from_version=0))
    folder = tmp_path / "checkpoints" / "tiny"
    old = [folder / ".v1.tmp-0123abcd", folder / "v1.unregistered-1700000000"]
    fresh = folder / ".v1.tmp-4567ef01"
    for path in [*old, fresh]:
        path.mkdir(parents=True)
        (path / "model.safetensors").write_bytes(b"partial")
    two_days_ago = time.time() - 2 * DAY_S
    for path in old:
        os.utime(path, (two_days_ago, two_days_ago))

    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
    report = replay_and_train(ctx, "tiny", TrainOptions(config=TrainConfig(learning_rate=1e-3)))

    assert report is not None and report.to_version == 1
    with session_scope(engine) as session:
        statuses = training_run_statuses(session, agent.id)
        error = session.get(TrainingRunRow, dead.id).error
    assert statuses == {dead.id: "failed", report.training_run_id: "completed"}
    assert error == ABANDONED
    assert not any(path.exists() for path in old)
    assert fresh.is_dir()  # younger than a day: maybe still being written, kept
    state = invariants(engine)
    assert (state.versions, state.versions_without_matching_checkpoint) == (1, 0)
