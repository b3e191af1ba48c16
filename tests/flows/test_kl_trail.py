"""A KL anchor that trails the policy (TrainOptions.kl_trail): each update anchors to the
promoted version k promotions before its base, found again along the base's parents (versions
not promoted skipped, the oldest promoted one when the lineage is shorter, never older than
kl_reference when both are given); the run records the anchor, and the update equals one
anchored to that version by number."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy import select
from transformers import AutoTokenizer
from typer.testing import CliRunner

from flows.cli import app
from flows.stages.lineage import LineageError, kl_anchor, trailing_reference
from flows.stages.promotion import reject_version
from flows.stages.training import TrainOptions, replay_and_train, supervised_finetune
from futureworld.agent.demonstrations import Demonstration, demonstration_trajectory
from futureworld.domain import PolicyVersion, VersionStatus
from futureworld.rl.config import TrainConfig
from storage.engine import session_scope
from storage.repositories.agents import get_agent, get_policy_version
from storage.tables import TrainingRunRow
from tests.flows.conftest import RESOLVED_AT, make_context

FAST = TrainOptions(config=TrainConfig(learning_rate=1e-3))
P, R, C = VersionStatus.PROMOTED, VersionStatus.REJECTED, VersionStatus.CANDIDATE


def _lineage(*rows: tuple[int, int | None, VersionStatus]) -> list[PolicyVersion]:
    return [
        PolicyVersion(agent_id=1, version=v, parent_version=p, checkpoint_path=f"v{v}", status=s)
        for v, p, s in rows
    ]


def test_the_trailing_reference_counts_promotions_along_the_parents() -> None:
    # v2 was rejected, yet a person resumed v3 from it; v4 waits for the gate
    versions = _lineage((0, None, P), (1, 0, P), (2, 1, R), (3, 2, P), (4, 3, C))
    assert [trailing_reference(versions, 3, k) for k in range(4)] == [3, 1, 0, 0]
    assert trailing_reference(versions, 3, 9) == 0  # shorter lineage: the oldest promoted
    assert [trailing_reference(versions, 4, k) for k in range(3)] == [4, 3, 1]
    assert trailing_reference(versions, 0, 2) == 0
    # a floor: never older than v1 (the demo's v0 is a random init, v1 its warm start)
    assert [trailing_reference(versions, 3, k, oldest=1) for k in range(4)] == [3, 1, 1, 1]
    assert [trailing_reference(versions, 4, k, oldest=3) for k in range(3)] == [4, 3, 3]
    assert trailing_reference(versions, 1, 5, oldest=1) == 1
    with pytest.raises(LineageError, match="v7 is not a registered version"):
        trailing_reference(versions, 7, 1)


def test_a_trailing_anchor_is_a_non_negative_count() -> None:
    assert TrainOptions(kl_reference=1, kl_trail=2).kl_trail == 2  # v1 is its floor
    with pytest.raises(ValidationError, match="greater than or equal to 0"):
        TrainOptions(kl_trail=-1)
    assert TrainOptions.model_validate({"kl_trail": 1}).kl_trail == 1  # a Prefect parameter


def _run_config(engine, to_version: int) -> dict:
    with session_scope(engine) as session:
        query = select(TrainingRunRow).where(TrainingRunRow.to_version == to_version)
        return session.scalars(query).one().config


def test_kl_trail_anchors_to_the_promoted_version_before_the_base_skipping_a_rejection(
    engine, db_url: str, scored_tiny_agent, tmp_path
) -> None:
    ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
    scored_tiny_agent(db_url, tmp_path)
    with_kl = FAST.with_config(kl_coef=0.1, groups_per_step=3)
    assert replay_and_train(ctx, "tiny", FAST).to_version == 1  # promoted (no gate here)
    assert replay_and_train(ctx, "tiny", FAST.model_copy(update={"reuse": True})).to_version == 2
    reject_version(ctx, "tiny", 2, "worse on a look")  # the agent serves v1 again
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tiny-model", local_files_only=True)
    demo = Demonstration(prompt="Will it rain?", completion="<probability>0.20</probability>")
    sft = supervised_finetune(  # v3 from v1: weights away from v1
        ctx,
        "tiny",
        [demonstration_trajectory(tokenizer, demo, agent_id=0, policy_version=0, sample_index=0)],
        FAST.with_config(ppo_epochs=3),
    )
    assert sft.from_version == 1 and sft.to_version == 3

    # base v3, one promotion back along its parents: v1 (v2, rejected, is not v3's parent
    # and does not count), never "the version before" v2
    trailed = replay_and_train(
        ctx, "tiny", with_kl.model_copy(update={"reuse": True, "kl_trail": 1})
    )
    assert trailed is not None and trailed.from_version == 3 and trailed.to_version == 4
    with session_scope(engine) as session:
        agent = get_agent(session, "tiny")
        v1 = get_policy_version(session, agent.id, 1)
    recorded = _run_config(engine, 4)
    assert recorded["reference_version"] == 1 and recorded["kl_trail"] == 1
    assert recorded["reference"] == v1.checkpoint_path
    assert trailed.steps[0]["kl_ref"] > 1e-6  # v3 is away from v1: the KL term is live

    # the same update anchored to v1 by number takes the same steps
    reject_version(ctx, "tiny", 4, "to replay v3's update with a fixed anchor")
    fixed = replay_and_train(
        ctx, "tiny", with_kl.model_copy(update={"reuse": True, "kl_reference": 1})
    )
    assert fixed is not None and fixed.from_version == 3 and fixed.to_version == 5
    assert _run_config(engine, 5)["reference_version"] == 1
    assert len(fixed.steps) == len(trailed.steps) >= 1
    for mine, theirs in zip(trailed.steps, fixed.steps, strict=True):
        assert mine["kl_ref"] == pytest.approx(theirs["kl_ref"], rel=1e-6)
        assert mine["loss"] == pytest.approx(theirs["loss"], rel=1e-6)

    # the anchor moves on with the policy: from v5 one promotion back is v3, two v1
    agent = ctx.agent("tiny")
    newest = ctx.current_version(agent)
    assert newest.version == 5
    assert [
        kl_anchor(ctx, agent, newest, kl_reference=None, kl_trail=k, lora=False)
        for k in (1, 2, 3, 8)
    ] == [3, 1, 0, 0]
    assert [
        kl_anchor(ctx, agent, newest, kl_reference=1, kl_trail=k, lora=False) for k in (1, 2, 8)
    ] == [3, 1, 1]
    with pytest.raises(LineageError, match="kl_trail=1 with LoRA"):
        kl_anchor(ctx, agent, newest, kl_reference=None, kl_trail=1, lora=True)

    # the CLI takes the floor with the trail: from v5, two promotions back is v1, floored at v3
    floored = CliRunner().invoke(
        app,
        [
            "train", "--agent", "tiny", "--kl-trail", "2", "--kl-reference", "3",
            "--kl-coef", "0.1", "--set", "groups_per_step=3", "--learning-rate", "1e-3",
            "--reuse", "--db", db_url,
        ],
        env={"FW_DATA_DIR": str(tmp_path), "FW_VALIDATION_FRACTION": "0"},
    )  # fmt: skip
    assert floored.exit_code == 0, floored.output
    assert _run_config(engine, 6)["reference_version"] == 3
