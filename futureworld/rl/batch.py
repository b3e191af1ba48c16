"""Optimiser steps of whole groups and packed micro-batches.

An optimiser step holds K whole groups in replay order (`plan_steps`); only then are the
step's rollouts packed, so packing never moves a rollout to another step. A group that fits the
token budget is one row, its rollouts concatenated with position ids restarting at 0 for each,
so futureworld.rl.forward computes the group's shared prompt once; a group over the budget is
packed rollout by rollout (first-fit decreasing). Under torchrun every rank packs only its
share of each step's groups (`pack_steps`' `share`), through the same path.

Decision: groups are never combined into one row. Two groups in a row share only the agent's
system turn, so the forward pays for both prompts in full: the demo's rows of 2–3 groups
forwarded 765–785 positions where each group alone forwards about 280.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from futureworld.domain import Trajectory


@dataclass(frozen=True)
class PackedRow:
    """One micro-batch: a packed row of L tokens; every tensor has shape (1, L)."""

    input_ids: Tensor
    position_ids: Tensor
    """Restart at 0 at each rollout boundary."""
    target_ids: Tensor
    """The next token of the same rollout (0 where there is none)."""
    mask: Tensor
    """bool: the target is a generated (loss-mask 1) completion token."""
    logp_behaviour: Tensor
    """log μ of the target token (0 where mask is False)."""
    advantages: Tensor
    """A of the target token (0 where mask is False)."""
    rollout_indices: tuple[int, ...]
    """Indices into the packed sequence of trajectories, in row order."""
    logp_prox: Tensor | None = None
    """log π_prox of the target token, filled in once at the start of the update."""
    logp_ref: Tensor | None = None
    """log π_ref of the target token, when a KL penalty is on."""

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device) -> PackedRow:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return replace(self, **moved)


def _sequence_length(trajectory: Trajectory) -> int:
    return len(trajectory.prompt_token_ids) + len(trajectory.completion_token_ids)


def first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Bins of indices whose lengths sum to ≤ budget (an item longer than budget gets its own)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return bins


def _row(
    trajectories: Sequence[Trajectory], advantages: Sequence[np.ndarray], indices: list[int]
) -> PackedRow:
    ids: list[int] = []
    pos: list[int] = []
    tgt: list[int] = []
    mask: list[bool] = []
    logp_mu: list[float] = []
    adv: list[float] = []
    for i in indices:
        traj = trajectories[i]
        seq = list(traj.prompt_token_ids) + list(traj.completion_token_ids)
        n_prompt = len(traj.prompt_token_ids)
        ids += seq
        pos += range(len(seq))
        tgt += [*seq[1:], 0]
        # position p predicts token p + 1; completion token c sits at n_prompt + c
        mask += [False] * (n_prompt - 1) + [bool(m) for m in traj.loss_mask] + [False]
        logp_mu += [0.0] * (n_prompt - 1) + list(traj.behaviour_logprobs) + [0.0]
        adv += [0.0] * (n_prompt - 1) + [float(a) for a in advantages[i]] + [0.0]
    mask_t = torch.tensor([mask])
    return PackedRow(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([pos], dtype=torch.long),
        target_ids=torch.tensor([tgt], dtype=torch.long),
        mask=mask_t,
        logp_behaviour=torch.tensor([logp_mu], dtype=torch.float32) * mask_t,
        advantages=torch.tensor([adv], dtype=torch.float32) * mask_t,
        rollout_indices=tuple(indices),
    )


def _check_packable(trajectories: Sequence[Trajectory], advantages: Sequence[np.ndarray]) -> None:
    if len(trajectories) != len(advantages):
        raise ValueError(f"{len(trajectories)} trajectories but {len(advantages)} advantage arrays")
    for traj, adv in zip(trajectories, advantages, strict=True):
        if not traj.prompt_token_ids:
            raise ValueError(
                f"rollout {traj.idempotency_key} has no prompt tokens: the first completion "
                "token would have no position to be predicted from"
            )
        if len(adv) != len(traj.completion_token_ids):
            raise ValueError(
                f"rollout {traj.idempotency_key}: {len(adv)} advantages for "
                f"{len(traj.completion_token_ids)} completion tokens"
            )


def _pack(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[np.ndarray],
    indices: Sequence[int],
    budget_tokens: int,
) -> list[PackedRow]:
    """Rows of the rollouts `indices` (first-fit decreasing); rows keep the global indices."""
    return _pack_items(trajectories, advantages, [[i] for i in indices], budget_tokens)


def _pack_items(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[np.ndarray],
    items: Sequence[list[int]],
    budget_tokens: int,
) -> list[PackedRow]:
    """Rows of items (runs of rollouts kept side by side), first-fit decreasing by length."""
    sizes = [sum(_sequence_length(trajectories[i]) for i in item) for item in items]
    return [
        _row(trajectories, advantages, [i for b in bin_ for i in items[b]])
        for bin_ in first_fit_decreasing(sizes, budget_tokens)
    ]


def pack_trajectories(
    trajectories: Sequence[Trajectory], advantages: Sequence[np.ndarray], budget_tokens: int
) -> list[PackedRow]:
    """Packs rollouts (prompt + completion) into rows of ≤ budget_tokens, zero padding."""
    _check_packable(trajectories, advantages)
    return _pack(trajectories, advantages, range(len(trajectories)), budget_tokens)


@dataclass(frozen=True)
class StepBatch:
    """The data of one optimiser step: whole groups, consecutive in replay order."""

    rows: tuple[PackedRow, ...]
    """Packed micro-batches whose gradients are summed into the step."""
    rollouts: range
    """Indices of the step's rollouts in replay order (every row's `rollout_indices`)."""
    groups: int
    """Number of whole groups in the step."""


def plan_steps(group_sizes: Sequence[int], groups_per_step: int) -> list[tuple[range, int]]:
    """(rollout index range, group count) of each step: K consecutive whole groups.

    `group_sizes` are the sizes of consecutive groups in replay order; the last step takes
    the groups left over (fewer than K).
    """
    if groups_per_step < 1:
        raise ValueError(f"groups_per_step must be >= 1, got {groups_per_step}")
    if any(size < 1 for size in group_sizes):
        raise ValueError(f"every group needs at least one rollout, got sizes {list(group_sizes)}")
    bounds = np.concatenate([[0], np.cumsum(group_sizes, dtype=np.int64)]).tolist()
    return [
        (
            range(bounds[g], bounds[min(g + groups_per_step, len(group_sizes))]),
            min(groups_per_step, len(group_sizes) - g),
        )
        for g in range(0, len(group_sizes), groups_per_step)
    ]


def pack_steps(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[np.ndarray],
    group_sizes: Sequence[int],
    groups_per_step: int,
    budget_tokens: int,
    share: Callable[[int], range] | None = None,
    *,
    pack_singles: bool = False,
) -> list[StepBatch]:
    """The optimiser steps of an update: K whole groups each, in replay order, each step's
    groups packed into rows of ≤ budget_tokens (`_pack_groups`). `trajectories` are grouped
    consecutively with `group_sizes`.

    With `share` (a step's group count → the range of its groups this rank trains on), a step
    keeps its full rollout range and group count (its metrics are the same on every rank) and
    holds the rows of this rank's groups only. With `pack_singles`, a step's groups of one
    rollout share rows (first-fit decreasing) instead of taking a row each."""
    _check_packable(trajectories, advantages)
    if sum(group_sizes) != len(trajectories):
        raise ValueError(
            f"group sizes add up to {sum(group_sizes)} rollouts, but {len(trajectories)} were given"
        )
    bounds = np.concatenate([[0], np.cumsum(group_sizes, dtype=np.int64)]).tolist()
    spans = [range(a, b) for a, b in itertools.pairwise(bounds)]
    steps, first = [], 0
    for rollouts, groups in plan_steps(group_sizes, groups_per_step):
        mine = range(groups) if share is None else share(groups)
        held = spans[first + mine.start : first + mine.stop]
        rows = _pack_groups(trajectories, advantages, held, budget_tokens, pack_singles)
        steps.append(StepBatch(tuple(rows), rollouts, groups))
        first += groups
    return steps


def _pack_groups(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[np.ndarray],
    groups: Sequence[range],
    budget_tokens: int,
    pack_singles: bool = False,
) -> list[PackedRow]:
    """Rows of a step's groups, in replay order: a group that fits the budget is one row, its
    rollouts side by side, so the row forwards their shared prompt once
    (futureworld.rl.forward); a larger group's rollouts are packed one by one among
    themselves (first-fit decreasing), never with another group's. With `pack_singles` the
    groups of one rollout are packed together (first-fit decreasing), after the others."""
    rows: list[PackedRow] = []
    singles = [g.start for g in groups if len(g) == 1] if pack_singles else []
    for group in groups:
        if singles and len(group) == 1:
            continue
        if sum(_sequence_length(trajectories[i]) for i in group) <= budget_tokens:
            rows.append(_row(trajectories, advantages, list(group)))
        else:
            rows += _pack(trajectories, advantages, group, budget_tokens)
    if singles:
        rows += _pack(trajectories, advantages, singles, budget_tokens)
    return rows


@dataclass(frozen=True)
class PackingStats:
    tokens: int
    packed_slots: int
    """Slots of packed rows: every slot is a token."""
    sorted_padded_slots: int
    """Slots of padded micro-batches over length-sorted rollouts, B·max_len ≤ budget each."""
    replay_padded_slots: int
    """The same in replay order (what padding costs without a global sort)."""

    @property
    def packed_waste(self) -> float:
        return 1 - self.tokens / self.packed_slots

    @property
    def sorted_padded_waste(self) -> float:
        return 1 - self.tokens / self.sorted_padded_slots

    @property
    def replay_padded_waste(self) -> float:
        return 1 - self.tokens / self.replay_padded_slots


def _padded_slots(lengths: Sequence[int], budget_tokens: int) -> int:
    """Greedy padded micro-batches in the given order: grow a batch while B·max_len ≤ budget."""
    slots, batch = 0, []
    for n in lengths:
        if batch and (len(batch) + 1) * max(*batch, n) > budget_tokens:
            slots += len(batch) * max(batch)
            batch = []
        batch.append(n)
    return slots + (len(batch) * max(batch) if batch else 0)


def packing_stats(lengths: Sequence[int], budget_tokens: int) -> PackingStats:
    """Packing against the alternatives: padded batches, length-sorted or in replay order."""
    return PackingStats(
        tokens=int(sum(lengths)),
        packed_slots=int(sum(lengths)),
        sorted_padded_slots=_padded_slots(sorted(lengths), budget_tokens),
        replay_padded_slots=_padded_slots(list(lengths), budget_tokens),
    )
