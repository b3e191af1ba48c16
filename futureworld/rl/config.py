"""Training configuration for the replay-and-train update: one frozen, validated dataclass.

Owns the knobs of the estimator, the decoupled-PPO loss, the optimiser, batching, LoRA
and precision. It does not know where the rollouts come from or where versions are recorded.
An optimiser step is defined by whole groups (`groups_per_step`), never by packed rows: the
rows are only how a step's tokens are fed to the model, so the token budget changes memory
and speed, not the update.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from futureworld.rewards import DEFAULT_REWARD, RewardFn

if TYPE_CHECKING:  # torch loads only when an update runs, not when a command line parses
    import torch


class Estimator(StrEnum):
    """How rewards become per-token advantages (see `futureworld.rl.advantages`)."""

    DR_GRPO = "dr_grpo"
    """A_i = R_i − mean_group(R); Liu et al. 2025, "Understanding R1-Zero-Like Training"."""
    GRPO = "grpo"
    """(R_i − mean) / (std + ε); Shao et al. 2024, DeepSeekMath."""
    RLOO = "rloo"
    """R_i − mean of the other G−1; Kool et al. 2019, Ahmadian et al. 2024."""
    FORECAST_INFO_GAIN = "forecast_info_gain"
    """dr_grpo + potential-based turn credit λ·(R − Φ(belief before the turn)), centred within
    the group at each turn; Ng et al. 1999."""
    PROVISIONAL_CONSENSUS = "provisional_consensus"
    """dr_grpo on a consensus pseudo-label until the outcome arrives (TTRL-like, rollout level)."""
    SIOP = "siop"
    """Turn-level credit from the change of an outcome potential across each turn, the target
    the consensus until the outcome arrives; after Hu et al. 2026 (advantages.siop says where
    it departs)."""
    SFT = "sft"
    """Supervised fine-tuning: weight 1 on every generated token, loss −mean log π."""

    @property
    def learns_before_outcomes(self) -> bool:
        """Whether it trains on unresolved groups too, on provisional consensus rewards
        (flows.stages.provisional)."""
        return self in (Estimator.PROVISIONAL_CONSENSUS, Estimator.SIOP)

    @property
    def credits_turns(self) -> bool:
        """Whether it credits each turn by the belief elicited after it, so rollouts must be
        generated with GenerationSettings.elicit_beliefs (a turn without one counts as 0.5)."""
        return self in (Estimator.FORECAST_INFO_GAIN, Estimator.SIOP)


DEFAULT_ESTIMATOR = Estimator.DR_GRPO
"""The estimator an update uses unless told otherwise (ARCHITECTURE §6)."""


class Objective(StrEnum):
    """Which loss the update minimises (see `futureworld.rl.losses.OBJECTIVES`)."""

    DECOUPLED_PPO = "decoupled_ppo"
    """Importance-weighted policy gradient on advantages; `policy_loss` picks the surrogate."""
    SFT = "sft"
    """Negative log-likelihood of the generated tokens."""


class PolicyLoss(StrEnum):
    """The surrogate of the decoupled objective (see `futureworld.rl.losses.POLICY_LOSSES`).

    Each one shares the keep mask (rejection, M2PO), the truncated behaviour weight
    w = min(π_prox/μ, C), the k3 penalty to the reference and the step normaliser; only the
    term in r_t = π_θ/π_prox differs.
    """

    PPO_CLIP = "ppo_clip"
    """−w · min(r A, clip(r, 1 − clip_low, 1 + clip_high) A): PPO (Schulman et al. 2017) with
    DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476)."""
    CISPO = "cispo"
    """−w · sg(clip(r, 1 − cispo_clip_low, 1 + cispo_clip_high)) · A · log π_θ: the IS weight is
    clipped, no token loses its gradient (MiniMax-M1; MiniMax 2025, arXiv:2506.13585)."""
    GSPO = "gspo"
    """Sequence ratio s_i = exp(mean_t log r_t), clipped per rollout, one loss per rollout
    (Zheng et al. 2025, arXiv:2507.18071); needs `sequence_mean` aggregation."""
    KL_COV = "kl_cov"
    """−w · r A, plus kl_cov_coef · |log r| on the top kl_cov_fraction of tokens by
    Cov(log π_θ, A) (Cui et al. 2025, "The Entropy Mechanism of RL", arXiv:2505.22617)."""


class LossAggregation(StrEnum):
    """How an optimiser step's per-token losses become one scalar (see `losses.NORMALIZERS`)."""

    TOKEN_MEAN = "token_mean"
    """Σ ℓ_t over the step's loss-mask tokens / their number, counted before rejection and
    M2PO, so a rejected token never rescales the others (ARCHITECTURE §6; DAPO's token-level
    mean, Yu et al. 2025)."""
    CONSTANT = "constant"
    """Σ ℓ_t / (rollouts in the step × `normalizer_tokens_per_rollout`): a constant per
    rollout, so no length bias (Dr. GRPO; Liu et al. 2025, arXiv:2503.20783)."""
    SEQUENCE_MEAN = "sequence_mean"
    """Σ ℓ_t / rollouts in the step: the mean over rollouts of each rollout's summed terms.
    GSPO's terms carry 1/|y_i|, so this is its per-sequence mean (Zheng et al. 2025); for a
    per-token loss it is the per-rollout token sum (`constant` with L = 1)."""


