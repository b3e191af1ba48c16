"""Crash leftovers of training: two `train` processes on one agent, the second started while
the first is inside its update, are serialised (advisory lock on Postgres, file lock on
SQLite) and register exactly one new version whose files match its sha256; a run whose
process died is marked failed at the next start; temporary and unregistered checkpoints older
than a day are removed, newer ones kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import Engine, select

from flows.stages.training import TrainOptions, replay_and_train
from flows.stages.training_lock import ABANDONED
from futureworld.domain import TrainingRun
from futureworld.rl.config import TrainConfig
from storage.engine import session_scope
from storage.repositories.agents import get_agent
from storage.repositories.training import start_training_run, training_run_statuses
from storage.tables import TrainingRunRow
from tests.faults.conftest import count_rows, invariants, read_only_engine
from tests.flows.conftest import RESOLVED_AT, make_context

DAY_S = 86_400
DEADLINE_S = 300.0
"""A guard against a process that stops making progress; never what moves the test on."""


def _wait_for(condition, what: str, *processes: subprocess.Popen) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        for process in processes:
            assert process.poll() is None, f"exited before {what}: {process.stderr.read()[-2000:]}"
        assert time.monotonic() < deadline, f"not {what} within {DEADLINE_S:.0f} s"
        time.sleep(0.01)


def _waits_for_the_training_lock(watch: Engine, pid: int) -> bool:
    """Whether a process is blocked on an agent's training lock: an advisory lock not yet
    granted in this database (Postgres), a blocked flock of `pid` in /proc/locks (SQLite)."""
    if watch.dialect.name == "postgresql":
        return bool(
            count_rows(
                watch,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
        )
    blocked = (line.split() for line in Path("/proc/locks").read_text().splitlines())
    return any(f[1:3] == ["->", "FLOCK"] and f[5] == str(pid) for f in blocked if len(f) > 5)


def test_two_train_processes_at_once_register_exactly_one_version(
    engine, db_url: str, scored_tiny_agent, tmp_path: Path
) -> None:
    scored_tiny_agent(db_url, tmp_path)
    watch = read_only_engine(db_url)
    env = {**os.environ, "FW_DB_URL": db_url, "FW_DATA_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "flows", "train", "--agent", "tiny", "--learning-rate", "1e-3"]

    def start() -> subprocess.Popen:
        return subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    # The first is frozen inside its update (its run recorded, the lock held) until the
    # second is seen waiting for the lock: the two overlap whatever the machine's speed.
    first = start()
    runs = f"SELECT count(*) FROM {TrainingRunRow.__tablename__} WHERE status = 'running'"
    _wait_for(lambda: count_rows(watch, runs) == 1, "the first update started", first)
    first.send_signal(signal.SIGSTOP)
    try:
        second = start()
        _wait_for(
            lambda: _waits_for_the_training_lock(watch, second.pid),
            "the second process waited for the training lock",
            second,
        )
    finally:
        first.send_signal(signal.SIGCONT)
    outputs = [trainer.communicate(timeout=600) for trainer in (first, second)]
    for trainer, (_, stderr) in zip((first, second), outputs, strict=True):
        assert trainer.returncode == 0, stderr[-2000:]
    said = [" ".join(out.split()) for out, _ in outputs]
    assert "v0 → v1" in said[0] and "nothing to train on" in said[1], said
    state = invariants(engine)
    assert (state.versions, state.versions_without_matching_checkpoint) == (1, 0)
    with session_scope(engine) as session:
        statuses = list(session.scalars(select(TrainingRunRow.status)))
    assert statuses == ["completed"]
    leftovers = [p.name for p in (tmp_path / "checkpoints" / "tiny").iterdir() if p.is_dir()]
    assert sorted(leftovers) == ["v1"]
    watch.dispose()


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
