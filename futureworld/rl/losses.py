"""Policy losses on per-token log-probs: decoupled PPO (the RL update) and SFT.

Pure tensor functions, registered in `OBJECTIVES` by `Objective`; the decoupled objective's
surrogates (PPO-clip here, CISPO, GSPO and KL-Cov in `policy_losses`) in `POLICY_LOSSES` by
`PolicyLoss`; the step normalisers in `NORMALIZERS` by `LossAggregation`. They know nothing of
models or batching: `token_logprobs` (forward.py) produces their inputs. The normaliser is
decided before any token is rejected, so dropping a token removes its term and leaves every
other token's weight alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from futureworld.rl.config import LossAggregation, Objective, PolicyLoss, TrainConfig
from futureworld.rl.loss_terms import (
    LossInputs,
    LossOutput,
    add_regularizers,
    behaviour_weight,
    entropy_bonus,
    kept_tokens,
    normalizer,
    off_policy_mask,
    off_policy_sums,
    policy_output,
)
from futureworld.rl.policy_losses import cispo_loss, gspo_loss, kl_cov_loss


def decoupled_ppo_loss(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> LossOutput:
    """Decoupled PPO with truncated behaviour weights (Hilton et al. 2022, arXiv:2110.00641).

    Shapes: every tensor (B, T). With r_t = π_θ/π_prox and w_t = stopgrad(min(π_prox/μ, C)):
        ℓ_t = −w_t · min(r_t A_t, clip(r_t, 1 − ε_low, 1 + ε_high) A_t)
              [+ kl_coef · k3_t,  k3_t = e^{log π_ref − log π_θ} − (log π_ref − log π_θ) − 1]
              [− entropy_coef · H_t,  H_t = −Σ_v π_θ(v) log π_θ(v), the entropy bonus]
        loss = Σ_{t ∈ kept} ℓ_t / N,  N from `step_normalizer` (by default the loss-mask
        token count of the optimiser step, counted before rejection and M2PO).
    ε_low = `clip_low` (0.2), ε_high = `clip_high` (0.28): the asymmetric clip-higher of DAPO
    (Yu et al. 2025, arXiv:2503.14476), which leaves a rising unlikely token more room.
    π_prox is the trust-region anchor, μ only enters through w_t, so data many versions
    old is corrected rather than dropped.
    """
    keep = kept_tokens(inputs, config)
    weight = behaviour_weight(inputs, config)
    ratio = torch.exp(logp - inputs.logp_prox.detach())
    adv = inputs.advantages
    unclipped = ratio * adv
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high) * adv
    per_token = -weight * torch.minimum(unclipped, clipped)
    per_token, k3 = add_regularizers(per_token, logp, inputs, config)
    r = ratio.detach()
    return policy_output(
        per_token,
        keep,
        inputs,
        k3=k3,
        clipped_low=(r < 1 - config.clip_low) & (adv < 0),
        clipped_high=(r > 1 + config.clip_high) & (adv > 0),
    )


def sft_loss(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> LossOutput:
    """Supervised fine-tuning: loss = −Σ_t (A_t log π_θ(t) [+ entropy_coef · H_t]) / N over
    kept tokens, (B, T) inputs.

    With the `sft` estimator A_t = 1 on generated tokens, so this is −mean log π over them
    (less the entropy bonus when `entropy_coef` > 0).
    """
    keep = (inputs.keep if inputs.keep is not None else inputs.mask).bool()
    per_token = logp * inputs.advantages
    entropy = entropy_bonus(logp, inputs, config)
    if entropy is not None:
        per_token = per_token + config.entropy_coef * entropy
    loss = -torch.where(keep, per_token, 0.0).sum() / max(normalizer(inputs), 1.0)
    with torch.no_grad():
        sums = off_policy_sums(inputs, keep)
        sums.update(clip_low=0.0, clip_high=0.0, kl_ref=0.0)
    return LossOutput(loss, sums)


def sft_keep_mask(
    logp_prox: Tensor, logp_behaviour: Tensor, mask: Tensor, config: TrainConfig
) -> Tensor:
    """SFT trains on every generated token: μ may be a teacher's, never a reason to drop."""
    return mask.bool()


