"""The update: replayed rollouts (or SFT trajectories) → a new checkpoint on disk.

`train_policy` is the whole loop; π_prox is computed once, then AdamW steps over packed
micro-batches. It never touches a database: the caller registers the returned checkpoint.
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
from futureworld.rl.batch import PackedRow, pack_trajectories, token_logprobs
from futureworld.rl.checkpoints import (
    load_optimizer_state,
    load_policy,
    load_trainer_state,
    require_free_target,
    save_checkpoint,
)
from futureworld.rl.config import Estimator, Objective, TrainConfig
from futureworld.rl.losses import OBJECTIVES, LossInputs, summarize_metrics

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


def check_rollouts(rollouts: Sequence[ScoredRollout], config: TrainConfig, vocab_size: int) -> None:
    """Refuses token ids the model cannot embed and behaviour log-probs taken at another
    temperature (μ must be the distribution π_prox is computed at: logits / T)."""
    for rollout in rollouts:
        traj = rollout.trajectory
        ids = traj.prompt_token_ids + traj.completion_token_ids
        if ids and not 0 <= min(ids) <= max(ids) < vocab_size:
            raise ValueError(
                f"rollout {traj.idempotency_key} has token ids outside the model's "
                f"vocabulary of {vocab_size} (min {min(ids)}, max {max(ids)})"
            )
        sampled_at = (
            traj.sampling.get("temperature")
            if config.objective is Objective.DECOUPLED_PPO
            else None
        )
        if sampled_at is not None and abs(float(sampled_at) - config.temperature) > 1e-6:
            raise ValueError(
                f"rollout {traj.idempotency_key} was sampled at temperature {sampled_at} "
                f"but the update recomputes log-probs at {config.temperature}"
            )


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
    with _autocast(config, device):
        out = [
            token_logprobs(model, row, config.temperature, config.logprob_chunk_tokens)[0]
            for row in rows
        ]
    model.train(was_training)
    return out


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[PackedRow],
    config: TrainConfig,
) -> dict[str, float]:
    """One optimiser step over micro-batches `rows` (each with logp_prox set); returns metrics."""
    start = time.perf_counter()
    device = rows[0].input_ids.device
    objective = OBJECTIVES[config.objective]
    # the keep mask is decided over the whole step batch (M2PO's "batch"), and so is N
    keep = objective.keep_mask(
        torch.cat([r.logp_prox for r in rows], 1),
        torch.cat([r.logp_behaviour for r in rows], 1),
        torch.cat([r.mask for r in rows], 1),
        config,
    ).split([r.num_tokens for r in rows], 1)
    normalizer = float(sum(int(k.sum()) for k in keep))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums: Counter[str] = Counter()
    loss_total = 0.0
    for row, row_keep in zip(rows, keep, strict=True):
        with _autocast(config, device):
            logp, entropy = token_logprobs(
                model, row, config.temperature, config.logprob_chunk_tokens
            )
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
    """log π_ref for the k3 penalty: the base without the adapter (LoRA), `reference_dir`,
    or else π_prox itself (a trust region around the weights the update started from)."""
    if config.kl_coef == 0:
        return rows
    if config.lora:
        with model.disable_adapter():
            ref = frozen_logprobs(model, rows, config)
    elif reference_dir is not None:
        reference = load_policy(Path(reference_dir), dataclasses.replace(config, lora=False))
        ref = frozen_logprobs(reference.to(rows[0].input_ids.device), rows, config)
        del reference
    else:
        ref = [r.logp_prox for r in rows]
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

    `rollouts` are in replay order (oldest first). `resume_from` is a checkpoint of an
    earlier call: its weights/adapter, AdamW moments and step counter are continued, under this
    call's learning rate, betas and weight decay.
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
    resume = Path(resume_from) if resume_from is not None else None
    resumed = load_trainer_state(resume, lora=config.lora) if resume is not None else {}
    model = load_policy(
        model_dir,
        config,
        adapter_dir=Path(adapter_dir) if adapter_dir else None,
        resume_from=resume,
    ).to(device)
    check_rollouts(advantages.rollouts, config, model.get_input_embeddings().num_embeddings)
    trajectories = [r.trajectory for r in advantages.rollouts]
    rows = pack_trajectories(trajectories, advantages.token_advantages, config.micro_batch_tokens)
    rows = [r.to(device) for r in rows]
    prox = frozen_logprobs(model, rows, config)  # π_prox: frozen for the whole update
    rows = [dataclasses.replace(r, logp_prox=p) for r, p in zip(rows, prox, strict=True)]
    rows = _attach_reference(model, rows, config, Path(reference_dir) if reference_dir else None)
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
        for i in range(0, len(rows), config.grad_accum_steps):
            step_rows = rows[i : i + config.grad_accum_steps]
            metrics = train_step(model, optimizer, step_rows, config)
            step_staleness = [staleness[j] for r in step_rows for j in r.rollout_indices]
            global_step += 1
            metrics.update(
                step=float(global_step),
                epoch=float(epoch),
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
