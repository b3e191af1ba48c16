"""train_policy on 2 CPU processes under FSDP2 (`parallel=fsdp2`: torch's `fully_shard` per
decoder layer and at the root, gloo): the same update as DDP on 2 processes and as 1 process,
a checkpoint in the single-process format (full weights and AdamW moments gathered from the
shards), a resume that shards those moments back, and LoRA."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from futureworld.rl.config import Parallel, TrainConfig
from futureworld.rl.launch import train
from futureworld.rl.parallel import STRATEGIES
from futureworld.rl.trainer import train_policy
from tests.rl.rl_builders import unequal_groups

# 3 groups a step over 2 ranks: shares of 2 and 1 groups, so the ranks pack different numbers
# of rows (micro_batch_tokens=8 puts each rollout in its own row) and rank 1 pads.
DDP = TrainConfig(
    learning_rate=1e-2, micro_batch_tokens=8, groups_per_step=3, precision="fp32", seed=3
)
FSDP2 = replace(DDP, parallel=Parallel.FSDP2)
# fp32 sums in another order (FSDP2 reduce-scatters every micro-batch, DDP all-reduces once
# a step), through 3 AdamW steps at lr 1e-2: measured at most ~1e-6 apart (docs/update.md)
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def _assert_same_checkpoint(got: Path, want: Path, weights_file: str) -> None:
    """Weights and AdamW moments equal within TOLERANCE."""
    a, b = load_file(str(want / weights_file)), load_file(str(got / weights_file))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], **TOLERANCE, msg=name)
    opt_a = torch.load(want / "optimizer.pt", weights_only=True)
    opt_b = torch.load(got / "optimizer.pt", weights_only=True)
    assert opt_b["state"].keys() == opt_a["state"].keys()
    assert [g["params"] for g in opt_b["param_groups"]] == [
        g["params"] for g in opt_a["param_groups"]
    ]
    for k, state in opt_a["state"].items():
        assert float(opt_b["state"][k]["step"]) == float(state["step"])
        for moment in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt_b["state"][k][moment], state[moment], **TOLERANCE)


def test_every_strategy_is_registered_and_ddp_is_the_default():
    assert set(STRATEGIES) == set(Parallel)
    assert TrainConfig().parallel is Parallel.DDP
    assert FSDP2.parallel is Parallel.FSDP2
    with pytest.raises(ValueError, match="zero"):
        TrainConfig(parallel="zero")


def test_two_fsdp2_ranks_take_the_update_of_two_ddp_ranks_and_of_one_process(
    tiny_model_dir, tmp_path
):
    data = unequal_groups(tiny_model_dir, groups=7)  # steps of 3, 3 and 1 groups
    one = train_policy(tiny_model_dir, data, DDP, tmp_path / "one")
    ddp = train(tiny_model_dir, data, DDP, tmp_path / "ddp", nproc=2)
    fsdp = train(tiny_model_dir, data, FSDP2, tmp_path / "fsdp2", nproc=2)
    assert fsdp.steps == ddp.steps == one.steps == 3
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    moved = load_file(str(fsdp.checkpoint_path / "model.safetensors"))
    assert all(not torch.equal(moved[n], base[n]) for n in base), "every weight moves"
    _assert_same_checkpoint(fsdp.checkpoint_path, ddp.checkpoint_path, "model.safetensors")
    _assert_same_checkpoint(fsdp.checkpoint_path, one.checkpoint_path, "model.safetensors")
    for m1, m2 in zip(one.metrics, fsdp.metrics, strict=True):
        assert m2["tokens"] == m1["tokens"]
        assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-7)
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    # one writer: the target holds one checkpoint, nothing else was left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "ddp", "fsdp2", "one"]


def test_a_checkpoint_resumes_under_fsdp2_as_in_one_process(tiny_model_dir, tmp_path):
    """The single-process AdamW moments are sharded back onto the ranks (and gathered again)."""
    data = unequal_groups(tiny_model_dir, groups=3)
    first = train_policy(tiny_model_dir, data, DDP, tmp_path / "v1")
    one = train_policy(
        tiny_model_dir, data, DDP, tmp_path / "one", resume_from=first.checkpoint_path
    )
    fsdp = train(
        tiny_model_dir, data, FSDP2, tmp_path / "fsdp2", nproc=2, resume_from=first.checkpoint_path
    )
    assert fsdp.global_step == one.global_step == 2
    _assert_same_checkpoint(fsdp.checkpoint_path, one.checkpoint_path, "model.safetensors")


def test_two_fsdp2_ranks_train_the_lora_adapter_one_process_does(tiny_model_dir, tmp_path):
    data = unequal_groups(tiny_model_dir, groups=3)
    lora = TrainConfig(
        learning_rate=1e-2, micro_batch_tokens=8, groups_per_step=3, precision="fp32", lora=True
    )
    one = train_policy(tiny_model_dir, data, lora, tmp_path / "one")
    fsdp = train(
        tiny_model_dir,
        data,
        replace(lora, parallel=Parallel.FSDP2),
        tmp_path / "fsdp2",
        nproc=2,
    )
    adapter = load_file(str(fsdp.checkpoint_path / "adapter_model.safetensors"))
    assert any(t.abs().max() > 0 for n, t in adapter.items() if "lora_B" in n), "B starts at 0"
    _assert_same_checkpoint(fsdp.checkpoint_path, one.checkpoint_path, "adapter_model.safetensors")
