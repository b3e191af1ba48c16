"""Policy losses on per-token log-probs: decoupled PPO (the RL update) and SFT.

Pure tensor functions, registered in `OBJECTIVES` by `Objective`, and the step normalisers,
registered in `NORMALIZERS` by `LossAggregation`. They know nothing of models or batching:
`token_logprobs` (forward.py) produces their inputs. The normaliser is decided before any token
is rejected, so dropping a token removes its term and leaves every other token's weight alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from futureworld.rl.config import LossAggregation, Objective, TrainConfig

_LOG_RATIO_METRIC_CAP = 30.0
"""Log-ratios are clamped here in metrics only, so χ² of a wildly stale batch stays finite."""


@dataclass(frozen=True)
class LossInputs:
    """Per-token tensors of one micro-batch, all of shape (B, T) (packed rows: B = 1)."""

    logp_prox: Tensor
    """log π_prox(token): the weights frozen at the start of the update."""
    logp_behaviour: Tensor
    """log μ(token): the stored behaviour log-probs (0 on observation tokens)."""
    advantages: Tensor
    """A per token (0 on observation tokens)."""
    mask: Tensor
    """bool, True on generated (loss-mask 1) tokens."""
    keep: Tensor | None = None
    """bool, tokens that enter the loss; None → `OBJECTIVES[...].keep_mask` on this micro-batch."""
    logp_ref: Tensor | None = None
    """log π_ref for the k3 KL penalty; None disables it."""
    entropy: Tensor | None = None
    """Per-token entropy of π_θ (detached), for the metrics."""
    normalizer: float | None = None
    """N of the whole optimiser step (`step_normalizer`); None → this micro-batch's
    loss-mask token count."""


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor
    """Scalar; this micro-batch's share of Σ_kept ℓ_t / N."""
    sums: dict[str, float]
    """Additive statistics; `summarize_metrics` turns summed dicts into means."""


def off_policy_mask(
    logp_prox: Tensor, logp_behaviour: Tensor, mask: Tensor, config: TrainConfig
) -> Tensor:
    """Tokens kept for decoupled PPO, bool (B, T).

    1. Rejection: drop tokens with π_prox/μ > reject_bound (μ far too small for a stable
       importance weight).
    2. M2PO (Zheng et al. 2025, "Prosperity before Collapse", arXiv:2510.01161), when
       `m2po_tau` is set: with m2_t = (log π_prox − log μ)², drop the tokens of largest m2_t,
       largest first, until the mean m2 over the kept tokens is ≤ τ.
    """
    log_ratio = (logp_prox - logp_behaviour).detach()
    keep = mask.bool() & (log_ratio <= math.log(config.reject_bound))
    if config.m2po_tau is None or not keep.any():
        return keep
    m2 = log_ratio[keep].double() ** 2
    order = torch.argsort(m2)  # ascending: keeping a prefix drops the largest first
    prefix_mean = torch.cumsum(m2[order], 0) / torch.arange(1, len(m2) + 1, dtype=m2.dtype)
    # prefix means of sorted values are non-decreasing, so the kept prefix is the longest
    # one whose mean is within τ
    n_keep = int((prefix_mean <= config.m2po_tau).sum())
    kept_flat = torch.zeros(len(m2), dtype=torch.bool, device=m2.device)
    kept_flat[order[:n_keep]] = True
    out = keep.clone()
    out[keep] = kept_flat
    return out


def _normalizer(inputs: LossInputs) -> float:
    return inputs.normalizer if inputs.normalizer is not None else float(inputs.mask.sum())


def _off_policy_sums(inputs: LossInputs, keep: Tensor) -> dict[str, float]:
    """KL(μ‖π_prox) by the k3 estimator and χ² = E_μ[(π_prox/μ)²] − 1, over generated tokens."""
    mask = inputs.mask.bool()
    log_ratio = (inputs.logp_prox - inputs.logp_behaviour).detach()[mask].double()
    log_ratio = log_ratio.clamp(max=_LOG_RATIO_METRIC_CAP)
    ratio = log_ratio.exp()
    return {
        "mask_tokens": float(mask.sum()),
        "kept_tokens": float(keep.sum()),
        "kl_behaviour": float((ratio - 1 - log_ratio).sum()),
        "chi2": float((ratio**2 - 1).sum()),
        "entropy": 0.0 if inputs.entropy is None else float(inputs.entropy.detach()[mask].sum()),
    }


