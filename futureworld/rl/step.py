"""One optimiser step of the update, and the frozen log-probs it is measured against.

`train_step` sums the gradients of a step's packed micro-batches under one normaliser and
takes one clipped AdamW step; with N ranks it also sums the step's counts and metrics over
them (futureworld.rl.parallel). `frozen_logprobs` computes π_prox (and π_ref) once per
update. The loop around them is `futureworld.rl.trainer.train_policy`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from futureworld.rl.batch import PackedRow
from futureworld.rl.config import TrainConfig
from futureworld.rl.forward import entropy_gradient, forwarded_positions, token_logprobs
from futureworld.rl.losses import OBJECTIVES, LossInputs, step_normalizer, summarize_metrics
from futureworld.rl.parallel import StepForward, padding_row


def recompute_temperature(config: TrainConfig) -> float:
    if config.temperature is None:
        raise ValueError(
            "TrainConfig.temperature is unresolved: pass the config through "
            "futureworld.rl.sampling.check_sampling with the rollouts first"
        )
    return config.temperature


def autocast_context(config: TrainConfig, device: torch.device):
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
    temperature = recompute_temperature(config)
    with autocast_context(config, device):
        out = [
            token_logprobs(model, row, temperature, config.logprob_chunk_tokens)[0] for row in rows
        ]
    model.train(was_training)
    return out


@dataclass(frozen=True)
class StepOutcome:
    """What one `train_step` did."""

    metrics: dict[str, float]
    stopped: bool = False
    """The step was not taken: its KL to π_prox was over `max_kl_prox` (the update ends)."""


def train_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[PackedRow],
    config: TrainConfig,
    *,
    forward: StepForward | None = None,
    spare: PackedRow | None = None,
) -> StepOutcome:
    """One optimiser step: the gradients of micro-batches `rows` (each with logp_prox set)
    summed, then one clipped AdamW step; returns the step's metrics, among them `kl_prox`,
    the k3 estimate of KL(π_prox ‖ π_θ) per loss-mask token before the step. When it exceeds
    `config.max_kl_prox` the step is not taken (`stopped`, metrics {"kl_prox"}): the update
    ends there (PPO's target KL).

    The keep mask (M2PO's "batch") and the normaliser N are decided over the whole step,
    N from the loss-mask tokens before any is rejected, so the accumulated gradient equals
    the gradient of the step computed as one batch. With N ranks (`forward.world`), `rows`
    are this rank's share: N and the metrics are summed over ranks, a rank with fewer rows
    runs zero-weight copies of `spare`, and the last backward all-reduces the gradients.
    """
    start = time.perf_counter()
    temperature = recompute_temperature(config)
    forward = forward or StepForward.local(model, temperature, config.logprob_chunk_tokens)
    world = forward.world
    objective = OBJECTIVES[config.objective]
    mask_tokens = sum(int(r.mask.sum()) for r in rows)
    rollouts = sum(len(r.rollout_indices) for r in rows)
    mask_tokens, rollouts = (int(x) for x in world.sum_floats([mask_tokens, rollouts]))
    keep = (
        objective.keep_mask(
            torch.cat([r.logp_prox for r in rows], 1),
            torch.cat([r.logp_behaviour for r in rows], 1),
            torch.cat([r.mask for r in rows], 1),
            config,
        ).split([r.num_tokens for r in rows], 1)
        if rows
        else ()
    )
    normalizer = step_normalizer(mask_tokens, rollouts, config)
    passes = world.max_int(len(rows))
    work = [(row, row_keep, 1.0) for row, row_keep in zip(rows, keep, strict=True)]
    if len(work) < passes:
        source = rows[0] if rows else spare
        if source is None:
            raise ValueError("a rank without rows in a step needs a spare row to pad with")
        pad = padding_row(source, with_reference=config.kl_coef > 0)
        work += [(pad, pad.mask, 0.0)] * (passes - len(work))
    model.train()
    optimizer.zero_grad(set_to_none=True)
    sums: Counter[str] = Counter()
    loss_total = 0.0
    kl_prox = 0.0
    for i, (row, row_keep, weight) in enumerate(work):
        # DDP averages over ranks; scaling by N makes the reduced gradient the ranks' sum
        with forward.no_sync() if i < len(work) - 1 else nullcontext():
            # the entropy bonus needs the entropy's gradient; the metric alone does not
            bonus = entropy_gradient(config.entropy_coef > 0)
            with autocast_context(config, row.input_ids.device), bonus:
                logp, entropy = forward.logprobs(row)
            inputs = LossInputs(
                logp_prox=row.logp_prox,
                logp_behaviour=row.logp_behaviour,
                advantages=row.advantages,
                mask=row.mask,
                keep=row_keep,
                logp_ref=row.logp_ref,
                entropy=entropy,
                normalizer=normalizer,
                position_ids=row.position_ids,
            )
            out = objective.loss(logp, inputs, config)
            (out.loss * (weight * world.size)).backward()
        if weight:
            loss_total += float(out.loss.detach())
            sums.update(out.sums)
            log_ratio = (logp.detach() - row.logp_prox)[row.mask]
            kl_prox += float((log_ratio.exp() - 1 - log_ratio).sum())
    # k3 estimate of KL(π_prox ‖ π_θ) per loss-mask token, over every rank's rows
    kl_prox = world.sum_floats([kl_prox])[0] / max(mask_tokens, 1)
    if config.max_kl_prox is not None and kl_prox > config.max_kl_prox:
        optimizer.zero_grad(set_to_none=True)
        return StepOutcome(metrics={"kl_prox": kl_prox}, stopped=True)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm))
    optimizer.step()
    device = work[0][0].input_ids.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - start
    keys = sorted(sums)
    if world.distributed:
        keys = sorted({*keys, *_SUM_KEYS})
        loss_total, *values = world.sum_floats([loss_total, *(sums[k] for k in keys)])
        sums = Counter(dict(zip(keys, values, strict=True)))
    tokens, positions, n_rows = world.sum_floats(
        [sum(r.num_tokens for r in rows), sum(forwarded_positions(r) for r in rows), len(rows)]
    )
    return StepOutcome(
        metrics={
            "loss": loss_total,
            **summarize_metrics(sums),
            "grad_norm": grad_norm,
            "tokens_per_s": tokens / elapsed,
            "kl_prox": kl_prox,
            "rows": n_rows,
            "positions": positions,  # token positions the step's forwards computed
        }
    )


_SUM_KEYS = ("mask_tokens", "kept_tokens", "kl_behaviour", "chi2", "sampler_gap", "entropy")
_SUM_KEYS += ("clip_low", "clip_high", "kl_ref")
"""The additive statistics every objective reports; summed over ranks in one all-reduce."""
