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

from futureworld.domain import MIN_GROUP_SIZE, ParseStatus, ScoredRollout
from futureworld.rl.config import Estimator, Objective, TrainConfig
from futureworld.scoring import LOG_SCORE_CLIP

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


def _centred(values: np.ndarray) -> np.ndarray:
    """x − mean(x), taken as d − mean(d) with d = x − x₀, so equal values give exactly 0 for
    any group size (the mean of three equal floats need not round back to their value)."""
    deviations = values - values[0]
    return deviations - deviations.mean()


def dr_grpo(group: Sequence[ScoredRollout], config: TrainConfig) -> TokenAdvantages | None:
    """A_i = R_i − (1/G) Σ_j R_j, on every mask-1 token of rollout i.

    No division by the group std: it up-weights near-unanimous groups and pushes binary
    forecasters toward over-confidence. Liu et al. 2025, "Understanding R1-Zero-Like
    Training: A Critical Perspective" (Dr. GRPO), arXiv:2503.20783.
    """
    if len(group) < MIN_GROUP_SIZE:
        return None
    return _broadcast(group, _centred(_rewards(group)))


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
    """dr_grpo plus group-centred, potential-based turn credit; needs the real outcome y.

    For a generated token of rollout i inside its turn with index k:
        A_{i,t} = (R_i − mean_j R_j) + λ · (c_{i,k} − mean_{j ∈ G_k} c_{j,k}),
        c_{i,k} = R_i − Φ(b_{i,k−1}),   Φ(b) = −(b − y)²,
    where b_{i,k−1} is the latest belief rollout i elicited at a turn before k (0.5 before the
    first) and G_k the group's rollouts that have a turn of index k. Φ depends only on the past
    of the turn, so the shaping leaves the optimal policy unchanged (Ng, Harada & Russell 1999,
    "Policy invariance under reward transformations") while crediting turns that moved the
    forecast toward the outcome. The credit is centred within the group at each turn index, as
    the outcome term is: uncentred, eight identical 0.9 answers to a question that resolved yes
    would get λ·(−0.01 + 0.25) = +0.12 on every token and reinforce a collapsed policy; centred,
    identical rollouts get exactly 0. A turn index only one rollout reached has no comparison
    and gets no turn credit. Generated tokens not inside any turn span get the dr_grpo part
    only. Groups without an outcome are skipped.
    """
    if len(group) < MIN_GROUP_SIZE or any(r.outcome_value is None for r in group):
        return None
    base = dr_grpo(group, config)
    assert base is not None
    lam = config.info_gain_lambda
    # c_{i,k} per rollout, keyed by turn index, in float64 until the token arrays
    credits: list[dict[int, float]] = []
    for rollout in group:
        y = float(rollout.outcome_value)  # type: ignore[arg-type]
        belief = PRIOR_BELIEF
        own: dict[int, float] = {}
        for turn in sorted(rollout.trajectory.turns, key=lambda t: t.index):
            own[turn.index] = rollout.reward + (belief - y) ** 2
            if turn.belief is not None:
                belief = turn.belief
        credits.append(own)
    centred: list[dict[int, float]] = [{} for _ in group]
    for k in sorted({k for own in credits for k in own}):
        members = [i for i, own in enumerate(credits) if k in own]
        values = _centred(np.asarray([credits[i][k] for i in members], dtype=np.float64))
        for i, value in zip(members, values, strict=True):
            centred[i][k] = lam * float(value)
    out: TokenAdvantages = []
    for rollout, adv, own in zip(group, base, centred, strict=True):
        mask = _mask(rollout)
        adv = adv.copy()
        for turn in rollout.trajectory.turns:
            span = slice(turn.token_start, turn.token_end)
            adv[span] += np.float32(own[turn.index]) * mask[span]
        out.append(adv)
    return out


