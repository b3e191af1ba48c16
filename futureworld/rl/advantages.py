"""Advantage estimators: rewards of a group of rollouts → per-completion-token advantages.

Each estimator is a pure function of one group (rollouts sharing `trajectory.group_key`)
and the config; `compute_advantages` groups, dispatches through `ADVANTAGE_ESTIMATORS` and
counts skipped groups. Tokens with loss mask 0 (observations) always get advantage 0.
SFT has no baseline to share, so there every trajectory is a group of its own (the unit an
optimiser step counts).

With re-forecasts on, one question can have several groups (one per policy version that
forecast it) in the same update; `compute_advantages` then weighs each group by 1/(the
number of that question's groups), so replay weighs questions, not groups, equally.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from futureworld.domain import MIN_GROUP_SIZE, ScoredRollout
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


SIOP_PRIOR_BRIER = 0.25
"""siop reliability: the Brier a version is assumed to have before any of its forecasts
resolved (that of the uninformed 0.5 forecast)."""
SIOP_PRIOR_WEIGHT = 10.0
"""siop reliability: how many resolved forecasts the prior Brier counts as."""


def siop_reliability(brier_sum: float, n_resolved: int) -> float:
    """Reliability weight of a policy version's forecasts: the inverse of its shrunk Brier,
        w_v = 1 / B̃_v,   B̃_v = (Σ_resolved (p − y)² + n₀ · 0.25) / (n_v + n₀),   n₀ = 10,
    over the version's parsed forecasts whose outcome is known. Inverse mean squared error is
    the inverse-variance weight of combining unbiased forecasts (Bates & Granger 1969, "The
    Combination of Forecasts"); the shrinkage keeps a version with few resolved forecasts
    near the uninformed weight 4 instead of trusting a lucky handful."""
    shrunk = (brier_sum + SIOP_PRIOR_WEIGHT * SIOP_PRIOR_BRIER) / (n_resolved + SIOP_PRIOR_WEIGHT)
    return 1.0 / shrunk


def siop_consensus(
    pool_p_yes: np.ndarray, pool_weights: np.ndarray, own_p_yes: np.ndarray, own_weights: np.ndarray
) -> np.ndarray:
    """Leave-one-out, reliability-weighted consensus for each member of a group.

    The pool is every parsed forecast of the question by the agent at the group's version or
    earlier (the group included), with weights w_j (`siop_reliability` of its version); a
    member i of the pool gets
        ŷ_{−i} = (Σ_j w_j p_j − w_i p_i) / (Σ_j w_j − w_i),
    so its own forecast never votes on its pseudo-label. Shapes: pool (N,), own (G,) → (G,);
    NaN where no other forecast is left (a lone forecast has no consensus).
    """
    total = float((pool_weights * pool_p_yes).sum())
    weight = float(pool_weights.sum())
    others = weight - own_weights
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(others > 0, (total - own_weights * own_p_yes) / others, np.nan)


def siop(group: Sequence[ScoredRollout], config: TrainConfig) -> TokenAdvantages | None:
    """Self-improving with provisional rewards: A_i = R_i − mean_j R_j, where R_i is the real
    reward once the outcome is known and, before, the provisional one stored by the
    provisional-rewards stage (flows.stages.provisional): the expected reward under the
    leave-one-out consensus ŷ_{−i} (`siop_consensus`) standing in for P(y = 1),
        R̂_i = ŷ_{−i} R(p_i, 1) + (1 − ŷ_{−i}) R(p_i, 0)   (Brier: −(p_i − ŷ_{−i})² − ŷ(1 − ŷ)).
    Consensus as a pseudo-label follows test-time RL (Zuo et al. 2025, "TTRL",
    arXiv:2504.16084); leaving the rollout out keeps its own answer from rewarding itself.
    The estimator itself is dr_grpo: what makes it siop is which groups replay selects
    (unresolved ones with provisional rewards, voided and replayed for real on resolution).
    """
    return dr_grpo(group, config)


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
    used: list[list[ScoredRollout]] = []
    skipped = 0
    for group in groups:
        result = estimator(group, config)
        if result is None:
            skipped += 1
            continue
        used.append(group)
        kept.extend(group)
        advantages.extend(result)
        sizes.append(len(group))
    if config.objective is Objective.DECOUPLED_PPO:
        advantages = _per_question(used, advantages)
    return Advantages(tuple(kept), tuple(advantages), tuple(sizes), skipped)


def _per_question(
    groups: Sequence[Sequence[ScoredRollout]], advantages: list[np.ndarray]
) -> list[np.ndarray]:
    """Each question weighs the same in an update, however many groups it has: a group's
    advantages are scaled by 1/k, k = the groups of its (question, agent) in the update (k > 1
    only when re-forecasts are on). The PPO term is linear in A for a fixed sign, so this is
    a per-group loss weight; the step's token normaliser is unchanged."""
    per_question: dict[tuple[int, int], int] = {}
    for group in groups:
        question, agent, _version = group[0].trajectory.group_key
        per_question[(question, agent)] = per_question.get((question, agent), 0) + 1
    out: list[np.ndarray] = []
    rollouts = iter(advantages)
    for group in groups:
        question, agent, _version = group[0].trajectory.group_key
        scale = np.float32(1.0 / per_question[(question, agent)])
        out.extend(next(rollouts) * scale if scale != 1 else next(rollouts) for _ in group)
    return out


ADVANTAGE_ESTIMATORS: dict[Estimator, AdvantageFn] = {
    Estimator.DR_GRPO: dr_grpo,
    Estimator.GRPO: grpo,
    Estimator.RLOO: rloo,
    Estimator.FORECAST_INFO_GAIN: forecast_info_gain,
    Estimator.SIOP: siop,
    Estimator.SFT: sft,
}
