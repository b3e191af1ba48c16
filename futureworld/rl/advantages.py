"""Advantage estimators: rewards of a group of rollouts → per-completion-token advantages.

Each estimator is a pure function of one group (rollouts sharing `trajectory.group_key`)
and the config; `compute_advantages` groups, dispatches through `ADVANTAGE_ESTIMATORS` and
counts skipped groups. Tokens with loss mask 0 (observations) always get advantage 0.
SFT has no baseline to share, so there every trajectory is a group of its own (the unit an
optimiser step counts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from futureworld.domain import MIN_GROUP_SIZE, ScoredRollout
from futureworld.rewards import UNPARSEABLE_REWARD
from futureworld.rl.config import Estimator, Objective, TrainConfig

TokenAdvantages = list[np.ndarray]
"""One float32 array per rollout, shape (len(completion_token_ids),)."""

AdvantageFn = Callable[[Sequence[ScoredRollout], TrainConfig], TokenAdvantages | None]
"""(one group, config) → advantages per rollout, or None when the group cannot be used."""

GRPO_EPS = 1e-6
"""ε in grpo's (std + ε): keeps all-equal groups at advantage 0 instead of 0/0."""
PRIOR_BELIEF = 0.5
"""forecast_info_gain: the belief before the first turn (the uninformed forecast)."""


def _mask(rollout: ScoredRollout) -> np.ndarray:
    return np.asarray(rollout.trajectory.loss_mask, dtype=np.float32)


def _rewards(group: Sequence[ScoredRollout]) -> np.ndarray:
    return np.asarray([r.reward for r in group], dtype=np.float64)


def _broadcast(group: Sequence[ScoredRollout], per_rollout: np.ndarray) -> TokenAdvantages:
    """A_i on every generated token of rollout i, 0 on observation tokens."""
    return [
        (_mask(r) * np.float32(a)).astype(np.float32)
        for r, a in zip(group, per_rollout, strict=True)
    ]


def dr_grpo(group: Sequence[ScoredRollout], config: TrainConfig) -> TokenAdvantages | None:
    """A_i = R_i − (1/G) Σ_j R_j, on every mask-1 token of rollout i.

    No division by the group std: it up-weights near-unanimous groups and pushes binary
    forecasters toward over-confidence. Liu et al. 2025, "Understanding R1-Zero-Like
    Training: A Critical Perspective" (Dr. GRPO), arXiv:2503.20783.
    """
    if len(group) < MIN_GROUP_SIZE:
        return None
    rewards = _rewards(group)
    return _broadcast(group, rewards - rewards.mean())


def grpo(group: Sequence[ScoredRollout], config: TrainConfig) -> TokenAdvantages | None:
    """A_i = (R_i − mean_j R_j) / (std_j R_j + ε), std with ddof = 0, ε = 1e-6.

    Shao et al. 2024, "DeepSeekMath" (GRPO), arXiv:2402.03300.
    """
    if len(group) < MIN_GROUP_SIZE:
        return None
    rewards = _rewards(group)
    return _broadcast(group, (rewards - rewards.mean()) / (rewards.std() + GRPO_EPS))


def rloo(group: Sequence[ScoredRollout], config: TrainConfig) -> TokenAdvantages | None:
    """A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j  (leave-one-out baseline; = G/(G−1) · dr_grpo).

    Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for Free!"; Ahmadian et al.
    2024, "Back to Basics: Revisiting REINFORCE Style Optimization", arXiv:2402.14740.
    """
    if len(group) < MIN_GROUP_SIZE:
        return None
    rewards = _rewards(group)
    others = (rewards.sum() - rewards) / (len(group) - 1)
    return _broadcast(group, rewards - others)


def forecast_info_gain(
    group: Sequence[ScoredRollout], config: TrainConfig
) -> TokenAdvantages | None:
    """dr_grpo plus potential-based turn credit; needs the real outcome y.

    For a generated token of rollout i inside turn k:
        A_{i,t} = (R_i − mean_j R_j) + λ · (R_i − Φ(b_{k−1})),   Φ(b) = −(b − y)²,
    where b_{k−1} is the latest belief elicited at a turn before k (0.5 before the first).
    Φ depends only on the past of the turn, so the shaping leaves the optimal policy
    unchanged (Ng, Harada & Russell 1999, "Policy invariance under reward transformations")
    while crediting turns that moved the forecast toward the outcome. Generated tokens not
    inside any turn span get the dr_grpo part only. Groups without an outcome are skipped.
    """
    if len(group) < MIN_GROUP_SIZE or any(r.outcome_value is None for r in group):
        return None
    base = dr_grpo(group, config)
    assert base is not None
    lam = config.info_gain_lambda
    out: TokenAdvantages = []
    for rollout, adv in zip(group, base, strict=True):
        y = float(rollout.outcome_value)  # type: ignore[arg-type]
        mask = _mask(rollout)
        belief = PRIOR_BELIEF
        adv = adv.copy()
        for turn in sorted(rollout.trajectory.turns, key=lambda t: t.index):
            credit = lam * (rollout.reward + (belief - y) ** 2)
            span = slice(turn.token_start, turn.token_end)
            adv[span] += np.float32(credit) * mask[span]
            if turn.belief is not None:
                belief = turn.belief
        out.append(adv)
    return out


