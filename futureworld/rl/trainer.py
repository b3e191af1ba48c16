"""The update: replayed rollouts (or SFT trajectories) → a new checkpoint on disk.

`train_policy` is the whole loop; π_prox (and a KL reference) are computed once, then each
AdamW step accumulates the gradients of the packed micro-batches of K whole groups. It never
touches a database: the caller registers the returned checkpoint.

The same loop runs in 1 or N processes (`nproc`, or inside a process group torchrun made),
launched by torchrun (futureworld.rl.launch): each rank trains on its share of every step's
whole groups, the ranks' gradients are averaged, and the step's normaliser is the global
loss-mask token count, so N ranks take the step one process would. How the ranks share the
model is `TrainConfig.parallel` (futureworld.rl.parallel): DDP (the default) keeps a full
replica on every rank, exact and simple for what this pipeline trains on one node (policies
up to a few billion parameters, LoRA beyond); FSDP2 (`fully_shard`) shards the parameters,
gradients and AdamW state, which full fine-tuning of a 7B policy needs. Either way the
checkpoint is in the single-process format (a version trained on N ranks resumes on 1 and
back), and π_prox and the KL reference are computed per rank before the model is wrapped.
M2PO's step-wide mask is refused with N ranks (it would need every rank's tokens). Only
rank 0 writes the checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from futureworld.domain import ScoredRollout, Trajectory
from futureworld.rl.advantages import compute_advantages
from futureworld.rl.batch import PackedRow, pack_trajectories
from futureworld.rl.checkpoints import (
    load_policy,
    load_trainer_state,
    read_optimizer_state,
    require_free_target,
    save_checkpoint,
)
from futureworld.rl.config import Estimator, Objective, TrainConfig
from futureworld.rl.parallel import RankHook, StepForward, World, shard_steps
from futureworld.rl.sampling import check_sampling
from futureworld.rl.step import frozen_logprobs, recompute_temperature, train_step

log = logging.getLogger(__name__)

StepCallback = Callable[[int, dict[str, float]], None]
"""on_step(step, metrics): called after every optimiser step; metrics["steps_planned"] is
the optimiser steps this call plans (its steps × ppo_epochs)."""


@dataclass(frozen=True)
class TrainResult:
    checkpoint_path: Path
    checkpoint_sha256: str
    steps: int
    """Optimiser steps taken by this call."""
    global_step: int
    """Steps including those before `resume_from`."""
    metrics: tuple[dict[str, float], ...]
    """Per-step metrics, as passed to on_step."""
    rollouts_used: int
    groups_used: int
    groups_skipped: int


def as_scored_rollouts(
    items: Sequence[ScoredRollout | Trajectory], config: TrainConfig
) -> list[ScoredRollout]:
    """SFT accepts bare trajectories (no reward needed); RL needs scored rollouts."""
    out = []
    for item in items:
        if isinstance(item, ScoredRollout):
            out.append(item)
        elif isinstance(item, Trajectory) and config.objective is Objective.SFT:
            out.append(
                ScoredRollout(trajectory=item, reward=0.0, outcome_value=None, outcome_revision=0)
            )
        else:
            raise TypeError(
                f"{config.estimator} training needs ScoredRollout items, got {type(item).__name__}"
            )
    return out


def check_rollouts(rollouts: Sequence[ScoredRollout], vocab_size: int) -> None:
    """Refuses token ids the model cannot embed, naming the rollout."""
    for rollout in rollouts:
        traj = rollout.trajectory
        ids = traj.prompt_token_ids + traj.completion_token_ids
        if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
            raise ValueError(
                f"rollout {traj.idempotency_key} has token ids outside the model's "
                f"vocabulary of {vocab_size} (min {min(ids)}, max {max(ids)})"
            )


def _attach_reference(
    model: nn.Module, rows: list[PackedRow], config: TrainConfig, reference_dir: Path | None
) -> list[PackedRow]:
    """log π_ref for the k3 penalty, computed once per update: the base model under the
    adapter (LoRA), or the model at `reference_dir` (full fine-tuning: the agent's base,
    version 0), loaded for this and freed again. KL without a reference is refused rather
    than anchored to π_prox, which would silently be a different regulariser."""
    if config.kl_coef == 0 or config.objective is Objective.SFT:  # SFT has no KL term
        return rows
    if config.lora:
        with model.disable_adapter():
            ref = frozen_logprobs(model, rows, config)
    elif reference_dir is not None:
        reference = load_policy(Path(reference_dir), dataclasses.replace(config, lora=False))
        ref = frozen_logprobs(reference.to(rows[0].input_ids.device), rows, config)
        del reference
    else:
        raise ValueError(
            f"kl_coef={config.kl_coef} needs a reference policy: pass reference_dir "
            "(the agent's base model) or train LoRA (the base under the adapter)"
        )
    return [dataclasses.replace(r, logp_ref=lr) for r, lr in zip(rows, ref, strict=True)]


def _trainer_state(
    config: TrainConfig, model_dir: Path, global_step: int, **extra: Any
) -> dict[str, Any]:
    return {
        "global_step": global_step,
        "base_model": str(model_dir),
        "config": config.to_json(),
        **extra,
    }


def train_policy(
    model_dir: Path | str,
    rollouts: Sequence[ScoredRollout | Trajectory],
    config: TrainConfig,
    output_dir: Path | str,
    *,
    adapter_dir: Path | str | None = None,
    resume_from: Path | str | None = None,
    reference_dir: Path | str | None = None,
    on_step: StepCallback | None = None,
    on_save: Callable[[Path], None] | None = None,
    rank_hook: RankHook | None = None,
) -> TrainResult:
    """Trains the policy at `model_dir` (+ `adapter_dir`) on `rollouts`; writes `output_dir`.

    `rollouts` are in replay order (oldest first); each optimiser step takes the next
    `config.groups_per_step` whole groups. Log-probs are recomputed at the temperature the
    rollouts were sampled at (`futureworld.rl.sampling`). `resume_from` is a checkpoint of an
    earlier call: its weights/adapter, AdamW moments and step counter are continued, under this
    call's learning rate, betas and weight decay. `reference_dir` is the KL reference of full
    fine-tuning (the agent's base model); LoRA's reference is the base under the adapter.

    Inside a process group (futureworld.rl.launch starts one) every rank calls this function
    itself on the same arguments; `rank_hook(rank, step)` runs on each after every step.
    """
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    require_free_target(output_dir)
    world = World.current()
    if world.distributed and config.m2po_tau is not None:
        raise ValueError(
            "M2PO (m2po_tau) decides its mask over every token of a step, which no single "
            f"rank holds; train with one process or without M2PO ({world.size} ranks given)"
        )
    device = config.resolved_device()
    torch.manual_seed(config.seed)
    advantages = compute_advantages(as_scored_rollouts(rollouts, config), config)
    if not advantages.rollouts:
        raise ValueError(
            f"no trainable rollouts: all {advantages.groups_skipped} groups were skipped by "
            f"{config.estimator} (fewer than 2 usable rollouts each)"
        )
    trajectories = [r.trajectory for r in advantages.rollouts]
    config = check_sampling(trajectories, config)
    resume = Path(resume_from) if resume_from is not None else None
    resumed = load_trainer_state(resume, lora=config.lora) if resume is not None else {}
    model = load_policy(
        model_dir,
        config,
        adapter_dir=Path(adapter_dir) if adapter_dir else None,
        resume_from=resume,
    ).to(device)
    check_rollouts(advantages.rollouts, model.get_input_embeddings().num_embeddings)
    steps = shard_steps(
        trajectories,
        advantages.token_advantages,
        advantages.group_sizes,
        config.groups_per_step,
        config.micro_batch_tokens,
        world,
        pack_singles=config.pack_single_rollouts,
    )
    spare = None
    if world.distributed:  # a rank without groups in a step pads with a first-group row
        first_group = range(advantages.group_sizes[0])
        first_rows = pack_trajectories(
            [trajectories[i] for i in first_group],
            [advantages.token_advantages[i] for i in first_group],
            config.micro_batch_tokens,
        )
        spare = _prepare_rows(model, first_rows[:1], config, reference_dir, device)[0]
    rows = _prepare_rows(
        model, [r for step in steps for r in step.rows], config, reference_dir, device
    )
    rows_of_steps = iter(rows)
    steps = [
        dataclasses.replace(step, rows=tuple(next(rows_of_steps) for _ in step.rows))
        for step in steps
    ]
    temperature = recompute_temperature(config)
    # before the optimiser: FSDP2 replaces the parameters with their shards
    forward = StepForward.for_update(
        model, config.parallel, temperature, config.logprob_chunk_tokens, world
    )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=config.learning_rate, betas=config.adam_betas, weight_decay=config.weight_decay
    )
    global_step = 0
    if resume is not None:
        # The moments and step counts carry over; this update's hyper-parameters stand.
        forward.state.load_optimizer(model, optimizer, read_optimizer_state(resume))
        for group in optimizer.param_groups:
            group.update(
                lr=config.learning_rate,
                betas=config.adam_betas,
                weight_decay=config.weight_decay,
            )
        global_step = int(resumed["global_step"])
    planned = len(steps) * config.ppo_epochs
    done = 0
    staleness = [r.staleness for r in advantages.rollouts]
    history: list[dict[str, float]] = []
    stopped = False
    for epoch in range(config.ppo_epochs):
        for step in steps:
            lr = optimizer.param_groups[0]["lr"]
            outcome = train_step(model, optimizer, step.rows, config, forward=forward, spare=spare)
            metrics = outcome.metrics
            if outcome.stopped:
                log.warning(
                    "update stopped early before step %d: KL to π_prox %.4f > max_kl_prox %s",
                    global_step + 1,
                    metrics["kl_prox"],
                    config.max_kl_prox,
                )
                stopped = True
                break
            step_staleness = [staleness[j] for j in step.rollouts]
            global_step += 1
            metrics.update(
                step=float(global_step),
                epoch=float(epoch),
                groups=float(step.groups),
                rollouts=float(len(step.rollouts)),
                staleness_mean=sum(step_staleness) / len(step_staleness),
                staleness_max=float(max(step_staleness)),
                steps_planned=float(planned),  # an early stop ends sooner
                lr=lr,
            )
            done += 1
            if config.lr_decay:  # linearly to zero at the last planned step
                for group in optimizer.param_groups:
                    group["lr"] = config.learning_rate * (1.0 - done / planned)
            history.append(metrics)
            if on_step is not None and world.is_main:
                on_step(global_step, metrics)
            if rank_hook is not None:
                rank_hook(world.rank, global_step)
        if stopped:
            break
    state = _trainer_state(
        config,
        model_dir,
        global_step,
        rollouts_used=len(advantages.rollouts),
        groups_skipped=advantages.groups_skipped,
        reference=None if reference_dir is None else str(reference_dir),
    )
    sha256 = ""
    saved = forward.state.gather(model, optimizer)  # on every rank: FSDP2 gathers the shards
    if world.is_main:  # one writer
        sha256 = save_checkpoint(
            model,
            saved.optimizer,
            state,
            output_dir,
            model_state=saved.model,
            tokenizer_dir=model_dir,
            on_save=on_save,
        )
    world.barrier()
    return TrainResult(
        checkpoint_path=output_dir,
        checkpoint_sha256=sha256,
        steps=len(history),
        global_step=global_step,
        metrics=tuple(history),
        rollouts_used=len(advantages.rollouts),
        groups_used=advantages.groups_used,
        groups_skipped=advantages.groups_skipped,
    )


def _prepare_rows(
    model: nn.Module,
    rows: list[PackedRow],
    config: TrainConfig,
    reference_dir: Path | str | None,
    device: torch.device,
) -> list[PackedRow]:
    """Rows on `device` with log π_prox (frozen for the whole update) and log π_ref set."""
    rows = [r.to(device) for r in rows]
    if not rows:
        return rows
    prox = frozen_logprobs(model, rows, config)
    rows = [dataclasses.replace(r, logp_prox=p) for r, p in zip(rows, prox, strict=True)]
    return _attach_reference(model, rows, config, Path(reference_dir) if reference_dir else None)


def train_sft(
    model_dir: Path | str,
    trajectories: Sequence[Trajectory | ScoredRollout],
    config: TrainConfig,
    output_dir: Path | str,
    **kwargs: Any,
) -> TrainResult:
    """Supervised fine-tuning on the generated tokens of `trajectories` (same data path)."""
    sft_config = dataclasses.replace(config, estimator=Estimator.SFT)
    return train_policy(model_dir, trajectories, sft_config, output_dir, **kwargs)
