"""The numbers an update is summarised by in the tracker (flows.tracking, under update/): its
rewards, their spread within groups, the advantages the trainer saw and what the steps did.
Pure: reads the update's rollouts and the trainer's result, writes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from futureworld.domain import ParseStatus, ScoredRollout, Trajectory
from futureworld.rl.advantages import compute_advantages, group_rollouts
from futureworld.rl.config import TrainConfig

if TYPE_CHECKING:
    from futureworld.rl.trainer import TrainResult


def update_summary(
    items: Sequence[ScoredRollout | Trajectory], config: TrainConfig, result: TrainResult
) -> dict[str, float]:
    """Per update: groups/rollouts used and skipped, steps; over its scored rollouts the
    reward mean and std, the mean within-group reward std, the share of groups whose rewards
    are all equal (no signal under a group baseline), the share whose G answers are all the
    same (the mark of a collapsed policy: `identical_answer_group_fraction`), the parse rate,
    the mean generated tokens a rollout, staleness; over loss-mask tokens the advantage std
    and mean |A| (as `compute_advantages` gives them to the trainer); over the steps the mean
    loss and the largest kl_prox; for an estimator that credits turns by elicited beliefs,
    the share of multi-turn rollouts that elicited none (`beliefless_share`)."""
    summary = {
        "groups": float(result.groups_used),
        "groups_skipped": float(result.groups_skipped),
        "rollouts": float(result.rollouts_used),
        "steps": float(result.steps),
    }
    losses = [m["loss"] for m in result.metrics if "loss" in m]
    if losses:
        summary["loss_mean"] = float(np.mean(losses))
    kl_prox = [m["kl_prox"] for m in result.metrics if "kl_prox" in m]
    if kl_prox:
        summary["kl_prox_max"] = float(np.max(kl_prox))
    scored = [item for item in items if isinstance(item, ScoredRollout)]
    if not scored:  # SFT on bare trajectories: no rewards
        return summary
    rewards = np.asarray([r.reward for r in scored], dtype=np.float64)
    groups = [np.asarray([r.reward for r in g], dtype=np.float64) for g in group_rollouts(scored)]
    staleness = np.asarray([r.staleness for r in scored], dtype=np.float64)
    answers = [{_answer(r.trajectory) for r in g} for g in group_rollouts(scored)]
    generated = [sum(r.trajectory.loss_mask) for r in scored]
    summary |= {
        "identical_answer_group_fraction": float(np.mean([len(a) == 1 for a in answers])),
        "parse_rate": float(np.mean([r.trajectory.parse_status is ParseStatus.OK for r in scored])),
        "answer_tokens_mean": float(np.mean(generated)),
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std()),
        "group_reward_std_mean": float(np.mean([g.std() for g in groups])),
        "identical_group_fraction": float(np.mean([np.ptp(g) == 0.0 for g in groups])),
        "staleness_mean": float(staleness.mean()),
        "staleness_max": float(staleness.max()),
    }
    if config.estimator.credits_turns:
        summary |= beliefless_share(scored)
    advantages = compute_advantages(scored, config)
    if advantages.rollouts:
        values = np.concatenate(advantages.token_advantages)
        mask = np.concatenate(
            [np.asarray(r.trajectory.loss_mask, dtype=bool) for r in advantages.rollouts]
        )
        on_tokens = values[mask] if mask.any() else values
        summary["advantage_std"] = float(on_tokens.std())
        summary["advantage_abs_mean"] = float(np.abs(on_tokens).mean())
    return summary


def beliefless_share(rollouts: Sequence[ScoredRollout]) -> dict[str, float]:
    """`beliefless_multi_turn_fraction`: the share of the multi-turn rollouts (more than one
    assistant turn) that elicited no belief after any turn, for an estimator that credits
    turns by elicited beliefs (their turns are then credited from the 0.5 prior, which turns
    the turn credit into a rescaled outcome credit); empty when no rollout is multi-turn."""
    multi = [r for r in rollouts if sum(t.role == "assistant" for t in r.trajectory.turns) > 1]
    if not multi:
        return {}
    missing = [all(t.belief is None for t in r.trajectory.turns) for r in multi]
    return {"beliefless_multi_turn_fraction": float(np.mean(missing))}


def _answer(trajectory: Trajectory) -> object:
    """What a rollout answered, comparable across a group: unparsed answers are all one."""
    if trajectory.parse_status is not ParseStatus.OK:
        return None
    return (trajectory.p_yes, trajectory.choice, trajectory.probabilities, trajectory.quantiles)