def siop_consensus(p_yes: np.ndarray) -> float:
    """Reliability-weighted consensus ŷ = Σ w_i p_i / Σ w_i of a group's forecasts.

    Reliability of member i is its agreement with the rest of the group:
        w_i = 1 − |p_i − mean_{j≠i} p_j|  ∈ [0, 1],
    so an outlier counts less than the forecasts that corroborate each other. Falls back
    to the plain mean when every weight is 0 (e.g. G = 2 forecasts at 0 and 1).
    """
    g = len(p_yes)
    others = (p_yes.sum() - p_yes) / (g - 1)
    weights = 1.0 - np.abs(p_yes - others)
    if weights.sum() <= 0:
        return float(p_yes.mean())
    return float((weights * p_yes).sum() / weights.sum())


def siop(group: Sequence[ScoredRollout], config: TrainConfig) -> TokenAdvantages | None:
    """Label-free provisional advantages for groups whose question has not resolved.

    Without an outcome (every `outcome_value` is None) the consensus ŷ (see
    `siop_consensus`) of the parsed forecasts stands in for y:
        R_i = −(p_i − ŷ)²  (or −1.25 when rollout i has no parsed p),  A_i = R_i − mean R.
    Groups with a real outcome use their stored rewards (dr_grpo). Consensus as a
    pseudo-label follows test-time RL (Zuo et al. 2025, "TTRL", arXiv:2504.16084).
    Replacing these provisional updates once the real reward arrives is the caller's job.
    """
    if any(r.outcome_value is not None for r in group):
        return dr_grpo(group, config)
    parsed = [r.trajectory.p_yes for r in group if r.trajectory.p_yes is not None]
    if len(parsed) < 2:
        return None
    y_hat = siop_consensus(np.asarray(parsed, dtype=np.float64))
    rewards = np.asarray(
        [
            UNPARSEABLE_REWARD
            if r.trajectory.p_yes is None
            else -((r.trajectory.p_yes - y_hat) ** 2)
            for r in group
        ]
    )
    return _broadcast(group, rewards - rewards.mean())


def sft(group: Sequence[ScoredRollout], config: TrainConfig) -> TokenAdvantages | None:
    """Weight 1 on every generated (mask-1) token; rewards are ignored, no group is skipped."""
    return [_mask(r) for r in group]


@dataclass(frozen=True)
class Advantages:
    rollouts: tuple[ScoredRollout, ...]
    """The rollouts that received advantages, groups in first-appearance order, each group's
    rollouts consecutive."""
    token_advantages: tuple[np.ndarray, ...]
    """Per rollout, float32 of shape (len(completion_token_ids),)."""
    group_sizes: tuple[int, ...]
    """Sizes of the consecutive groups of `rollouts`."""
    groups_skipped: int

    @property
    def groups_used(self) -> int:
        return len(self.group_sizes)


def group_rollouts(rollouts: Sequence[ScoredRollout]) -> list[list[ScoredRollout]]:
    """Groups by `trajectory.group_key`, keeping the caller's (oldest-first) order."""
    groups: dict[tuple[int, int, int], list[ScoredRollout]] = {}
    for rollout in rollouts:
        groups.setdefault(rollout.trajectory.group_key, []).append(rollout)
    return list(groups.values())


def compute_advantages(rollouts: Sequence[ScoredRollout], config: TrainConfig) -> Advantages:
    """Applies `config.estimator` to every group; groups it cannot use are counted as skipped."""
    for rollout in rollouts:
        if not np.isfinite(rollout.reward):
            raise ValueError(
                f"rollout {rollout.trajectory.idempotency_key} has a non-finite reward "
                f"{rollout.reward}"
            )
    estimator = ADVANTAGE_ESTIMATORS[config.estimator]
    groups = (
        group_rollouts(rollouts)
        if config.objective is Objective.DECOUPLED_PPO
        else [[rollout] for rollout in rollouts]
    )
    kept: list[ScoredRollout] = []
    advantages: list[np.ndarray] = []
    sizes: list[int] = []
    skipped = 0
    for group in groups:
        result = estimator(group, config)
        if result is None:
            skipped += 1
            continue
        kept.extend(group)
        advantages.extend(result)
        sizes.append(len(group))
    return Advantages(tuple(kept), tuple(advantages), tuple(sizes), skipped)


ADVANTAGE_ESTIMATORS: dict[Estimator, AdvantageFn] = {
    Estimator.DR_GRPO: dr_grpo,
    Estimator.GRPO: grpo,
    Estimator.RLOO: rloo,
    Estimator.FORECAST_INFO_GAIN: forecast_info_gain,
    Estimator.SIOP: siop,
    Estimator.SFT: sft,
}
