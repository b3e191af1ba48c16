"""What the update reads from the rollouts' stored sampling parameters: the temperature
π_prox is recomputed at, and the refusal of sampling the trainer cannot reproduce.

μ must be the distribution π_prox is computed at, or every importance weight is biased.
The trainer computes log softmax(logits / T) over the full vocabulary, so it takes T from
the rollouts and refuses a batch whose rollouts disagree on T, and any rollout sampled under
top-p or top-k truncation: its stored log-probs are renormalised over the nucleus, which a
full softmax does not reproduce (ARCHITECTURE §4 samples untruncated for this reason).
Recomputing π_prox under the same truncation was not chosen: the nucleus of π_θ moves with
θ, so the ratio would be discontinuous in the weights being optimised.
SFT reads none of this: its targets may be a teacher's, so it trains at the configured
temperature (1.0 by default).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from futureworld.domain import Trajectory
from futureworld.rl.config import Objective, TrainConfig

DEFAULT_TEMPERATURE = 1.0
"""The temperature of rollouts that store none, and of SFT unless configured."""
FULL_TOP_P = 1.0
"""top_p that keeps the whole vocabulary."""
FULL_TOP_K = (None, 0, -1)
"""top_k values that mean "no top-k truncation" (vLLM's -1, transformers' 0)."""
NAMED_ROLLOUTS = 5
"""How many offending rollouts an error names before it counts the rest."""


def _name(trajectories: Sequence[Trajectory]) -> str:
    keys = ", ".join(t.idempotency_key for t in trajectories[:NAMED_ROLLOUTS])
    more = len(trajectories) - NAMED_ROLLOUTS
    return keys + (f" and {more} more" if more > 0 else "")


def _truncation(sampling: dict[str, Any]) -> str | None:
    """'top_p=0.9' / 'top_k=40' when the stored parameters truncated the distribution."""
    top_p = sampling.get("top_p")
    if top_p is not None and float(top_p) < FULL_TOP_P:
        return f"top_p={float(top_p):g}"
    top_k = sampling.get("top_k")
    if top_k not in FULL_TOP_K:
        return f"top_k={top_k}"
    return None


def refuse_truncated_sampling(trajectories: Sequence[Trajectory]) -> None:
    """ValueError naming the rollouts sampled under top-p or top-k truncation."""
    by_setting: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        setting = _truncation(traj.sampling)
        if setting is not None:
            by_setting.setdefault(setting, []).append(traj)
    if by_setting:
        detail = "; ".join(f"{s}: {_name(ts)}" for s, ts in sorted(by_setting.items()))
        raise ValueError(
            f"{sum(map(len, by_setting.values()))} rollouts were sampled with truncation the "
            f"trainer cannot reproduce (their log-probs are renormalised over the nucleus, "
            f"π_prox uses the full softmax), {detail}; sample with top_p=1 and no top_k"
        )


def behaviour_temperature(trajectories: Sequence[Trajectory], config: TrainConfig) -> float:
    """The temperature the update recomputes log-probs at: the rollouts' own.

    Refuses rollouts that disagree with each other, or with an explicit `config.temperature`.
    Rollouts that store no temperature are taken at the stated one; when none states one,
    the configured temperature (else 1.0) is used.
    """
    if config.objective is Objective.SFT:
        return config.temperature if config.temperature is not None else DEFAULT_TEMPERATURE
    stated: dict[float, list[Trajectory]] = {}
    for traj in trajectories:
        temperature = traj.sampling.get("temperature")
        if temperature is not None:
            stated.setdefault(float(temperature), []).append(traj)
    if len(stated) > 1:
        detail = "; ".join(f"T={t:g}: {_name(ts)}" for t, ts in sorted(stated.items()))
        raise ValueError(
            f"the batch mixes sampling temperatures, which one update cannot reproduce "
            f"({detail}); train each temperature's rollouts separately"
        )
    if not stated:
        return config.temperature if config.temperature is not None else DEFAULT_TEMPERATURE
    [(temperature, sampled)] = stated.items()
    if config.temperature is not None and abs(config.temperature - temperature) > 1e-6:
        raise ValueError(
            f"rollouts {_name(sampled)} were sampled at temperature {temperature:g} but the "
            f"update was told to recompute log-probs at {config.temperature:g}"
        )
    return temperature


def check_sampling(trajectories: Sequence[Trajectory], config: TrainConfig) -> TrainConfig:
    """`config` with the temperature the rollouts were sampled at; refuses what the decoupled
    PPO update cannot reproduce (mixed temperatures, truncated sampling)."""
    if config.objective is Objective.DECOUPLED_PPO:
        refuse_truncated_sampling(trajectories)
    return dataclasses.replace(config, temperature=behaviour_temperature(trajectories, config))
