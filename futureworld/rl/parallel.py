"""Data parallelism inside the update: this process's place in the process group (`World`),
the split of a step's whole groups across ranks (`shard_steps`), the DDP wrapper of the
log-prob forward (`StepForward`) and the zero-weight rows that keep the ranks' passes equal.
Launching the ranks is futureworld.rl.launch; the loop is futureworld.rl.trainer.

Decisions where the design is silent:
- DDP, not FSDP2 (see the trainer's docstring for why). DDP averages gradients over ranks,
  so each rank scales its loss by the world size: the reduced gradient is the sum of the
  ranks' gradients, each already divided by the *global* step normaliser N.
- Every rank runs the same number of forward/backward passes per step (DDP's all-reduce is a
  collective): a rank with fewer packed rows pads with zero-weight copies of a step row.
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


@dataclass
class StepForward:
    """How a train step computes log-probs and when gradients synchronise across ranks."""

    logprobs: Callable[[PackedRow], tuple[torch.Tensor, torch.Tensor]]
    world: World = field(default_factory=World)
    no_sync: Callable[[], AbstractContextManager[Any]] = nullcontext

    @classmethod
    def local(cls, model: nn.Module, temperature: float, chunk_tokens: int) -> StepForward:
        return cls(logprobs=RowLogprobs(model, temperature, chunk_tokens))

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


def padding_row(row: PackedRow, with_reference: bool) -> PackedRow:
    """A zero-weight stand-in for a missing micro-batch: a real row (so every parameter is
    reached in backward) whose frozen log-probs are zeros; its loss is multiplied by 0."""
    zeros = torch.zeros(row.mask.shape, dtype=torch.float32, device=row.mask.device)
    return replace(row, logp_prox=zeros, logp_ref=zeros if with_reference else None)
