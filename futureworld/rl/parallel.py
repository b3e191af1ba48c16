"""Data parallelism inside the update: this process's place in the process group (`World`),
the split of a step's whole groups across ranks (`shard_steps`), the two ways N ranks share
the model (`STRATEGIES`: DDP or FSDP2 around the log-prob forward, `StepForward`), the full
checkpoint state either gathers (`CheckpointState`) and the zero-weight rows that keep the
ranks' passes equal. Launching the ranks is futureworld.rl.launch; the loop is
futureworld.rl.trainer.

Decisions where the design is silent:
- Both strategies average gradients over ranks, so each rank scales its loss by the world
  size: the reduced gradient is the sum of the ranks' gradients, each already divided by the
  *global* step normaliser N.
- Every rank runs the same number of forward/backward passes per step (DDP's all-reduce and
  FSDP2's all-gathers and reduce-scatters are collectives): a rank with fewer packed rows pads
  with zero-weight copies of a step row.
- A checkpoint is in the single-process format whichever strategy trained it: FSDP2 gathers
  the full weights and AdamW moments to rank 0, so a version moves freely between 1 process,
  DDP and FSDP2.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from futureworld.domain import Trajectory
from futureworld.rl.batch import PackedRow, StepBatch, pack_steps
from futureworld.rl.config import Parallel
from futureworld.rl.forward import token_logprobs

RankHook = Callable[[int, int], None]
"""rank_hook(rank, step): called on every rank after each optimiser step."""


@dataclass(frozen=True)
class World:
    """This process's place in the process group; `World.single()` when not distributed."""

    rank: int = 0
    size: int = 1

    @classmethod
    def current(cls) -> World:
        if dist.is_available() and dist.is_initialized():
            return cls(rank=dist.get_rank(), size=dist.get_world_size())
        return cls()

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def sum_floats(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over ranks (float64, so token counts stay exact)."""
        if not self.distributed:
            return list(values)
        tensor = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.tolist()

    def max_int(self, value: int) -> int:
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def split_groups(groups: int, world: World) -> range:
    """The contiguous share of a step's `groups` whole groups that `world.rank` trains on
    (shares differ by at most one group; a rank may get none)."""
    bounds = np.linspace(0, groups, world.size + 1).round().astype(int)
    return range(int(bounds[world.rank]), int(bounds[world.rank + 1]))


def shard_steps(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[np.ndarray],
    group_sizes: Sequence[int],
    groups_per_step: int,
    budget_tokens: int,
    world: World,
    *,
    pack_singles: bool = False,
) -> list[StepBatch]:
    """The optimiser steps of `pack_steps`, each holding only this rank's whole groups
    (`split_groups`): one rank holds every group of every step."""
    return pack_steps(
        trajectories,
        advantages,
        group_sizes,
        groups_per_step,
        budget_tokens,
        share=lambda groups: split_groups(groups, world),
        pack_singles=pack_singles,
    )


class RowLogprobs(nn.Module):
    """log π(target) and entropy of a packed row as a module forward, so DDP can wrap it."""

    def __init__(self, policy: nn.Module, temperature: float, chunk_tokens: int) -> None:
        super().__init__()
        self.policy = policy
        self.temperature = temperature
        self.chunk_tokens = chunk_tokens

    def forward(self, row: PackedRow) -> tuple[torch.Tensor, torch.Tensor]:
        return token_logprobs(self.policy, row, self.temperature, self.chunk_tokens)


@dataclass(frozen=True)
class CheckpointState:
    """What a checkpoint stores of the model and optimiser, in the single-process format."""

    optimizer: dict[str, Any]
    """AdamW's `state_dict()` as one process holds it (state keyed by parameter index)."""
    model: dict[str, torch.Tensor] | None = None
    """The full weights; None: the model's own `state_dict()` (it is not sharded)."""


class Replicated:
    """Every rank holds the whole model and optimiser (one process, DDP): their own state is
    the checkpoint's."""

    def gather(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> CheckpointState:
        return CheckpointState(optimizer=optimizer.state_dict())

    def load_optimizer(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        optimizer.load_state_dict(state)


class Sharded:
    """Parameters and AdamW moments sharded by `fully_shard`: the checkpoint's full tensors
    are gathered to rank 0's CPU (a collective: every rank calls `gather`), and a
    single-process optimiser state is sharded back on load. torch's distributed state dicts
    key the optimiser by parameter name; the single-process format keys it by index."""

    def gather(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> CheckpointState:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        weights = get_model_state_dict(model, options=options)
        by_name = get_optimizer_state_dict(model, optimizer, options=options)
        if not by_name:  # ranks other than 0 receive nothing; they write nothing
            return CheckpointState(optimizer={}, model=weights)
        index = {name: i for i, name in enumerate(_optimizer_param_names(model, optimizer))}
        return CheckpointState(
            optimizer={
                "state": {index[name]: value for name, value in by_name["state"].items()},
                "param_groups": [
                    {**group, "params": [index[name] for name in group["params"]]}
                    for group in by_name["param_groups"]
                ],
            },
            model=weights,
        )

    def load_optimizer(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        names = _optimizer_param_names(model, optimizer)
        if len(names) != sum(len(g["params"]) for g in state["param_groups"]):
            raise ValueError(
                f"the optimizer state to resume has moments for "
                f"{sum(len(g['params']) for g in state['param_groups'])} parameters; this "
                f"model trains {len(names)}"
            )
        by_name = {
            "state": {names[int(i)]: value for i, value in state["state"].items()},
            "param_groups": [
                {**group, "params": [names[int(i)] for i in group["params"]]}
                for group in state["param_groups"]
            ],
        }
        set_optimizer_state_dict(
            model, optimizer, by_name, options=StateDictOptions(full_state_dict=True)
        )


def _optimizer_param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimiser's parameters, in the order of its state's indices."""
    names = {id(param): name for name, param in model.named_parameters()}
    return [names[id(p)] for group in optimizer.param_groups for p in group["params"]]


@dataclass
class StepForward:
    """How a train step computes log-probs, when gradients synchronise across ranks, and how
    the checkpoint's state is read from and written back to the (possibly sharded) model."""

    logprobs: Callable[[PackedRow], tuple[torch.Tensor, torch.Tensor]]
    world: World = field(default_factory=World)
    no_sync: Callable[[], AbstractContextManager[Any]] = nullcontext
    state: Replicated | Sharded = field(default_factory=Replicated)

    @classmethod
    def local(cls, model: nn.Module, temperature: float, chunk_tokens: int) -> StepForward:
        return cls(logprobs=RowLogprobs(model, temperature, chunk_tokens))

    @classmethod
    def for_update(
        cls,
        model: nn.Module,
        parallel: Parallel,
        temperature: float,
        chunk_tokens: int,
        world: World,
    ) -> StepForward:
        """The local forward in one process, else `parallel`'s strategy over `world`. Call
        it before building the optimiser: FSDP2 replaces the model's parameters."""
        if not world.distributed:
            return cls.local(model, temperature, chunk_tokens)
        return STRATEGIES[parallel](model, temperature, chunk_tokens, world)

    @classmethod
    def data_parallel(
        cls, model: nn.Module, temperature: float, chunk_tokens: int, world: World
    ) -> StepForward:
        """DDP over the row forward. Unused parameters (a row with no generated token never
        touches the LM head) are found rather than waited for."""
        device = next(model.parameters()).device
        ddp = DistributedDataParallel(
            RowLogprobs(model, temperature, chunk_tokens),
            device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=False,
            find_unused_parameters=True,
        )
        return cls(logprobs=ddp, world=world, no_sync=ddp.no_sync)

    @classmethod
    def fully_sharded(
        cls, model: nn.Module, temperature: float, chunk_tokens: int, world: World
    ) -> StepForward:
        """FSDP2: `fully_shard` on each transformer block, then on the row forward as the root
        (its forward gathers what no block holds: embeddings, final norm, LM head), as torch's
        FSDP2 documentation recommends. Gradients are reduce-scattered after every backward
        rather than held unsharded across a step's micro-batches (sharded gradients are why
        one shards); an unused LM head contributes zeros, as DDP's unused parameters do."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(next(model.parameters()).device.type, (world.size,))
        root = RowLogprobs(model, temperature, chunk_tokens)
        for block in transformer_blocks(model):
            fully_shard(block, mesh=mesh)
        fully_shard(root, mesh=mesh)
        root.set_reduce_scatter_unused_params(True)
        return cls(logprobs=root, world=world, state=Sharded())


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of a transformers causal LM (its `_no_split_modules` classes, the
    units accelerate's FSDP wrapping uses too), looking through a peft wrapper."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    kinds = set(getattr(inner, "_no_split_modules", None) or ())
    blocks = [m for m in inner.modules() if type(m).__name__ in kinds]
    if not blocks:
        raise ValueError(
            f"{type(inner).__name__} names no transformer block class (_no_split_modules) "
            "for FSDP2 to shard; train it with parallel=ddp"
        )
    return blocks


STRATEGIES: dict[Parallel, Callable[[nn.Module, float, int, World], StepForward]] = {
    Parallel.DDP: StepForward.data_parallel,
    Parallel.FSDP2: StepForward.fully_sharded,
}
"""How N ranks share the model, one constructor per `Parallel` choice."""


def padding_row(row: PackedRow, with_reference: bool) -> PackedRow:
    """A zero-weight stand-in for a missing micro-batch: a real row (so every parameter is
    reached in backward) whose frozen log-probs are zeros; its loss is multiplied by 0."""
    zeros = torch.zeros(row.mask.shape, dtype=torch.float32, device=row.mask.device)
    return replace(row, logp_prox=zeros, logp_ref=zeros if with_reference else None)
