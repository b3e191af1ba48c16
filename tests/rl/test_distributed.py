"""train_policy on 2 CPU processes (torchrun, gloo): the same update as 1 process on the same
groups, one checkpoint written by rank 0, and a rank that dies fails the launch with no
checkpoint left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from futureworld.rl.config import TrainConfig
from futureworld.rl.launch import train
from futureworld.rl.parallel import World, split_groups
from futureworld.rl.trainer import train_policy
from futureworld.torch_threads import torch_thread_count
from tests.rl.rl_builders import unequal_groups

# 3 groups a step over 2 ranks: shares of 2 and 1 groups, so the ranks pack different
# numbers of rows (micro_batch_tokens=8 puts each rollout in its own row) and rank 1 pads.
CONFIG = TrainConfig(
    learning_rate=1e-2, micro_batch_tokens=8, groups_per_step=3, precision="fp32", seed=3
)


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path / "model.safetensors"))


def test_groups_split_into_contiguous_shares_covering_the_step():
    shares = [split_groups(5, World(rank=r, size=2)) for r in range(2)]
    assert shares == [range(0, 2), range(2, 5)] or shares == [range(0, 3), range(3, 5)]
    assert split_groups(1, World(rank=0, size=2)) == range(0, 0)
    assert split_groups(1, World(rank=1, size=2)) == range(0, 1)


def test_two_processes_take_the_same_update_as_one(tiny_model_dir, tmp_path):
    data = unequal_groups(tiny_model_dir, groups=7)  # steps of 3, 3 and 1 groups
    one = train_policy(tiny_model_dir, data, CONFIG, tmp_path / "one")
    steps: list[tuple[int, dict[str, float]]] = []
    two = train(
        tiny_model_dir,
        data,
        CONFIG,
        tmp_path / "two",
        nproc=2,
        on_step=lambda step, metrics: steps.append((step, metrics)),
    )
    assert two.steps == one.steps == 3 and two.global_step == 3
    assert [s for s, _ in steps] == [1, 2, 3]
    a, b = _weights(one.checkpoint_path), _weights(two.checkpoint_path)
    assert a.keys() == b.keys()
    base = _weights(tiny_model_dir)
    for name in a:
        assert not torch.equal(a[name], base[name]), f"{name} did not move"
        # fp32 sums in another order, through 3 AdamW steps (lr 1e-2): a few 1e-6 apart
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5, msg=name)
    for m1, m2 in zip(one.metrics, two.metrics, strict=True):
        # the step's metrics are summed over ranks: the same numbers as one process
        assert m2["tokens"] == m1["tokens"]
        assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-7)
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
    # one writer: the target holds one checkpoint, nothing else was left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "one", "two"]
    opt1 = torch.load(one.checkpoint_path / "optimizer.pt", weights_only=True)
    opt2 = torch.load(two.checkpoint_path / "optimizer.pt", weights_only=True)
    for k, state in opt1["state"].items():
        torch.testing.assert_close(
            opt2["state"][k]["exp_avg"], state["exp_avg"], rtol=1e-4, atol=1e-6
        )


def test_two_process_lora_update_equals_one_process(tiny_model_dir, tmp_path):
    data = unequal_groups(tiny_model_dir, groups=3)
    config = TrainConfig(
        learning_rate=1e-2, micro_batch_tokens=8, groups_per_step=3, precision="fp32", lora=True
    )
    one = train_policy(tiny_model_dir, data, config, tmp_path / "one")
    two = train(tiny_model_dir, data, config, tmp_path / "two", nproc=2)
    a = load_file(str(one.checkpoint_path / "adapter_model.safetensors"))
    b = load_file(str(two.checkpoint_path / "adapter_model.safetensors"))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5, msg=name)


def die_on_rank_one(rank: int, step: int) -> None:
    """A rank that dies mid-update (a real process exit, as an OOM kill would be)."""
    if rank == 1 and step == 1:
        os._exit(17)


def test_a_rank_that_dies_fails_the_run_and_leaves_no_checkpoint(tiny_model_dir, tmp_path):
    data = unequal_groups(tiny_model_dir, groups=6)
    with pytest.raises(RuntimeError, match="distributed training on 2 processes failed"):
        train(tiny_model_dir, data, CONFIG, tmp_path / "v1", nproc=2, rank_hook=die_on_rank_one)
    assert not (tmp_path / "v1").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]


def test_m2po_is_refused_inside_a_process_group_before_training(tiny_model_dir, tmp_path):
    data = unequal_groups(tiny_model_dir, groups=2)
    config = TrainConfig(m2po_tau=0.04, groups_per_step=2, precision="fp32")
    with pytest.raises(RuntimeError, match="M2PO"):
        train(tiny_model_dir, data, config, tmp_path / "v1", nproc=2)
    assert not (tmp_path / "v1").exists()


def record_threads(rank: int, step: int) -> None:
    """Each rank writes the torch threads it trains with (into $THREADS_OUT)."""
    Path(os.environ["THREADS_OUT"], f"rank{rank}").write_text(str(torch.get_num_threads()))


@pytest.mark.parametrize("named", [None, 1])
def test_each_rank_trains_on_its_share_of_the_cores_or_the_named_threads(
    tiny_model_dir, tmp_path, monkeypatch, named
):
    out = tmp_path / "threads"
    out.mkdir()
    monkeypatch.setenv("THREADS_OUT", str(out))
    # the launcher decides, not the caller's shell (torch caps a count at the machine's cores)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    data = unequal_groups(tiny_model_dir, groups=3)
    train(
        tiny_model_dir,
        data,
        CONFIG,
        tmp_path / "v1",
        nproc=2,
        rank_hook=record_threads,
        torch_threads=named,
    )
    expected = named if named is not None else torch_thread_count(workers=2)
    assert {p.name: int(p.read_text()) for p in out.iterdir()} == {
        "rank0": expected,
        "rank1": expected,
    }
