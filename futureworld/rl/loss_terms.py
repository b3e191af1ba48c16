"""What every policy loss takes and returns, and the terms the decoupled surrogates share.

Owns `LossInputs`, `LossOutput`, the keep mask (rejection, M2PO), the truncated behaviour
weight, the k3 penalty to the reference and the entropy bonus (`add_regularizers`), the
rollouts of a packed row and the off-policy statistics. The surrogates themselves live in
`losses` (PPO-clip, SFT) and `policy_losses`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from futureworld.rl.config import TrainConfig

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
    """Per-token entropy of π_θ: for the metrics, and with its gradient for the entropy bonus
    when `entropy_coef` > 0 (forward.entropy_gradient)."""
    normalizer: float | None = None
    """N of the whole optimiser step (`step_normalizer`); None → this micro-batch's
    loss-mask token count."""
    position_ids: Tensor | None = None
    """long, restarting at 0 at each rollout of a packed row (`PackedRow.position_ids`);
    the sequence-level losses find their rollouts by it (`rollout_segments`)."""


@dataclass(frozen=True)
class LossOutput:
    loss: Tensor
    """Scalar; this micro-batch's share of Σ_kept ℓ_t / N."""
    sums: dict[str, float]
    """Additive statistics; `summarize_metrics` turns summed dicts into means."""


def rollout_segments(position_ids: Tensor) -> Tensor:
    """long (B, T): the rollout each token belongs to, numbered 0, 1, … within its row.

    A packed row restarts its position ids at 0 at every rollout, so the index is the count
    of restarts at or before t, minus one: position ids [0 1 2 0 1 0] → [0 0 0 1 1 2]
    (a row that does not start at 0 counts its leading tokens to rollout 0).
    """
    return (torch.cumsum(position_ids == 0, dim=-1) - 1).clamp(min=0)


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


def kept_tokens(inputs: LossInputs, config: TrainConfig) -> Tensor:
    """bool (B, T): `inputs.keep`, else the decoupled keep mask of this micro-batch."""
    if inputs.keep is not None:
        return inputs.keep.bool()
    return off_policy_mask(inputs.logp_prox, inputs.logp_behaviour, inputs.mask, config).bool()


def behaviour_weight(inputs: LossInputs, config: TrainConfig) -> Tensor:
    """w_t = stopgrad(min(π_prox/μ, C)), (B, T): truncated IS (Hilton et al. 2022)."""
    prox = inputs.logp_prox.detach()
    return torch.exp(prox - inputs.logp_behaviour).clamp(max=config.is_cap).detach()


def reference_k3(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> Tensor | None:
    """k3_t = e^{log π_ref − log π_θ} − (log π_ref − log π_θ) − 1, (B, T); None when off."""
    if inputs.logp_ref is None or config.kl_coef <= 0:
        return None
    delta = inputs.logp_ref.detach() - logp
    return torch.exp(delta) - delta - 1


def entropy_bonus(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> Tensor | None:
    """H_t, (B, T), the entropy of π_θ at each token, which the losses weigh by −entropy_coef;
    None when the bonus is off (`entropy_coef` = 0: the loss is then left bit-identical).

    Refuses an entropy without a gradient while π_θ has one: the bonus would be a constant
    and silently do nothing (the forward computes it with a gradient only inside
    `forward.entropy_gradient(True)`).
    """
    if config.entropy_coef <= 0:
        return None
    if inputs.entropy is None:
        raise ValueError("TrainConfig.entropy_coef > 0 needs LossInputs.entropy")
    if logp.requires_grad and not inputs.entropy.requires_grad:
        raise ValueError(
            "TrainConfig.entropy_coef > 0 needs the entropy with its gradient: compute the "
            "forward inside futureworld.rl.forward.entropy_gradient(True)"
        )
    return inputs.entropy


def add_regularizers(
    per_token: Tensor,
    logp: Tensor,
    inputs: LossInputs,
    config: TrainConfig,
    *,
    scale: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """ℓ_t [+ kl_coef · s_t · k3_t] [− entropy_coef · s_t · H_t], (B, T), and k3 (None when
    off): the penalty to the reference and the entropy bonus every surrogate adds, each term
    left out when its coefficient is 0; s_t = `scale` (GSPO's 1/|y_i|), else 1."""
    k3 = reference_k3(logp, inputs, config)
    if k3 is not None:
        kl_coef = config.kl_coef if scale is None else config.kl_coef * scale
        per_token = per_token + kl_coef * k3
    entropy = entropy_bonus(logp, inputs, config)
    if entropy is not None:
        entropy_coef = config.entropy_coef if scale is None else config.entropy_coef * scale
        per_token = per_token - entropy_coef * entropy
    return per_token, k3


def normalizer(inputs: LossInputs) -> float:
    """N: the step's, else this micro-batch's loss-mask token count."""
    return inputs.normalizer if inputs.normalizer is not None else float(inputs.mask.sum())


def kept_mean(per_token: Tensor, keep: Tensor, inputs: LossInputs) -> Tensor:
    """Σ_{t ∈ kept} ℓ_t / N, a scalar."""
    # where(), not a multiply: an overflowing ratio on a dropped token must not become NaN
    return torch.where(keep, per_token, 0.0).sum() / max(normalizer(inputs), 1.0)


def off_policy_sums(inputs: LossInputs, keep: Tensor) -> dict[str, float]:
    """Sums over generated tokens of: KL(μ‖π_prox) by the k3 estimator, χ² = E_μ[(π_prox/μ)²]
    − 1, the sampler gap |log μ − log π_prox| (the stored behaviour log-probs against the
    trainer's own at the start of the update: sampler/trainer numerics plus staleness) and the
    entropy of π_θ; and the generated and kept token counts."""
    mask = inputs.mask.bool()
    raw = (inputs.logp_prox - inputs.logp_behaviour).detach()[mask].double()
    log_ratio = raw.clamp(max=_LOG_RATIO_METRIC_CAP)
    ratio = log_ratio.exp()
    return {
        "mask_tokens": float(mask.sum()),
        "kept_tokens": float(keep.sum()),
        "kl_behaviour": float((ratio - 1 - log_ratio).sum()),
        "chi2": float((ratio**2 - 1).sum()),
        "sampler_gap": float(raw.abs().sum()),
        "entropy": 0.0 if inputs.entropy is None else float(inputs.entropy.detach()[mask].sum()),
    }


def policy_output(
    per_token: Tensor,
    keep: Tensor,
    inputs: LossInputs,
    *,
    k3: Tensor | None,
    clipped_low: Tensor,
    clipped_high: Tensor,
) -> LossOutput:
    """Σ_{t ∈ kept} ℓ_t / N and the statistics every surrogate reports: the off-policy ones,
    the kept tokens clipped below and above (bool (B, T) masks) and Σ_kept k3."""
    loss = kept_mean(per_token, keep, inputs)
    with torch.no_grad():
        sums = off_policy_sums(inputs, keep)
        sums["clip_low"] = float((clipped_low & keep).sum())
        sums["clip_high"] = float((clipped_high & keep).sum())
        sums["kl_ref"] = 0.0 if k3 is None else float(k3.detach()[keep].sum())
    return LossOutput(loss, sums)
