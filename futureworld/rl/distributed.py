"""Data-parallel training over N processes with torch.distributed: the split of a step's whole
groups across ranks, the DDP wrapper of the log-prob forward, the step-wide sums every rank
needs, and `launch_training`, which runs `train_policy` under `torchrun` and hands back rank
0's result.

Decisions where the design is silent:
- DDP, not FSDP2 (see the trainer's docstring for why). DDP averages gradients over ranks,
  so each rank scales its loss by the world size: the reduced gradient is the sum of the
  ranks' gradients, each already divided by the *global* step normaliser N.
- Every rank runs the same number of forward/backward passes per step (DDP's all-reduce is a
  collective): a rank with fewer packed rows pads with zero-weight copies of a step row.
- The launcher passes the job to the ranks as a pickle in a private temporary directory and
  reads rank 0's `TrainResult` back the same way; a rank that exits non-zero makes torchrun
  stop the others, and the launch raises with the tail of their output.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from futureworld.domain import Trajectory
from futureworld.rl.batch import PackedRow, StepBatch, pack_steps
from futureworld.rl.forward import token_logprobs

JOB_FILE = "job.pkl"
RESULT_FILE = "result.pkl"
LAUNCH_OUTPUT_TAIL_CHARS = 4000
"""How much of torchrun's output a failed launch quotes in its error."""

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
        from torch.nn.parallel import DistributedDataParallel

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
    from dataclasses import replace

    zeros = torch.zeros(row.mask.shape, dtype=torch.float32, device=row.mask.device)
    return replace(row, logp_prox=zeros, logp_ref=zeros if with_reference else None)


@dataclass(frozen=True)
class TrainingJob:
    """The arguments of one `train_policy` call, as every rank receives them."""

    model_dir: Path
    rollouts: tuple[Any, ...]
    config: Any
    output_dir: Path
    adapter_dir: Path | None = None
    resume_from: Path | None = None
    reference_dir: Path | None = None
    on_save: Callable[[Path], None] | None = None
    """Must be picklable (a module-level function): it runs in rank 0's process."""
    rank_hook: RankHook | None = None
    """Must be picklable; runs in every rank after each optimiser step."""


def _rank_device(config: Any) -> Any:
    """Each rank on its own GPU (LOCAL_RANK) when training on CUDA; CPU ranks share the CPU."""
    from dataclasses import replace

    device = config.resolved_device()
    if device.type != "cuda":
        return config
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    return replace(config, device=f"cuda:{local_rank}")


def run_rank(job_dir: Path) -> None:
    """One rank of a launched job: join the process group, train, rank 0 writes the result."""
    from futureworld.rl.trainer import train_policy

    job: TrainingJob = pickle.loads((job_dir / JOB_FILE).read_bytes())
    config = _rank_device(job.config)
    backend = "nccl" if config.resolved_device().type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
    try:
        result = train_policy(
            job.model_dir,
            job.rollouts,
            config,
            job.output_dir,
            adapter_dir=job.adapter_dir,
            resume_from=job.resume_from,
            reference_dir=job.reference_dir,
            on_save=job.on_save,
            rank_hook=job.rank_hook,
        )
        if dist.get_rank() == 0:
            (job_dir / RESULT_FILE).write_bytes(pickle.dumps(result))
    finally:
        dist.destroy_process_group()


def launch_training(job: TrainingJob, nproc: int, *, timeout_s: float | None = None) -> Any:
    """Runs `job` on `nproc` local processes under torchrun; returns rank 0's TrainResult.

    Raises RuntimeError, quoting torchrun's output, when any rank fails: the checkpoint is
    then absent (rank 0 renames it into place only after every step succeeded).
    """
    if nproc < 2:
        raise ValueError(f"launch_training needs nproc >= 2, got {nproc}")
    with tempfile.TemporaryDirectory(prefix="fw-train-") as tmp:
        job_dir = Path(tmp)
        (job_dir / JOB_FILE).write_bytes(pickle.dumps(job))
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "futureworld.rl.distributed",
            str(job_dir),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=timeout_s, check=False
        )
        result_file = job_dir / RESULT_FILE
        if done.returncode != 0 or not result_file.is_file():
            tail = (done.stdout + done.stderr)[-LAUNCH_OUTPUT_TAIL_CHARS:]
            raise RuntimeError(
                f"distributed training on {nproc} processes failed (torchrun exit "
                f"{done.returncode}); no checkpoint was written. Output:\n{tail}"
            )
        return pickle.loads(result_file.read_bytes())


if __name__ == "__main__":  # a rank started by torchrun (see launch_training)
    run_rank(Path(sys.argv[1]))