RELIABILITY_PRIOR_BRIER = 0.25
"""version_reliability: the Brier a version is assumed to have before any of its forecasts
resolved (that of the uninformed 0.5 forecast)."""
RELIABILITY_PRIOR_WEIGHT = 10.0
"""version_reliability: how many resolved forecasts the prior Brier counts as."""


def version_reliability(brier_sum: float, n_resolved: int) -> float:
    """Reliability weight of a policy version's forecasts: the inverse of its shrunk Brier,
        w_v = 1 / B̃_v,   B̃_v = (Σ_resolved (p − y)² + n₀ · 0.25) / (n_v + n₀),   n₀ = 10,
    over the version's parsed forecasts whose outcome is known. Inverse mean squared error is
    the inverse-variance weight of combining unbiased forecasts (Bates & Granger 1969, "The
    Combination of Forecasts"); the shrinkage keeps a version with few resolved forecasts
    near the uninformed weight 4 instead of trusting a lucky handful."""
    prior = RELIABILITY_PRIOR_WEIGHT * RELIABILITY_PRIOR_BRIER
    shrunk = (brier_sum + prior) / (n_resolved + RELIABILITY_PRIOR_WEIGHT)
    return 1.0 / shrunk


def group_consensus(
    pool_p_yes: np.ndarray, pool_weights: np.ndarray, own_p_yes: np.ndarray, own_weights: np.ndarray
) -> np.ndarray:
    """The pseudo-outcome of a group: one reliability-weighted consensus shared by its members.

    The pool is every parsed forecast of the question by the agent at the group's version or
    earlier (the group included), with weights w_j (`version_reliability` of its version); every
    member i of the group gets the same
        ŷ = Σ_j w_j p_j / Σ_j w_j,
    or NaN when no forecast but its own is left to agree with (Σ_j w_j − w_i = 0: a lone
    forecast has no consensus). Shapes: pool (N,), own (G,) → (G,).

    Why one ŷ for the whole group, not the leave-one-out ŷ_{−i} = (Σ_j w_j p_j − w_i p_i) /
    (Σ_j w_j − w_i): the provisional reward is E[R(p_i, y)] under y ~ Bernoulli(ŷ), for the
    Brier reward −(p_i − ŷ)² − ŷ(1 − ŷ). With a ŷ_{−i} per member the variance term
    −ŷ_{−i}(1 − ŷ_{−i}) differs from member to member and ranks them by where their own vote
    moved their label, not by their forecasts: in a group of four 0.6 and four 0.9 forecasts
    (equal weights, consensus 0.75, both halves 0.15 from it) it alone gives the two halves
    ±0.0107. With one ŷ the expectation's ŷ-only terms are the same for every member and the
    group baseline cancels them, for every reward function, so only the forecasts rank the
    members. Nothing of leave-one-out's distance is lost: the members of a group share one
    version and so one weight w, and p_i − ŷ_{−i} = (p_i − ŷ) · W / (W − w) (W = Σ_j w_j),
    so the leave-one-out distances rank the members exactly as the shared ones do, scaled by
    the group constant (W / (W − w))².
    """
    total = float((pool_weights * pool_p_yes).sum())
    weight = float(pool_weights.sum())
    others = weight - own_weights
    shared = total / weight if weight > 0 else np.nan
    return np.where(others > 0, shared, np.nan)


