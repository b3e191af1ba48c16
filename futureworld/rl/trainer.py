"""The update: replayed rollouts (or SFT trajectories) → a new checkpoint on disk.

`train_policy` is the whole loop; π_prox (and a KL reference) are computed once, then each
AdamW step accumulates the gradients of the packed micro-batches of K whole groups. It never
touches a database: the caller registers the returned checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from futureworld.domain import ScoredRollout, Trajectory
from futureworld.rl.advantages import compute_advantages
from futureworld.rl.batch import PackedRow, pack_steps, token_logprobs
from futureworld.rl.checkpoints import (
    load_optimizer_state,
    load_policy,
    load_trainer_state,
    require_free_target,
    save_checkpoint,
)
from futureworld.rl.config import Estimator, Objective, TrainConfig
from futureworld.rl.losses import OBJECTIVES, LossInputs, step_normalizer, summarize_metrics
from futureworld.rl.sampling import check_sampling

StepCallback = Callable[[int, dict[str, float]], None]
"""on_step(step, metrics): called after every optimiser step."""


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


def _temperature(config: TrainConfig) -> float:
    if config.temperature is None:
        raise ValueError(
            "TrainConfig.temperature is unresolved: pass the config through "
            "futureworld.rl.sampling.check_sampling with the rollouts first"
        )
    return config.temperature


def _autocast(config: TrainConfig, device: torch.device):
    dtype = config.autocast_dtype(device)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()


@torch.no_grad()
def frozen_logprobs(
    model: nn.Module, rows: Sequence[PackedRow], config: TrainConfig
) -> list[torch.Tensor]:
    """log π of every row's targets under the current weights, without gradients."""
    was_training = model.training
    model.eval()
    device = rows[0].input_ids.device if rows else torch.device("cpu")
    temperature = _temperature(config)
    with _autocast(config, device):
        out = [
            token_logprobs(model, row, temperature, config.logprob_chunk_tokens)[0] for row in rows
        ]
    model.train(was_training)
    return out


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[PackedRow],
    config: TrainConfig,
) -> dict[str, float]:
    """One optimiser step: the gradients of micro-batches `rows` (each with logp_prox set)
    summed, then one clipped AdamW step; returns the step's metrics.

    The keep mask (M2PO's "batch") and the normaliser N are decided over the whole step,
    N from the loss-mask tokens before any is rejected, so the accumulated gradient equals
    the gradient of the step computed as one batch.
    """
    start = time.perf_counter()
    device = rows[0].input_ids.device
    temperature = _temperature(config)
    objective = OBJECTIVES[config.objective]
    mask = torch.cat([r.mask for r in rows], 1)
    keep = objective.keep_mask(
        torch.cat([r.logp_prox for r in rows], 1),
        torch.cat([r.logp_behaviour for r in rows], 1),
        mask,
        config,
    ).split([r.num_tokens for r in rows], 1)
    normalizer = step_normalizer(int(mask.sum()), sum(len(r.rollout_indices) for r in rows), config)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums: Counter[str] = Counter()
    loss_total = 0.0
    for row, row_keep in zip(rows, keep, strict=True):
        with _autocast(config, device):
            logp, entropy = token_logprobs(model, row, temperature, config.logprob_chunk_tokens)
        inputs = LossInputs(
            logp_prox=row.logp_prox,
            logp_behaviour=row.logp_behaviour,
            advantages=row.advantages,
            mask=row.mask,
            keep=row_keep,
            logp_ref=row.logp_ref,
            entropy=entropy,
            normalizer=normalizer,
        )
        out = objective.loss(logp, inputs, config)
        out.loss.backward()
        loss_total += float(out.loss.detach())
        sums.update(out.sums)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
    optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    tokens = sum(r.num_tokens for r in rows)
    return {
        "loss": loss_total,
        **summarize_metrics(sums),
        "grad_norm": grad_norm,
        "tokens_per_s": tokens / elapsed,
    }


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
) -> TrainResult:
    """Trains the policy at `model_dir` (+ `adapter_dir`) on `rollouts`; writes `output_dir`.

    `rollouts` are in replay order (oldest first); each optimiser step takes the next
    `config.groups_per_step` whole groups. Log-probs are recomputed at the temperature the
    rollouts were sampled at (`futureworld.rl.sampling`). `resume_from` is a checkpoint of an
    earlier call: its weights/adapter, AdamW moments and step counter are continued, under this
    call's learning rate, betas and weight decay. `reference_dir` is the KL reference of full
    fine-tuning (the agent's base model); LoRA's reference is the base under the adapter.
    """
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    require_free_target(output_dir)
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
    steps = pack_steps(
        trajectories,
        advantages.token_advantages,
        advantages.group_sizes,
        config.groups_per_step,
        config.micro_batch_tokens,
    )
    rows = [r.to(device) for step in steps for r in step.rows]
    prox = frozen_logprobs(model, rows, config)  # π_prox: frozen for the whole update
    rows = [dataclasses.replace(r, logp_prox=p) for r, p in zip(rows, prox, strict=True)]
    rows = _attach_reference(model, rows, config, Path(reference_dir) if reference_dir else None)
    rows_of_steps = iter(rows)
    steps = [
        dataclasses.replace(step, rows=tuple(next(rows_of_steps) for _ in step.rows))
        for step in steps
    ]
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=config.learning_rate, betas=config.adam_betas, weight_decay=config.weight_decay
    )
    global_step = 0
    if resume is not None:
        # The moments and step counts carry over; this update's hyper-parameters stand.
        load_optimizer_state(optimizer, resume)
        for group in optimizer.param_groups:
            group.update(
                lr=config.learning_rate,
                betas=config.adam_betas,
                weight_decay=config.weight_decay,
            )
        global_step = int(resumed["global_step"])
    staleness = [r.staleness for r in advantages.rollouts]
    history: list[dict[str, float]] = []
    for epoch in range(config.ppo_epochs):
        for step in steps:
            metrics = train_step(model, optimizer, step.rows, config)
            step_staleness = [staleness[j] for j in step.rollouts]
            global_step += 1
            metrics.update(
                step=float(global_step),
                epoch=float(epoch),
                groups=float(step.groups),
                rollouts=float(len(step.rollouts)),
                staleness_mean=sum(step_staleness) / len(step_staleness),
                staleness_max=float(max(step_staleness)),
            )
            history.append(metrics)
            if on_step is not None:
                on_step(global_step, metrics)
    state = _trainer_state(
        config,
        model_dir,
        global_step,
        rollouts_used=len(advantages.rollouts),
        groups_skipped=advantages.groups_skipped,
        reference=None if reference_dir is None else str(reference_dir),
    )
    sha256 = save_checkpoint(
        model, optimizer, state, output_dir, tokenizer_dir=model_dir, on_save=on_save
    )
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