def summarize_metrics(sums: Mapping[str, float]) -> dict[str, float]:
    """Means from summed statistics: per kept token for the loss terms (clip fractions, k3 to
    the reference), per generated token else (KL and χ² to μ, the sampler gap mean
    |log μ − log π_prox|, the entropy of π_θ, the rejected fraction)."""
    mask_n = max(sums.get("mask_tokens", 0.0), 1.0)
    kept_n = max(sums.get("kept_tokens", 0.0), 1.0)
    return {
        "clip_low_fraction": sums.get("clip_low", 0.0) / kept_n,
        "clip_high_fraction": sums.get("clip_high", 0.0) / kept_n,
        "clip_fraction": (sums.get("clip_low", 0.0) + sums.get("clip_high", 0.0)) / kept_n,
        "kl_behaviour": sums.get("kl_behaviour", 0.0) / mask_n,
        "chi2": sums.get("chi2", 0.0) / mask_n,
        "sampler_gap": sums.get("sampler_gap", 0.0) / mask_n,
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


def decoupled_policy_loss(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> LossOutput:
    """The decoupled objective with the surrogate `config.policy_loss` (`POLICY_LOSSES`)."""
    return POLICY_LOSSES[config.policy_loss](logp, inputs, config)


PolicyLossFn = Callable[[Tensor, LossInputs, TrainConfig], LossOutput]
"""(logp_θ (B, T), inputs, config) → loss and summed metrics, on `off_policy_mask`'s tokens."""

POLICY_LOSSES: dict[PolicyLoss, PolicyLossFn] = {
    PolicyLoss.PPO_CLIP: decoupled_ppo_loss,
    PolicyLoss.CISPO: cispo_loss,
    PolicyLoss.GSPO: gspo_loss,
    PolicyLoss.KL_COV: kl_cov_loss,
}

OBJECTIVES: dict[Objective, ObjectiveFns] = {
    Objective.DECOUPLED_PPO: ObjectiveFns(keep_mask=off_policy_mask, loss=decoupled_policy_loss),
    Objective.SFT: ObjectiveFns(keep_mask=sft_keep_mask, loss=sft_loss),
}


def token_mean_normalizer(mask_tokens: int, rollouts: int, config: TrainConfig) -> float:
    """N = number of loss-mask tokens of the step, before rejection and M2PO (ARCHITECTURE §6)."""
    return float(mask_tokens)


def constant_normalizer(mask_tokens: int, rollouts: int, config: TrainConfig) -> float:
    """N = rollouts of the step × L, L = `normalizer_tokens_per_rollout` (Dr. GRPO's constant,
    Liu et al. 2025): a long completion is not down-weighted per token."""
    return float(rollouts * config.normalizer_tokens_per_rollout)


def sequence_mean_normalizer(mask_tokens: int, rollouts: int, config: TrainConfig) -> float:
    """N = rollouts of the step: each rollout's summed terms weigh the same (GSPO's mean over
    sequences, Zheng et al. 2025, when its terms carry 1/|y_i|)."""
    return float(rollouts)


StepNormalizer = Callable[[int, int, TrainConfig], float]
"""(loss-mask tokens of the step, rollouts of the step, config) → N."""

NORMALIZERS: dict[LossAggregation, StepNormalizer] = {
    LossAggregation.TOKEN_MEAN: token_mean_normalizer,
    LossAggregation.CONSTANT: constant_normalizer,
    LossAggregation.SEQUENCE_MEAN: sequence_mean_normalizer,
}


def step_normalizer(mask_tokens: int, rollouts: int, config: TrainConfig) -> float:
    """N of an optimiser step under `config.loss_aggregation`."""
    return NORMALIZERS[config.loss_aggregation](mask_tokens, rollouts, config)