def provisional_consensus(
    group: Sequence[ScoredRollout], config: TrainConfig
) -> TokenAdvantages | None:
    """dr_grpo on a consensus pseudo-label until the outcome arrives: a rollout-level TTRL-like
    reward, inspired by SIOP but without its outcome modes or turn-level credit (below).

    What it is: A_i = R_i − mean_j R_j on every generated token, where R_i is the real reward
    once the outcome is known and, before, the provisional one the provisional-rewards stage
    stored (flows.stages.provisional): the reward's expectation under the group's shared
    consensus ŷ (`group_consensus`) standing in for P(y = 1),
        R̂_i = ŷ R(p_i, 1) + (1 − ŷ) R(p_i, 0)    (Brier: −(p_i − ŷ)² − ŷ(1 − ŷ)),
    so within a group R̂_i − mean_j R̂_j ranks forecasts by their expected score against the
    consensus alone (for Brier, −(p_i − ŷ)² + mean_j (p_j − ŷ)²). The estimator itself is
    dr_grpo: what sets it apart is which groups replay selects (unresolved ones with
    provisional rewards, voided and replayed for real on resolution).

    Where it departs from the SIOP method that inspired it: this is a consensus pseudo-label at
    the level of whole rollouts and nothing more. There are no outcome modes (one Bernoulli
    pseudo-outcome per group, from the agent's own forecasts), no turn-level credit (every
    generated token of a rollout gets the same advantage, whatever its turns' beliefs did), and
    the pseudo-label is the agent's reliability-weighted agreement with itself, so it can only
    pull the policy toward its own consensus (benchmarks/provisional_consensus_vs_dr_grpo.py
    ends it level with dr_grpo on Brier and worse on ECE). A consensus as the pseudo-label
    follows test-time RL (Zuo et al. 2025, "TTRL", arXiv:2504.16084); the reliability weights
    Bates & Granger 1969.
    """
    return dr_grpo(group, config)


def outcome_potential(belief: float, target: float) -> float:
    """SIOP's potential for a binary question: Φ(b) = q log b + (1 − q) log(1 − b), the
    expected log score of belief b when the outcome is 1 with probability q (b clipped to
    LOG_SCORE_CLIP)."""
    b = min(max(belief, LOG_SCORE_CLIP[0]), LOG_SCORE_CLIP[1])
    return target * np.log(b) + (1.0 - target) * np.log(1.0 - b)


def _assistant_turn_rewards(rollout: ScoredRollout, target: float, lam: float) -> list[float]:
    """siop's reward of each assistant turn of a rollout, in order: the change of the outcome
    potential across the turn (from the belief held when it began to the one held when the
    next began, or the final answer), plus (1 − λ)·R on the last."""
    turns = sorted(rollout.trajectory.turns, key=lambda t: t.index)
    belief = PRIOR_BELIEF
    starts: list[float] = []
    ends: list[float] = []
    for turn in turns:
        if turn.role == "assistant":
            if starts:
                ends.append(belief)
            starts.append(belief)
        if turn.belief is not None:  # elicited after this turn (the loop: after a tool turn)
            belief = turn.belief
    if not starts:  # no turn records: the whole generation is one turn
        starts.append(PRIOR_BELIEF)
    trajectory = rollout.trajectory
    answered = trajectory.parse_status is ParseStatus.OK and trajectory.p_yes is not None
    ends.append(float(trajectory.p_yes) if answered else belief)  # type: ignore[arg-type]
    rewards = [
        outcome_potential(after, target) - outcome_potential(before, target)
        for before, after in zip(starts, ends, strict=True)
    ]
    rewards[-1] += (1.0 - lam) * rollout.reward
    return rewards


def group_target(group: Sequence[ScoredRollout]) -> float | None:
    """P(y = 1) a group is judged against: its outcome when known, else the consensus its
    provisional rewards share (an unparsed member's reward has none); None with neither."""
    for values in ([r.outcome_value for r in group], [r.consensus for r in group]):
        known = [v for v in values if v is not None]
        if known:
            return float(known[0])
    return None


