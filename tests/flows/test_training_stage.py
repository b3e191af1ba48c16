"""Replay-and-train on real stored rollouts of a tiny model: a new version is registered
with its parent and checksum, consumption makes replay exactly-once, the next predict uses
the new version, a crash while checkpointing registers nothing, steps hold whole groups,
KL anchors to version 0, a resumed run records its real parent, and an agent is trained at
the temperature it sampled at."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file
from sqlalchemy import func, select
from transformers import AutoTokenizer
from typer.testing import CliRunner

from flows.cli import app
from flows.demo.config import DemoConfig
from flows.stages.backfilling import backfill_rewards
from flows.stages.lineage import reference_version
from flows.stages.predicting import predict
from flows.stages.promotion import promote_version, reject_version
from flows.stages.training import (
    TrainOptions,
    drawn_groups,
    replay_and_train,
    supervised_finetune,
)
from futureworld.agent.demonstrations import Demonstration, demonstration_trajectory
from futureworld.domain import (
    Agent,
    PolicyVersion,
    Question,
    ReplayBatch,
    ScoredRollout,
    Trajectory,
)
from futureworld.policy.tiny import init_tiny_model
from futureworld.rl.checkpoints import checkpoint_sha256
from futureworld.rl.config import TrainConfig
from storage.engine import session_scope
from storage.repositories.agents import (
    ensure_agent,
    get_agent,
    get_policy_version,
    latest_policy_version,
)
from storage.repositories.questions import upsert_questions
from storage.repositories.training import train_steps
from storage.tables import ReplayConsumptionRow, TrainingRunRow
from tests.flows.conftest import (
    CUTOFF,
    GENERATION,
    RESOLVED_AT,
    make_context,
    resolve_every_question,
)

FAST = TrainOptions(config=TrainConfig(learning_rate=1e-3))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=2)


def _count(engine, table) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def test_replay_and_train_registers_a_new_version_exactly_once(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
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
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
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
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
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
    refused = CliRunner().invoke(
        app,
        ["train", "--agent", "tiny", "--sft", "--from-jsonl", str(bad), "--db", db_url],
        env=env,
        catch_exceptions=False,
    )
    assert refused.exit_code != 0
    assert "bad.jsonl:1: needs a string field 'completion'" in refused.output
    with session_scope(engine) as session:
        assert latest_policy_version(session, get_agent(session, "tiny").id).version == 1


def _versions(engine) -> dict[int, PolicyVersion]:
    with session_scope(engine) as session:
        agent = get_agent(session, "tiny")
        newest = latest_policy_version(session, agent.id).version
        return {v: get_policy_version(session, agent.id, v) for v in range(newest + 1)}


def test_steps_hold_whole_groups_through_the_stage(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
    scored_tiny_agent(db_url, tmp_path)
    options = FAST.with_config(groups_per_step=2, micro_batch_tokens=1)
    report = replay_and_train(ctx, "tiny", options)
    assert report is not None
    # 3 groups of 3 rollouts, oldest first: groups (0, 1) then (2); one rollout a row
    assert [(s["groups"], s["rollouts"]) for s in report.steps] == [(2, 6), (1, 3)]
    assert [s["rows"] for s in report.steps] == [6, 3]
    # With room for all three groups in one row, each group is still a row of its own, whose
    # forward computes the group's shared prompt once.
    whole = replay_and_train(ctx, "tiny", FAST.model_copy(update={"reuse": True}))
    assert whole is not None
    [step] = whole.steps
    assert (step["groups"], step["rollouts"], step["rows"]) == (3, 9, 3)
    assert step["positions"] < sum(s["positions"] for s in report.steps)


def test_draw_groups_bounds_an_update_and_leaves_the_rest_waiting(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
    scored_tiny_agent(db_url, tmp_path)
    first = replay_and_train(ctx, "tiny", FAST.model_copy(update={"draw_groups": 2}))
    assert first is not None
    assert (first.groups, first.rollouts, first.remaining_groups) == (2, 6, 1)
    assert _count(engine, ReplayConsumptionRow) == 6
    with session_scope(engine) as session:
        drawn = {row.rollout_id for row in session.scalars(select(ReplayConsumptionRow))}
    # The group left out waits, unconsumed, for the next update, which trains on it alone.
    second = replay_and_train(ctx, "tiny", FAST.model_copy(update={"draw_groups": 2}))
    assert second is not None and (second.groups, second.rollouts) == (1, 3)
    with session_scope(engine) as session:
        rows = session.scalars(select(ReplayConsumptionRow)).all()
    assert len({row.rollout_id for row in rows}) == 9 and drawn < {row.rollout_id for row in rows}
    with session_scope(engine) as session:
        config = (
            session.scalars(select(TrainingRunRow).where(TrainingRunRow.to_version == 1))
            .one()
            .config
        )
    assert config["draw_groups"] == 2


def _run_config(engine, to_version: int) -> dict:
    with session_scope(engine) as session:
        return (
            session.scalars(select(TrainingRunRow).where(TrainingRunRow.to_version == to_version))
            .one()
            .config
        )


def test_a_rejected_step_is_retried_shorter_and_a_promoted_one_resets_the_rate(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    """With a rejection backoff of 0.5, each update from a parent with k rejected versions
    trains at the learning rate × 0.5^k; the next update from a promoted version at the full
    rate again. The rate is the one the trainer ran (its recorded config), and each step
    moves the weights less."""
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
    scored_tiny_agent(db_url, tmp_path)
    # An entropy bonus: a gradient though every rollout of a group scored alike.
    options = FAST.with_config(entropy_coef=0.01).model_copy(update={"rejection_backoff": 0.5})
    rates, sizes = [], []
    for attempt in range(3):
        report = replay_and_train(ctx, "tiny", options)
        assert report is not None and report.from_version == 0  # the rejected data again
        config = _run_config(engine, report.to_version)
        assert config["rejected_from_parent"] == attempt
        rates.append(config["train"]["learning_rate"])
        sizes.append(_weight_change(ctx, report.from_version, report.to_version))
        reject_version(ctx, "tiny", report.to_version, "a deliberately refused step")
    assert rates == [1e-3, 5e-4, 2.5e-4]
    assert sizes[0] > sizes[1] > sizes[2]
    promote_version(ctx, "tiny", 3, "kept")
    report = replay_and_train(ctx, "tiny", options.model_copy(update={"reuse": True}))
    assert report is not None and report.from_version == 3
    config = _run_config(engine, report.to_version)
    assert (config["rejected_from_parent"], config["train"]["learning_rate"]) == (0, 1e-3)
    reject_version(ctx, "tiny", report.to_version, "refused")
    # The train command takes the backoff too (v5, from v3 with one rejected version) ...
    cli = CliRunner().invoke(
        app,
        [
            "train", "--agent", "tiny", "--reuse", "--learning-rate", "1e-3",
            "--rejection-backoff", "0.5", "--db", db_url,
        ],
        env={"FW_DATA_DIR": str(tmp_path), "FW_VALIDATION_FRACTION": "0"},
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    config = _run_config(engine, 5)
    assert (config["rejected_from_parent"], config["train"]["learning_rate"]) == (1, 5e-4)
    reject_version(ctx, "tiny", 5, "refused")
    # ... and without one a retry trains at the full rate whatever its parent's rejections.
    again = replay_and_train(ctx, "tiny", FAST.model_copy(update={"reuse": True}))
    assert again is not None and (again.from_version, again.to_version) == (3, 6)
    config = _run_config(engine, 6)
    assert (config["rejected_from_parent"], config["train"]["learning_rate"]) == (2, 1e-3)
    with pytest.raises(ValidationError, match="less than 1"):
        TrainOptions(rejection_backoff=1.0)
    assert DemoConfig(rl_rejection_backoff=0.5).update.rejection_backoff == 0.5


def _weight_change(ctx, parent: int, child: int) -> float:
    """The largest absolute change of any weight from `parent` to `child`."""
    agent = ctx.agent("tiny")
    with session_scope(ctx.engine) as session:
        paths = [
            Path(get_policy_version(session, agent.id, v).checkpoint_path) for v in (parent, child)
        ]
    weights = [load_file(path / "model.safetensors") for path in paths]
    return max(float((weights[1][k] - weights[0][k]).abs().max()) for k in weights[0])


def test_the_draw_is_seeded_and_changes_with_the_seed() -> None:
    batch = ReplayBatch(groups=tuple((_scored(i),) for i in range(10)), remaining_groups=4)
    drawn = drawn_groups(batch, 3, seed=7)
    assert len(drawn.groups) == 3 and drawn.remaining_groups == 4 + 7
    ids = [group[0].trajectory.question_id for group in drawn.groups]
    assert ids == sorted(ids)  # kept in the batch's order, oldest first
    assert drawn_groups(batch, 3, seed=7) == drawn
    assert len({drawn_groups(batch, 3, seed=s).groups for s in range(8)}) > 1
    assert drawn_groups(batch, 10, seed=7) is batch


def _scored(question_id: int) -> ScoredRollout:
    trajectory = Trajectory(question_id=question_id, agent_id=1, policy_version=0, sample_index=0)
    return ScoredRollout(trajectory=trajectory, reward=0.0, outcome_value=1.0, outcome_revision=0)


def test_kl_anchors_to_the_base_or_a_named_version_and_is_positive_once_weights_moved(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
    scored_tiny_agent(db_url, tmp_path)
    with_kl = FAST.with_config(kl_coef=0.1, groups_per_step=3)
    first = replay_and_train(ctx, "tiny", with_kl)
    assert first is not None
    assert first.steps[0]["kl_ref"] == pytest.approx(0, abs=1e-7)  # π_θ is the base itself
    # a supervised update moves the weights away from the base (v1 → v2) ...
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tiny-model", local_files_only=True)
    demo = Demonstration(prompt="Will it rain?", completion="<probability>0.20</probability>")
    sft = supervised_finetune(
        ctx,
        "tiny",
        [demonstration_trajectory(tokenizer, demo, agent_id=0, policy_version=0, sample_index=0)],
        FAST.with_config(ppo_epochs=3),
    )
    assert sft.to_version == 2
    # ... so the next RL update starts at a KL from version 0 above zero; anchored to
    # π_prox (the weights the update starts from) it would read 0 at the first step
    third = replay_and_train(ctx, "tiny", with_kl.model_copy(update={"reuse": True}))
    assert third is not None and third.from_version == 2
    assert third.steps[0]["kl_ref"] > 1e-6
    base = _versions(engine)[0].checkpoint_path
    with session_scope(engine) as session:
        configs = {run.to_version: run.config for run in session.scalars(select(TrainingRunRow))}
    assert configs[1]["reference"] == configs[3]["reference"] == base
    assert configs[2]["reference"] is None  # no KL in that update
    state = json.loads((Path(third.checkpoint_path) / "trainer_state.json").read_text())
    assert state["reference"] == base

    # Anchored to a later version instead (here the update's own parent, v3), the KL of the
    # first step is 0 again, and the run records that version's checkpoint as its reference.
    fourth = replay_and_train(
        ctx, "tiny", with_kl.model_copy(update={"reuse": True, "kl_reference": 3})
    )
    assert fourth is not None and fourth.from_version == 3
    assert fourth.steps[0]["kl_ref"] == pytest.approx(0, abs=1e-7)
    with session_scope(engine) as session:
        run = session.scalars(select(TrainingRunRow).where(TrainingRunRow.to_version == 4)).one()
    assert run.config["reference"] == _versions(engine)[3].checkpoint_path
    with pytest.raises(ValueError, match="KL reference v9: tiny has versions v0–v4"):
        replay_and_train(ctx, "tiny", with_kl.model_copy(update={"reuse": True, "kl_reference": 9}))
    refused = CliRunner().invoke(
        app,
        [
            "train",
            "--agent",
            "tiny",
            "--reuse",
            "--kl-coef",
            "0.1",
            "--kl-reference",
            "9",
            "--db",
            db_url,
        ],
        env={"FW_DATA_DIR": str(tmp_path)},
    )
    assert refused.exit_code == 2, refused.output  # the caller's mistake: one line, exit 2
    assert "KL reference v9: tiny has versions v0–v4" in refused.output
    assert "Traceback" not in refused.output
    with session_scope(engine) as session:
        agent = get_agent(session, "tiny")
    with pytest.raises(ValueError, match="LoRA update's KL reference is the base"):
        reference_version(ctx, agent, _versions(engine)[4], 1, lora=True)


def test_resume_records_the_checkpoint_it_resumed_from_as_parent(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
    scored_tiny_agent(db_url, tmp_path)
    again = FAST.model_copy(update={"reuse": True})
    v1 = replay_and_train(ctx, "tiny", FAST)
    assert v1 is not None
    assert replay_and_train(ctx, "tiny", again) is not None  # v2, parent v1
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--agent",
            "tiny",
            "--reuse",
            "--resume",
            v1.checkpoint_path,
            "--learning-rate",
            "1e-3",
            "--db",
            db_url,
        ],
        env={"FW_DATA_DIR": str(tmp_path)},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "v1 → v3" in result.output
    versions = _versions(engine)
    assert [versions[v].parent_version for v in (1, 2, 3)] == [0, 1, 1]
    with session_scope(engine) as session:
        run = session.scalars(select(TrainingRunRow).where(TrainingRunRow.to_version == 3)).one()
    assert (run.from_version, run.config["resumed_from"]) == (1, v1.checkpoint_path)
    # the AdamW state is v1's, continued: v3 has taken as many steps as v2
    steps = {
        v: {
            int(s["step"])
            for s in torch.load(
                Path(versions[v].checkpoint_path) / "optimizer.pt", weights_only=True
            )["state"].values()
        }
        for v in (2, 3)
    }
    assert steps[2] == steps[3]


def test_resume_from_a_checkpoint_that_is_not_a_registered_version_is_refused(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
    scored_tiny_agent(db_url, tmp_path)
    v1 = replay_and_train(ctx, "tiny", FAST)
    assert v1 is not None
    stray = tmp_path / "elsewhere" / "v1-copy"
    shutil.copytree(v1.checkpoint_path, stray)
    again = FAST.model_copy(update={"reuse": True})
    with pytest.raises(ValueError, match="not a registered version of tiny"):
        replay_and_train(ctx, "tiny", again, resume_from=stray)
    state = Path(v1.checkpoint_path) / "trainer_state.json"
    state.write_text(state.read_text().replace('"global_step"', '"global_step" ', 1))
    with pytest.raises(ValueError, match="no longer match the sha256"):
        replay_and_train(ctx, "tiny", again, resume_from=Path(v1.checkpoint_path))
    assert _versions(engine).keys() == {0, 1}  # nothing was trained or registered


def test_an_agent_sampling_at_another_temperature_trains_at_it(
    engine, tiny_model: Path, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path)
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id=f"t{i}",
                    title=f"Will event {i} happen?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                    close_at=CUTOFF + timedelta(days=2),
                )
                for i in range(3)
            ],
        )
        ensure_agent(
            session,
            Agent(
                name="cool",
                base_model=str(tiny_model),
                backend="local",
                generation=dataclasses.replace(GENERATION, temperature=0.7),
            ),
        )
    predict(ctx, "cool", samples=3)
    resolve_every_question(engine)
    ctx = ctx.at(RESOLVED_AT)
    backfill_rewards(ctx)
    report = replay_and_train(ctx, "cool", FAST)
    assert report is not None and report.rollouts == 9
    # μ was taken at T = 0.7; π_prox at the same T agrees with it token for token
    assert report.steps[0]["kl_behaviour"] == pytest.approx(0, abs=1e-5)
    assert report.steps[0]["rejected_fraction"] == 0
    state = json.loads((Path(report.checkpoint_path) / "trainer_state.json").read_text())
    assert state["config"]["temperature"] == 0.7
    with pytest.raises(ValueError, match=r"sampled at temperature 0\.7"):
        replay_and_train(
            ctx, "cool", FAST.model_copy(update={"reuse": True}).with_config(temperature=1.0)
        )
