"""Running one update on N local processes: `train` trains in this process, or, for nproc > 1,
starts the ranks under torchrun (`launch_training`), each of which joins the process group and
runs `futureworld.rl.trainer.train_policy` (`run_rank`), and hands back rank 0's TrainResult.

The launcher passes the job to the ranks as a pickle in a private temporary directory and
reads rank 0's `TrainResult` back the same way; a rank that exits non-zero makes torchrun stop
the others, and the launch raises with the tail of their output.
"""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from futureworld.domain import ScoredRollout, Trajectory
from futureworld.rl.checkpoints import require_free_target
from futureworld.rl.config import TrainConfig
from futureworld.rl.parallel import RankHook, World
from futureworld.rl.trainer import StepCallback, TrainResult, train_policy
from futureworld.torch_threads import torch_thread_count

JOB_FILE = "job.pkl"
RESULT_FILE = "result.pkl"
LAUNCH_OUTPUT_TAIL_CHARS = 4000
"""How much of torchrun's output a failed launch quotes in its error."""


@dataclass(frozen=True)
class TrainingJob:
    """The arguments of one `train_policy` call, as every rank receives them."""

    model_dir: Path
    rollouts: tuple[ScoredRollout | Trajectory, ...]
    config: TrainConfig
    output_dir: Path
    adapter_dir: Path | None = None
    resume_from: Path | None = None
    reference_dir: Path | None = None
    on_save: Callable[[Path], None] | None = None
    """Must be picklable (a module-level function): it runs in rank 0's process."""
    rank_hook: RankHook | None = None
    """Must be picklable; runs in every rank after each optimiser step."""
    torch_threads: int | None = None
    """Torch threads of each rank (the application's FW_TORCH_THREADS); None: the launching
    process's cores shared out among the ranks (futureworld.torch_threads)."""


def _rank_device(config: TrainConfig) -> TrainConfig:
    """Each rank on its own GPU (LOCAL_RANK) when training on CUDA; CPU ranks share the CPU."""
    device = config.resolved_device()
    if device.type != "cuda":
        return config
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    return replace(config, device=f"cuda:{local_rank}")


def run_rank(job_dir: Path) -> None:
    """One rank of a launched job: join the process group, train, rank 0 writes the result.

    Teardown, on success only: the trainer's DDP or FSDP2 wrappers are collected while the
    process group still lives (they hold it and its gloo work), the ranks meet at a barrier and
    then destroy the group together. A rank that raised leaves without the collective destroy
    (it would wait for peers still inside a step); its non-zero exit makes torchrun stop them.
    """
    job: TrainingJob = pickle.loads((job_dir / JOB_FILE).read_bytes())
    config = _rank_device(job.config)
    backend = "nccl" if config.resolved_device().type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)
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
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def launch_training(job: TrainingJob, nproc: int, *, timeout_s: float | None = None) -> TrainResult:
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
            "futureworld.rl.launch",
            str(job_dir),
        ]
        # Each rank's torch threads: its share of the cores, as an in-process update takes
        # all of them (torch reads OMP_NUM_THREADS when a rank starts).
        threads = torch_thread_count(workers=nproc, override=job.torch_threads)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
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
        result: TrainResult = pickle.loads(result_file.read_bytes())
        return result


def train(
    model_dir: Path | str,
    rollouts: Sequence[ScoredRollout | Trajectory],
    config: TrainConfig,
    output_dir: Path | str,
    *,
    nproc: int = 1,
    adapter_dir: Path | str | None = None,
    resume_from: Path | str | None = None,
    reference_dir: Path | str | None = None,
    on_step: StepCallback | None = None,
    on_save: Callable[[Path], None] | None = None,
    rank_hook: RankHook | None = None,
    torch_threads: int | None = None,
) -> TrainResult:
    """`train_policy` in this process (nproc = 1, or already inside a process group), or on
    `nproc` local processes under torchrun, returning rank 0's result; `on_step` is then
    called afterwards with rank 0's per-step metrics, and `on_save` and `rank_hook` must be
    picklable (module-level functions). `torch_threads` sets each rank's torch threads
    (default: this process's cores shared out among the ranks)."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    require_free_target(Path(output_dir))
    if nproc == 1 or World.current().distributed:
        return train_policy(
            model_dir,
            rollouts,
            config,
            output_dir,
            adapter_dir=adapter_dir,
            resume_from=resume_from,
            reference_dir=reference_dir,
            on_step=on_step,
            on_save=on_save,
            rank_hook=rank_hook,
        )
    job = TrainingJob(
        model_dir=Path(model_dir),
        rollouts=tuple(rollouts),
        config=config,
        output_dir=Path(output_dir),
        adapter_dir=Path(adapter_dir) if adapter_dir else None,
        resume_from=Path(resume_from) if resume_from else None,
        reference_dir=Path(reference_dir) if reference_dir else None,
        on_save=on_save,
        rank_hook=rank_hook,
        torch_threads=torch_threads,
    )
    launched = launch_training(job, nproc)
    for metrics in launched.metrics:
        if on_step is not None:
            on_step(int(metrics["step"]), metrics)
    return launched


if __name__ == "__main__":  # a rank started by torchrun (see launch_training)
    run_rank(Path(sys.argv[1]))
    # The job is done and its group destroyed: leave without interpreter finalisation. A rank
    # once aborted in CI ("terminate called without an active exception", a C++ destructor;
    # not reproduced in 20 reruns), failing a launch whose ranks had trained; what remains of
    # torch's state here holds nothing the job needs.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
