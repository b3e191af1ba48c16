"""Replay-and-train on 2 processes through the command line (`futureworld train --nproc 2`):
exactly one version is registered, with its steps and consumption; a training process killed
mid-run fails the run cleanly and registers nothing, and the next run trains the same groups."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from flows.cli import app
from flows.stages.training import TrainOptions, replay_and_train
from futureworld.rl.checkpoints import checkpoint_sha256
from futureworld.rl.config import TrainConfig
from storage.engine import session_scope
from storage.repositories.agents import get_agent, get_policy_version, latest_policy_version
from storage.repositories.training import train_steps
from storage.tables import ReplayConsumptionRow, TrainingRunRow
from tests.flows.conftest import RESOLVED_AT, make_context


def _count(engine, table) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def test_train_with_two_processes_registers_exactly_one_version(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    scored_tiny_agent(db_url, tmp_path)
    result = CliRunner().invoke(
        app,
        ["train", "--agent", "tiny", "--nproc", "2", "--learning-rate", "1e-3", "--db", db_url],
        env={"FW_DATA_DIR": str(tmp_path)},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "v0 → v1 on 9 rollouts (3 groups" in result.output
    with session_scope(engine) as session:
        agent = get_agent(session, "tiny")
        version = latest_policy_version(session, agent.id)
        assert version.version == 1 and version.parent_version == 0
        assert version.checkpoint_sha256 == checkpoint_sha256(Path(version.checkpoint_path))
        runs = list(session.scalars(select(TrainingRunRow)))
        assert [(r.status, r.to_version) for r in runs] == [("completed", 1)]
        steps = train_steps(session, runs[0].id)
    assert [s.step for s in steps] == [1]  # 3 groups, the default 8 groups a step
    assert steps[0].metrics["rollouts"] == 9
    assert _count(engine, ReplayConsumptionRow) == 9
    folder = tmp_path / "checkpoints" / "tiny"
    assert sorted(p.name for p in folder.iterdir() if p.name.startswith("v")) == ["v1"]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # the parent pid is the second field after the parenthesised command name
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def _kill_one_rank(stop: threading.Event, killed: list[int]) -> None:
    """SIGKILLs one training rank of this test's own torchrun (its grandchild) once both
    ranks run, as the kernel's OOM killer would."""
    while not stop.is_set():
        for launcher in _children(os.getpid()):
            ranks = _children(launcher)
            if len(ranks) == 2:
                os.kill(ranks[1], signal.SIGKILL)
                killed.append(ranks[1])
                return
        time.sleep(0.05)


def test_a_killed_rank_fails_the_run_and_registers_nothing(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    scored_tiny_agent(db_url, tmp_path)
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
    options = TrainOptions(config=TrainConfig(learning_rate=1e-3), nproc=2)
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_one_rank, args=(stop, killed), daemon=True)
    killer.start()
    try:
        with pytest.raises(RuntimeError, match="distributed training on 2 processes failed"):
            replay_and_train(ctx, "tiny", options)
    finally:
        stop.set()
        killer.join()
    assert killed, "no rank was found to kill"
    with session_scope(engine) as session:
        agent = get_agent(session, "tiny")
        assert latest_policy_version(session, agent.id).version == 0
        statuses = list(session.scalars(select(TrainingRunRow.status)))
    assert statuses == ["failed"]
    assert _count(engine, ReplayConsumptionRow) == 0
    assert not (tmp_path / "checkpoints" / "tiny" / "v1").exists()
    report = replay_and_train(ctx, "tiny", options)  # the same groups, trained this time
    assert report is not None and (report.to_version, report.rollouts) == (1, 9)
    with session_scope(engine) as session:
        assert get_policy_version(session, get_agent(session, "tiny").id, 1).parent_version == 0


def test_the_replay_and_train_flow_takes_nproc_and_serves_the_new_version(
    prefect_harness, scored_tiny_agent, tmp_path, monkeypatch
) -> None:
    from flows.orchestration.pipeline import replay_and_train_flow
    from storage.engine import make_engine

    db_url = f"sqlite:///{tmp_path / 'fw.db'}"
    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FW_DB_URL", db_url)
    scored_tiny_agent(db_url, tmp_path)
    report = replay_and_train_flow(
        "tiny", train=TrainOptions(config=TrainConfig(learning_rate=1e-3), nproc=2)
    )
    assert report is not None and (report.to_version, report.rollouts) == (1, 9)
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        runs = list(session.scalars(select(TrainingRunRow)))
    engine.dispose()
    assert [(r.status, r.to_version) for r in runs] == [("completed", 1)]