class Precision(StrEnum):
    AUTO = "auto"
    """bf16 autocast on CUDA, fp32 on CPU."""
    FP32 = "fp32"
    """Everything in float32 (deterministic on CPU)."""
    BF16 = "bf16"
    """fp32 master weights with bf16 autocast for the forward pass."""


class Parallel(StrEnum):
    """How N ranks share an update (see `futureworld.rl.parallel.STRATEGIES`); both take the
    same step, and one process ignores the choice."""

    DDP = "ddp"
    """DistributedDataParallel: every rank holds the whole model and AdamW state; the
    gradients are all-reduced after each step's last backward."""
    FSDP2 = "fsdp2"
    """torch's `fully_shard` on every transformer block, then on the root (Zhao et al. 2023,
    "PyTorch FSDP"): each rank holds 1/N of every parameter, gradient and AdamW moment, and a
    block's parameters are all-gathered for its forward and backward only."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    estimator: Estimator = DEFAULT_ESTIMATOR
    """Advantage estimator; `sft` switches the objective to supervised fine-tuning."""
    reward_fn: RewardFn = DEFAULT_REWARD
    """Which stored reward replay trains on (brier, log_score, rlcr, crps)."""
    learning_rate: float = 1e-6
    """AdamW learning rate (the peak under `lr_decay`)."""
    lr_decay: bool = False
    """Decay the learning rate linearly from `learning_rate` to zero over the optimiser steps
    this call plans (its steps × ppo_epochs; an early stop ends sooner), as supervised
    fine-tuning usually does. Off: constant, the right thing for an RL update of a handful of
    steps. Each call (and each resumed call) decays over its own steps."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    adam_betas: tuple[float, float] = (0.9, 0.999)
    """AdamW (β1, β2)."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip applied before each optimiser step."""
    groups_per_step: int = 8
    """K: whole groups per optimiser step, in replay order. The step's rollouts are packed
    into micro-batches whose gradients accumulate; a group is never split across steps.
    SFT has no groups: each trajectory counts as one."""
    pack_single_rollouts: bool = False
    """Pack groups of one rollout (supervised demonstrations) several to a row, first-fit
    decreasing within their step, instead of a row each. On a small model a row's forward and
    backward cost about the same whatever its length, so a warm start of many short
    demonstrations runs several times faster; the sum over the step is the same up to float
    rounding. Groups of more than one always keep a row of their own (their prompt is forwarded
    once there)."""
    micro_batch_tokens: int = 4096
    """Packing budget: tokens per packed row (a longer rollout gets a row of its own). It
    bounds memory only: the rows of one step add up to the same gradient however packed."""
    loss_aggregation: LossAggregation = LossAggregation.TOKEN_MEAN
    """The step's normaliser: token mean over loss-mask tokens, or Dr. GRPO's constant."""
    normalizer_tokens_per_rollout: int = 1024
    """Dr. GRPO's constant L (used by `constant` aggregation only): set it to the generation
    budget, the most completion tokens a rollout can have."""
    ppo_epochs: int = 1
    """Passes over the update's data; π_prox stays frozen across them."""
    policy_loss: PolicyLoss = PolicyLoss.PPO_CLIP
    """Surrogate of the RL update: ppo_clip, cispo, gspo or kl_cov (SFT ignores it)."""
    clip_low: float = 0.2
    """ε_low of `ppo_clip`: r_t is clipped at 1 − clip_low."""
    clip_high: float = 0.28
    """ε_high of `ppo_clip` ("clip-higher", DAPO; Yu et al. 2025): r_t clipped at 1 + clip_high."""
    cispo_clip_low: float = 1.0
    """ε_low^IS of `cispo`: the IS weight is clipped below at 1 − this; 1 leaves it unbounded
    below, as MiniMax-M1 does (it tunes only the upper bound)."""
    cispo_clip_high: float = 0.28
    """ε_high^IS of `cispo`: the IS weight is clipped above at 1 + this."""
    gspo_clip_low: float = 3e-4
    """ε_low of `gspo`: s_i clipped at 1 − this (3e-4, GSPO's §5.1)."""
    gspo_clip_high: float = 4e-4
    """ε_high of `gspo`: s_i clipped at 1 + this (4e-4, GSPO's §5.1)."""
    kl_cov_fraction: float = 2e-3
    """k of `kl_cov`: the fraction of a micro-batch's kept tokens, largest Cov(log π_θ, A)
    first, that get the penalty (at least one; 0.2%, the paper's Qwen2.5-7B setting)."""
    kl_cov_coef: float = 1.0
    """β of `kl_cov`: weight of |log π_θ − log π_prox| on the selected tokens (the paper's 1)."""
    is_cap: float = 2.0
    """C: behaviour importance weight w_t = min(π_prox/μ, C) (truncated IS)."""
    reject_bound: float = 10.0
    """Tokens with π_prox/μ above this are masked out of the loss entirely."""
    m2po_tau: float | None = None
    """M2PO second-moment bound (0.04 when enabled; Zheng et al. 2025); None disables it."""
    max_kl_prox: float | None = None
    """Early stop (PPO's target KL, as in Schulman et al.'s baselines): the update ends before
    the first step whose k3 estimate of KL(π_prox ‖ π_θ) per loss-mask token exceeds this, so
    one update cannot run away from the policy that sampled its data. None never stops."""
    kl_coef: float = 0.0
    """Weight of the k3 KL estimate to the reference policy (the un-updated base); 0 = off."""
    entropy_coef: float = 0.0
    """Entropy bonus: every objective's loss subtracts entropy_coef · H_t, the entropy of π_θ
    at each kept generated token, averaged as the loss's other terms are (per token under
    token_mean); it pushes back against the entropy collapse of RL fine-tuning. 0 = off: the
    entropy is then a metric only, computed without its gradient (and without its memory)."""
    info_gain_lambda: float = 0.5
    """λ of `forecast_info_gain`: weight of the per-turn potential-based credit."""
    siop_lambda: float = 0.5
    """λ of `siop`: its last turn gets (1 − λ) × the rollout's reward besides the potential's
    change (SIOP's default 0.5)."""
    temperature: float | None = None
    """Temperature log-probs are recomputed at (logits / T). None: the one the rollouts were
    sampled at, read from their stored sampling parameters (1.0 when none is stored); a
    number must agree with every stored one (see `futureworld.rl.sampling`)."""
    lora: bool = False
    """Train a LoRA adapter (peft) instead of all weights."""
    lora_rank: int = 16
    """LoRA rank r."""
    lora_alpha: float = 32.0
    """LoRA scaling α (update scaled by α / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA input; 0 keeps π_θ = π_prox at the first step."""
    lora_target_modules: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    """Module names that receive LoRA adapters."""
    seed: int = 0
    """Seeds torch for the update; with fp32 on CPU the update is bit-for-bit reproducible."""
    logprob_chunk_tokens: int = 1024
    """Positions per chunk when projecting to the vocabulary, bounding logits memory."""
    precision: Precision = Precision.AUTO
    """Numeric precision policy."""
    parallel: Parallel = Parallel.DDP
    """How the ranks of a distributed update (nproc > 1) share the model: ddp or fsdp2."""
    device: str | None = None
    """torch device; None picks cuda when available, else cpu."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "estimator", Estimator(self.estimator))
        object.__setattr__(self, "reward_fn", RewardFn(self.reward_fn))
        object.__setattr__(self, "precision", Precision(self.precision))
        object.__setattr__(self, "parallel", Parallel(self.parallel))
        object.__setattr__(self, "loss_aggregation", LossAggregation(self.loss_aggregation))
        object.__setattr__(self, "policy_loss", PolicyLoss(self.policy_loss))
        object.__setattr__(self, "lora_target_modules", tuple(self.lora_target_modules))
        positive = {
            "learning_rate": self.learning_rate,
            "max_grad_norm": self.max_grad_norm,
            "is_cap": self.is_cap,
            "lora_alpha": self.lora_alpha,
        }
        if self.temperature is not None:
            positive["temperature"] = self.temperature
        for name, value in positive.items():
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(
                    f"TrainConfig.{name} must be a positive finite number, got {value}"
                )
        for name in (
            "groups_per_step",
            "micro_batch_tokens",
            "normalizer_tokens_per_rollout",
            "ppo_epochs",
            "lora_rank",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainConfig.{name} must be an integer >= 1, got {value!r}")
        if self.logprob_chunk_tokens < 1:
            raise ValueError(
                f"TrainConfig.logprob_chunk_tokens must be >= 1, got {self.logprob_chunk_tokens}"
            )
        for low, high, low_max in (
            ("clip_low", "clip_high", "< 1"),
            ("gspo_clip_low", "gspo_clip_high", "< 1"),
            ("cispo_clip_low", "cispo_clip_high", "<= 1"),  # 1: no lower bound on the weight
        ):
            lo, hi = getattr(self, low), getattr(self, high)
            low_ok = 0 <= lo < 1 if low_max == "< 1" else 0 <= lo <= 1
            if not low_ok or not hi >= 0:  # `not >=` also refuses NaN
                raise ValueError(
                    f"TrainConfig clip range needs 0 <= {low} {low_max} and {high} >= 0, "
                    f"got {low}={lo}, {high}={hi}"
                )
        if not 0 < self.kl_cov_fraction <= 1:
            raise ValueError(
                f"TrainConfig.kl_cov_fraction must be in (0, 1], got {self.kl_cov_fraction}"
            )
        for name in ("kl_cov_coef", "entropy_coef"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"TrainConfig.{name} must be a finite number >= 0, got {value}")
        if (
            self.policy_loss is PolicyLoss.GSPO
            and self.loss_aggregation is not LossAggregation.SEQUENCE_MEAN
        ):
            raise ValueError(
                "TrainConfig.policy_loss 'gspo' averages one loss per rollout: set "
                f"loss_aggregation='sequence_mean', got {self.loss_aggregation}"
            )
        if self.reject_bound < self.is_cap:
            raise ValueError(
                f"TrainConfig.reject_bound ({self.reject_bound}) must be >= is_cap ({self.is_cap})"
            )
        if self.m2po_tau is not None and not self.m2po_tau > 0:
            raise ValueError(f"TrainConfig.m2po_tau must be > 0 or None, got {self.m2po_tau}")
        if self.max_kl_prox is not None and not self.max_kl_prox > 0:
            raise ValueError(f"TrainConfig.max_kl_prox must be > 0 or None, got {self.max_kl_prox}")
        for name in ("weight_decay", "kl_coef", "info_gain_lambda"):
            if getattr(self, name) < 0:
                raise ValueError(f"TrainConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.siop_lambda <= 1.0:
            raise ValueError(f"TrainConfig.siop_lambda must be in [0, 1], got {self.siop_lambda}")
        if not 0 <= self.lora_dropout < 1:
            raise ValueError(f"TrainConfig.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if not all(0 <= b < 1 for b in self.adam_betas) or len(self.adam_betas) != 2:
            raise ValueError(
                f"TrainConfig.adam_betas must be two numbers in [0, 1), got {self.adam_betas}"
            )

    def to_json(self) -> dict[str, Any]:
        """The config as JSON-ready values (enums as strings, tuples as lists): what a
        checkpoint's trainer state and a training run record."""
        return {
            k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, StrEnum) else v)
            for k, v in dataclasses.asdict(self).items()
        }

    @property
    def objective(self) -> Objective:
        """SFT trains on likelihood; every RL estimator feeds the decoupled-PPO loss."""
        return Objective.SFT if self.estimator is Estimator.SFT else Objective.DECOUPLED_PPO

    def resolved_device(self) -> torch.device:
        import torch

        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def autocast_dtype(self, device: torch.device) -> torch.dtype | None:
        """The autocast dtype for the forward pass, or None for plain fp32."""
        import torch

        if self.precision is Precision.BF16 or (
            self.precision is Precision.AUTO and device.type == "cuda"
        ):
            return torch.bfloat16
        return None
