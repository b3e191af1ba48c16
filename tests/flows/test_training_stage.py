"""Replay-and-train on real stored rollouts of a tiny model: a new version is registered
with its parent and checksum, consumption makes replay exactly-once, the next predict uses
the new version, and a crash while checkpointing registers nothing."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch
from sqlalchemy import func, select
from transformers import AutoTokenizer
from typer.testing import CliRunner

from flows.cli import app
from flows.stages.predicting import predict
from flows.stages.training import TrainOptions, replay_and_train, supervised_finetune
from futureworld.agent.demonstrations import Demonstration, demonstration_trajectory
from futureworld.domain import Agent
from futureworld.policy.tiny import init_tiny_model
from futureworld.rl.checkpoints import checkpoint_sha256
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent, get_agent, latest_policy_version
from storage.repositories.training import train_steps
from storage.tables import ReplayConsumptionRow, TrainingRunRow
from tests.flows.conftest import CUTOFF, GENERATION, make_context

FAST = TrainOptions(learning_rate=1e-3)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=2)


def _count(engine, table) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def test_replay_and_train_registers_a_new_version_exactly_once(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path)
    scored_tiny_agent(db_url, tmp_path)
    report = replay_and_train(ctx, "tiny", FAST)
    assert report is not None
    assert (report.from_version, report.to_version, report.groups, report.rollouts) == (0, 1, 3, 9)
    assert all(math.isfinite(step["loss"]) for step in report.steps)
    with session_scope(engine) as session:
        version = latest_policy_version(session, get_agent(session, "tiny").id)
        assert version.version == 1 and version.parent_version == 0
        assert version.checkpoint_sha256 == checkpoint_sha256(Path(version.checkpoint_path))
        steps = train_steps(session, report.training_run_id)
    assert len(steps) == len(report.steps) >= 1
    assert "kl_behaviour" in steps[0].metrics or "clip_fraction" in steps[0].metrics
    assert _count(engine, ReplayConsumptionRow) == 9

    assert replay_and_train(ctx, "tiny", FAST) is None
    again = replay_and_train(ctx, "tiny", FAST.model_copy(update={"reuse": True}))
    assert again is not None and again.to_version == 2
    # Stale data (v0 rollouts trained into v2) is corrected, not dropped.
    assert again.rollouts == 9
    # v2 continues v1's AdamW moments (v1 is an RL update); a fresh optimizer can be asked for
    third = replay_and_train(
        ctx, "tiny", FAST.model_copy(update={"reuse": True, "fresh_optimizer": True})
    )
    assert third is not None and third.to_version == 3
    with session_scope(engine) as session:
        configs = {run.to_version: run.config for run in session.scalars(select(TrainingRunRow))}
    assert configs[1]["resumed_from"] is None  # v0 is the base model: nothing to continue
    assert configs[2]["resumed_from"] == report.checkpoint_path
    assert configs[3]["resumed_from"] is None
    optimizer = torch.load(Path(again.checkpoint_path) / "optimizer.pt", weights_only=True)
    first_steps = len(report.steps)
    assert {int(v["step"]) for v in optimizer["state"].values()} == {first_steps + len(again.steps)}

    new = predict(ctx, "tiny", samples=2)
    assert new.policy_version == 3
    assert new.questions == 0  # all questions are resolved by now: nothing open to forecast


def test_an_rl_update_after_sft_starts_a_fresh_optimizer(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path)
    scored_tiny_agent(db_url, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tiny-model", local_files_only=True)
    demo = Demonstration(prompt="Will it rain?", completion="<probability>0.20</probability>")
    sft = supervised_finetune(
        ctx,
        "tiny",
        [demonstration_trajectory(tokenizer, demo, agent_id=0, policy_version=0, sample_index=0)],
        FAST,
    )
    assert sft.to_version == 1
    report = replay_and_train(ctx, "tiny", FAST)
    assert report is not None and report.to_version == 2
    with session_scope(engine) as session:
        run = session.scalars(select(TrainingRunRow).where(TrainingRunRow.to_version == 2)).one()
    assert run.config["resumed_from"] is None  # SFT moments do not carry into RL


def test_crash_while_checkpointing_registers_no_version(
    engine, db_url: str, scored_tiny_agent, tmp_path, monkeypatch
) -> None:
    ctx = make_context(engine, tmp_path)
    scored_tiny_agent(db_url, tmp_path)
    real_replace = os.replace

    def crash(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        replay_and_train(ctx, "tiny", FAST)
    monkeypatch.setattr(os, "replace", real_replace)
    with session_scope(engine) as session:
        assert latest_policy_version(session, get_agent(session, "tiny").id).version == 0
        statuses = list(session.scalars(select(TrainingRunRow.status)))
    assert statuses == ["failed"]
    assert _count(engine, ReplayConsumptionRow) == 0
    assert not (tmp_path / "checkpoints" / "tiny" / "v1").exists()
    report = replay_and_train(ctx, "tiny", FAST)
    assert report is not None and report.to_version == 1


def test_sft_from_jsonl_through_the_cli(engine, db_url: str, tiny_model, tmp_path) -> None:
    with session_scope(engine) as session:
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(tiny_model), backend="local", generation=GENERATION),
        )
    data = tmp_path / "demos.jsonl"
    rows = [
        {"prompt": f"Will event {i} happen?", "completion": "<probability>0.70</probability>"}
        for i in range(4)
    ]
    rows.append(
        {
            "question": {"title": "Will it rain?", "info_cutoff_at": CUTOFF.isoformat()},
            "completion": "<probability>0.20</probability>",
        }
    )
    data.write_text("\n".join(json.dumps(r) for r in rows))
    env = {"FW_DATA_DIR": str(tmp_path)}
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--agent",
            "tiny",
            "--sft",
            "--from-jsonl",
            str(data),
            "--db",
            db_url,
            "--learning-rate",
            "1e-3",
        ],
        env=env,
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "v0 → v1" in result.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: needs a string field 'completion'"):
        CliRunner().invoke(
            app,
            ["train", "--agent", "tiny", "--sft", "--from-jsonl", str(bad), "--db", db_url],
            env=env,
            catch_exceptions=False,
        )