def siop(group: Sequence[ScoredRollout], config: TrainConfig) -> TokenAdvantages | None:
    """Turn-level credit from an outcome potential, after SIOP (Hu et al. 2026, "Self-Induced
    Outcome Potential: Turn-Level Credit Assignment for Agents without Verifiers",
    arXiv:2605.04984), for binary forecasts, before and after the outcome is known.

    SIOP (its reference implementation, verl/utils/siop/siop_process_reward.py) rewards turn t
    of rollout i by how much the turn raised the prefix-conditioned support of the rollout's
    reliable outcome cluster c_i, and adds outcome mass at the end:
        r_{i,t} = q(c_i) · [log p̂_t(c_i) − log p̂_{t−1}(c_i)],   r_{i,T} += (1 − λ) · q(c_i),
    then z-normalises all (rollout, turn) rewards of the group and gives each turn's tokens
    its discounted return Σ_{t' ≥ t} γ^{t'−t} r̃_{i,t'}. Here, with the two outcome modes
    y ∈ {0, 1} of a binary question and the target q = P(y = 1):
        r_{i,k} = Φ(b_{i,k}) − Φ(b_{i,k−1}),   Φ(b) = q log b + (1 − q) log(1 − b),
        r_{i,K} += (1 − λ) · R_i,
        A_{i,k} = G_{i,k} − mean_{j ∈ G_k} G_{j,k},   G_{i,k} = Σ_{k' ≥ k} r_{i,k'},
    for assistant turn k of rollout i, where b_{i,k} is the belief held after it (the one
    elicited after its tool result, GenerationSettings.elicit_beliefs; 0.5 before the first;
    the final answer after the last), R_i the rollout's reward, λ = `siop_lambda` and G_k the
    group's rollouts with a k-th assistant turn. q is the group's consensus ŷ (the provisional
    reward's reliability-weighted pseudo-outcome, `group_consensus`) while the outcome is
    unknown, and the outcome y once it is (SIOP's gold-reference mode, as IGPO).

    Where it departs from SIOP:
    - the outcome modes are y = 1 and y = 0, not clusters of answers by entailment (a
      probability has no cluster), and Φ is the expectation over both modes under q, not the
      support of the rollout's own mode weighted by its frequency;
    - the support after a turn is the belief the agent states when asked then, not the
      teacher-forced likelihood of a reference answer after the turn;
    - the outcome mass is the rollout's reward (its expected score under ŷ, or its score),
      not its cluster's frequency: a forecast is graded, not right or wrong;
    - returns are centred within the group at each turn index rather than z-normalised over
      all (rollout, turn) pairs: identical rollouts then get exactly 0 (pooled, the turns of
      eight identical rollouts still differ from their mean and a collapsed policy would be
      reinforced, the defect forecast_info_gain had), and turns are compared with the same
      turns of other rollouts. γ = 1.
    Generated tokens outside any assistant turn get the first turn's advantage (a rollout with
    no turn records is one turn). Groups with neither an outcome nor a consensus are skipped.
    """
    if len(group) < MIN_GROUP_SIZE:
        return None
    target = group_target(group)
    if target is None:
        return None
    lam = config.siop_lambda
    returns: list[np.ndarray] = []
    for rollout in group:
        rewards = np.asarray(_assistant_turn_rewards(rollout, target, lam))
        returns.append(np.cumsum(rewards[::-1])[::-1])
    advantages: list[list[float]] = [[0.0] * len(g) for g in returns]
    for k in range(max(len(g) for g in returns)):
        members = [i for i, g in enumerate(returns) if len(g) > k]
        centred = _centred(np.asarray([returns[i][k] for i in members], dtype=np.float64))
        for i, value in zip(members, centred, strict=True):
            advantages[i][k] = float(value)
    out: TokenAdvantages = []
    for rollout, own in zip(group, advantages, strict=True):
        mask = _mask(rollout)
        adv = mask * np.float32(own[0])
        turns = sorted(rollout.trajectory.turns, key=lambda t: t.index)
        assistant = [t for t in turns if t.role == "assistant"]
        for turn, value in zip(assistant, own if assistant else (), strict=True):
            span = slice(turn.token_start, turn.token_end)
            adv[span] = np.float32(value) * mask[span]
        out.append(adv.astype(np.float32))
    return out


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
    Estimator.PROVISIONAL_CONSENSUS: provisional_consensus,
    Estimator.SIOP: siop,
    Estimator.SFT: sft,
}
