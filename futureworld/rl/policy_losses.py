"""The decoupled objective's surrogates beyond PPO-clip: CISPO, GSPO and KL-Cov.

Pure tensor functions with `decoupled_ppo_loss`'s signature, registered beside it in
`losses.POLICY_LOSSES`. Each keeps the shared terms (`loss_terms`): the keep mask, the truncated
behaviour weight for μ ≠ π_prox, the k3 penalty to the reference, the entropy bonus and the
step normaliser N.
"""

from __future__ import annotations

import torch
from torch import Tensor

from futureworld.rl.config import TrainConfig
from futureworld.rl.loss_terms import (
    LossInputs,
    LossOutput,
    add_regularizers,
    behaviour_weight,
    kept_tokens,
    policy_output,
    rollout_segments,
)


def cispo_loss(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> LossOutput:
    """CISPO, decoupled (MiniMax 2025, "MiniMax-M1", arXiv:2506.13585, eqs. 4–5).

    Shapes: every tensor (B, T). With r_t = π_θ/π_prox and w_t = stopgrad(min(π_prox/μ, C)):
        r̂_t = clip(r_t, 1 − ε_low^IS, 1 + ε_high^IS)
        ℓ_t = −w_t · sg(r̂_t) · A_t · log π_θ(t)   [+ kl_coef · k3_t] [− entropy_coef · H_t]
        loss = Σ_{t ∈ kept} ℓ_t / N
    so ∇ℓ_t = −w_t r̂_t A_t ∇log π_θ(t): the IS weight is clipped, not the update, and a token
    whose ratio left the trust region keeps its gradient (PPO-clip zeroes it). The paper's
    1/Σ_i|o_i| is the token-mean N and its π_old is π_prox; μ enters only through w_t.
    ε_low^IS = `cispo_clip_low` (1: no lower bound, as the paper), ε_high^IS = `cispo_clip_high`.
    """
    keep = kept_tokens(inputs, config)
    weight = behaviour_weight(inputs, config)
    ratio = torch.exp(logp.detach() - inputs.logp_prox.detach())
    low, high = 1 - config.cispo_clip_low, 1 + config.cispo_clip_high
    is_weight = ratio.clamp(low, high)  # detached: sg(r̂)
    per_token = -weight * is_weight * inputs.advantages * logp
    per_token, k3 = add_regularizers(per_token, logp, inputs, config)
    return policy_output(
        per_token, keep, inputs, k3=k3, clipped_low=ratio < low, clipped_high=ratio > high
    )


def _segment_sum(values: Tensor, segments: Tensor, size: int) -> Tensor:
    """float64 (B, T): at each token, the sum of `values` over its segment (ids < size)."""
    flat = segments.flatten()
    total = torch.zeros(size, dtype=torch.float64, device=values.device)
    total.index_add_(0, flat, values.double().flatten())
    return total[flat].view_as(values)


def gspo_loss(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> LossOutput:
    """GSPO, decoupled (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071).

    Shapes: every tensor (B, T). Rollout i is a segment of a row (`rollout_segments` of
    `inputs.position_ids`), K_i its kept tokens and |y_i| its loss-mask tokens. With
    log r_t = log π_θ(t) − log π_prox(t):
        s_i  = exp((1/|K_i|) Σ_{t ∈ K_i} log r_t)                    sequence ratio
        s_it = sg(s_i) · π_θ(t) / sg(π_θ(t))                          value s_i, ∇ = s_i ∇log π_θ(t)
        w_i  = sg(min(exp((1/|K_i|) Σ_{t ∈ K_i} log(π_prox/μ)), C))   sequence behaviour weight
        ℓ_t  = −(w_i / |y_i|) · min(s_it A_t, clip(s_it, 1 − ε_low, 1 + ε_high) A_t)
               [+ kl_coef · k3_t / |y_i|] [− entropy_coef · H_t / |y_i|]
        loss = Σ_{t ∈ kept} ℓ_t / N,  N = rollouts of the step (`sequence_mean`)
    With A constant over a rollout and nothing rejected this is the paper's objective,
    (1/R) Σ_i −w_i · min(s_i A_i, clip(s_i, 1 − ε_low, 1 + ε_high) A_i): one ratio and one clip
    per rollout. It is the paper's GSPO-token form, equal to GSPO in value and gradient then,
    which also carries per-turn advantages. ε_low, ε_high = `gspo_clip_low`, `gspo_clip_high`.
    """
    if inputs.position_ids is None:
        raise ValueError("gspo needs LossInputs.position_ids to find the rollouts of a packed row")
    keep = kept_tokens(inputs, config)
    rows, length = logp.shape
    row_offset = torch.arange(rows, device=logp.device)[:, None] * length
    segments = rollout_segments(inputs.position_ids.to(logp.device)) + row_offset
    size = rows * length
    prox = inputs.logp_prox.detach()
    kept = _segment_sum(keep, segments, size).clamp(min=1)  # |K_i|
    lengths = _segment_sum(inputs.mask.bool(), segments, size).clamp(min=1)  # |y_i|
    log_ratio = _segment_sum(torch.where(keep, logp.detach() - prox, 0.0), segments, size)
    log_weight = _segment_sum(torch.where(keep, prox - inputs.logp_behaviour, 0.0), segments, size)
    seq_log_ratio = (log_ratio / kept).to(logp.dtype)  # log s_i
    seq_weight = (log_weight / kept).exp().clamp(max=config.is_cap).to(logp.dtype)  # w_i
    scale = (1 / lengths).to(logp.dtype)
    ratio = torch.exp(seq_log_ratio + logp - logp.detach())  # s_it
    adv = inputs.advantages
    low, high = 1 - config.gspo_clip_low, 1 + config.gspo_clip_high
    per_token = -seq_weight * scale * torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    per_token, k3 = add_regularizers(per_token, logp, inputs, config, scale=scale)
    s = ratio.detach()
    return policy_output(
        per_token,
        keep,
        inputs,
        k3=k3,
        clipped_low=(s < low) & (adv < 0),
        clipped_high=(s > high) & (adv > 0),
    )


def kl_cov_loss(logp: Tensor, inputs: LossInputs, config: TrainConfig) -> LossOutput:
    """KL-Cov, decoupled (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for
    Reasoning Language Models", arXiv:2505.22617, §4.2, as the authors' code computes it).

    Shapes: every tensor (B, T); K the micro-batch's kept tokens. With r_t = π_θ/π_prox and
    w_t = stopgrad(min(π_prox/μ, C)):
        Cov_t = (log π_θ(t) − mean_K log π_θ) · (A_t − mean_K A)     centred product, detached
        I     = the max(1, ⌊k · |K|⌋) tokens of K with the largest Cov_t
        ℓ_t   = w_t · (−r_t A_t + 1[t ∈ I] · β · |log π_θ(t) − log π_prox(t)|)
                [+ kl_coef · k3_t] [− entropy_coef · H_t]
        loss  = Σ_{t ∈ K} ℓ_t / N
    No ratio clip: the trust region is a penalty on the few tokens whose log-probability and
    advantage move together most, the covariance that drives entropy down. The paper's
    KL(π_old ‖ π_θ) on the sampled token is |log π_θ − log π_old| in its code, π_old being
    π_prox here. k = `kl_cov_fraction` (0.2%), β = `kl_cov_coef` (1). I is chosen within each
    micro-batch (one packed row), as the authors' per-micro-batch loss does; ties go to the
    earlier token.
    """
    keep = kept_tokens(inputs, config)
    weight = behaviour_weight(inputs, config)
    log_ratio = logp - inputs.logp_prox.detach()
    adv = inputs.advantages
    selected = torch.zeros(keep.numel(), dtype=torch.bool, device=keep.device)
    kept_index = keep.flatten().nonzero().squeeze(-1)
    if len(kept_index):
        lp = logp.detach().flatten()[kept_index].double()
        a = adv.detach().flatten()[kept_index].double()
        cov = (lp - lp.mean()) * (a - a.mean())
        top = max(1, int(config.kl_cov_fraction * len(cov)))
        order = torch.argsort(cov, descending=True, stable=True)
        selected[kept_index[order[:top]]] = True
    selected = selected.view_as(keep)
    penalty = torch.where(selected, config.kl_cov_coef * log_ratio.abs(), 0.0)
    per_token = weight * (-torch.exp(log_ratio) * adv + penalty)
    per_token, k3 = add_regularizers(per_token, logp, inputs, config)
    unclipped = torch.zeros_like(keep)
    return policy_output(
        per_token, keep, inputs, k3=k3, clipped_low=unclipped, clipped_high=unclipped
    )