def decoupled_ppo_loss(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> LossOutput:
    """Decoupled PPO with truncated behaviour weights (Hilton et al. 2022, arXiv:2110.00641).

    Shapes: every tensor (B, T). With r_t = π_θ/π_prox and w_t = stopgrad(min(π_prox/μ, C)):
        ℓ_t = −w_t · min(r_t A_t, clip(r_t, 1 − clip_low, 1 + clip_high) A_t)
              [+ kl_coef · k3_t,  k3_t = e^{log π_ref − log π_θ} − (log π_ref − log π_θ) − 1]
        loss = Σ_{t ∈ kept} ℓ_t / N,  N from `step_normalizer` (by default the loss-mask
        token count of the optimiser step, counted before rejection and M2PO).
    π_prox is the trust-region anchor, μ only enters through w_t, so data many versions
    old is corrected rather than dropped. Clip-higher from DAPO (Yu et al. 2025).
    """
    keep = (
        inputs.keep
        if inputs.keep is not None
        else off_policy_mask(inputs.logp_prox, inputs.logp_behaviour, inputs.mask, config)
    )
    keep = keep.bool()
    prox = inputs.logp_prox.detach()
    weight = torch.exp(prox - inputs.logp_behaviour).clamp(max=config.is_cap).detach()
    ratio = torch.exp(logp - prox)
    adv = inputs.advantages
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high) * adv
    per_token = -weight * torch.minimum(unclipped, clipped)
    kl_sum = 0.0
    if inputs.logp_ref is not None and config.kl_coef > 0:
        delta = inputs.logp_ref.detach() - logp
        k3 = torch.exp(delta) - delta - 1
        per_token = per_token + config.kl_coef * k3
        kl_sum = float(k3.detach()[keep].sum())
    normalizer = _normalizer(inputs)
    # where(), not a multiply: an overflowing ratio on a dropped token must not become NaN
    loss = torch.where(keep, per_token, 0.0).sum() / max(normalizer, 1.0)
    with torch.no_grad():
        r = ratio.detach()
        sums = _off_policy_sums(inputs, keep)
        sums["clip_low"] = float(((r < 1 - config.clip_low) & (adv < 0) & keep).sum())
        sums["clip_high"] = float(((r > 1 + config.clip_high) & (adv > 0) & keep).sum())
        sums["kl_ref"] = kl_sum
    return LossOutput(loss, sums)


def sft_loss(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> LossOutput:
    """Supervised fine-tuning: loss = −Σ_t A_t log π_θ(t) / N over kept tokens, (B, T) inputs.

    With the `sft` estimator A_t = 1 on generated tokens, so this is −mean log π over them.
    """
    keep = (inputs.keep if inputs.keep is not None else inputs.mask).bool()
    normalizer = _normalizer(inputs)
    loss = -torch.where(keep, logp * inputs.advantages, 0.0).sum() / max(normalizer, 1.0)
    with torch.no_grad():
        sums = _off_policy_sums(inputs, keep)
        sums.update(clip_low=0.0, clip_high=0.0, kl_ref=0.0)
    return LossOutput(loss, sums)


def sft_keep_mask(
    logp_prox: Tensor, logp_behaviour: Tensor, mask: Tensor, config: TrainConfig
) -> Tensor:
    """SFT trains on every generated token: μ may be a teacher's, never a reason to drop."""
    return mask.bool()


def summarize_metrics(sums: Mapping[str, float]) -> dict[str, float]:
    """Means from summed statistics: per kept token for the loss terms, per generated token else."""
    mask_n = max(sums.get("mask_tokens", 0.0), 1.0)
    kept_n = max(sums.get("kept_tokens", 0.0), 1.0)
    return {
        "clip_low_fraction": sums.get("clip_low", 0.0) / kept_n,
        "clip_high_fraction": sums.get("clip_high", 0.0) / kept_n,
        "clip_fraction": (sums.get("clip_low", 0.0) + sums.get("clip_high", 0.0)) / kept_n,
        "kl_behaviour": sums.get("kl_behaviour", 0.0) / mask_n,
        "chi2": sums.get("chi2", 0.0) / mask_n,
        "rejected_fraction": 1.0 - sums.get("kept_tokens", 0.0) / mask_n,
        "entropy": sums.get("entropy", 0.0) / mask_n,
        "kl_ref": sums.get("kl_ref", 0.0) / kept_n,
        "tokens": sums.get("mask_tokens", 0.0),
    }


@dataclass(frozen=True)
class ObjectiveFns:
    keep_mask: Callable[[Tensor, Tensor, Tensor, TrainConfig], Tensor]
    """(logp_prox, logp_behaviour, mask, config) → bool (B, T) tokens that enter the loss."""
    loss: Callable[[Tensor, LossInputs, TrainConfig], LossOutput]
    """(logp_θ (B, T), inputs, config) → loss and summed metrics."""


OBJECTIVES: dict[Objective, ObjectiveFns] = {
    Objective.DECOUPLED_PPO: ObjectiveFns(keep_mask=off_policy_mask, loss=decoupled_ppo_loss),
    Objective.SFT: ObjectiveFns(keep_mask=sft_keep_mask, loss=sft_loss),
}


def token_mean_normalizer(mask_tokens: int, rollouts: int, config: TrainConfig) -> float:
    """N = number of loss-mask tokens of the step, before rejection and M2PO (ARCHITECTURE §6)."""
    return float(mask_tokens)


def constant_normalizer(mask_tokens: int, rollouts: int, config: TrainConfig) -> float:
    """N = rollouts of the step × L, L = `normalizer_tokens_per_rollout` (Dr. GRPO's constant,
    Liu et al. 2025): a long completion is not down-weighted per token."""
    return float(rollouts * config.normalizer_tokens_per_rollout)


StepNormalizer = Callable[[int, int, TrainConfig], float]
"""(loss-mask tokens of the step, rollouts of the step, config) → N."""

NORMALIZERS: dict[LossAggregation, StepNormalizer] = {
    LossAggregation.TOKEN_MEAN: token_mean_normalizer,
    LossAggregation.CONSTANT: constant_normalizer,
}


def step_normalizer(mask_tokens: int, rollouts: int, config: TrainConfig) -> float:
    """N of an optimiser step under `config.loss_aggregation`."""
    return NORMALIZERS[config.loss_aggregation](mask_tokens, rollouts, config)
