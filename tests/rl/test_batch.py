"""Packing and chunked log-probs against a per-sequence forward pass of a real tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from futureworld.rl.batch import (
    first_fit_decreasing,
    pack_steps,
    pack_trajectories,
    packing_stats,
    plan_steps,
)
from futureworld.rl.forward import forwarded_positions, token_logprobs
from futureworld.rl.parallel import World, shard_steps
from tests.rl.rl_builders import make_rollout


def _trajectories(lengths, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i, (n_prompt, n_completion) in enumerate(lengths):
        mask = tuple(int(x) for x in rng.integers(0, 2, n_completion))
        out.append(
            make_rollout(
                sample_index=i,
                prompt=tuple(int(x) for x in rng.integers(0, 64, n_prompt)),
                completion=tuple(int(x) for x in rng.integers(0, 64, n_completion)),
                mask=mask,
            ).trajectory
        )
    return out


def test_first_fit_decreasing_respects_the_budget_and_places_every_item_once():
    lengths = [7, 3, 9, 1, 4, 6, 2, 12]
    bins = first_fit_decreasing(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 or len(b) == 1 for b in bins)


def test_packed_rows_hold_no_padding_and_map_behaviour_logprobs_to_targets():
    trajs = _trajectories([(3, 4), (2, 5), (4, 2)])
    advantages = [np.arange(len(t.completion_token_ids), dtype=np.float32) + 1 for t in trajs]
    rows = pack_trajectories(trajs, advantages, budget_tokens=16)
    assert sum(r.num_tokens for r in rows) == sum(7 for _ in range(2)) + 6
    assert sum(int(r.mask.sum()) for r in rows) == sum(sum(t.loss_mask) for t in trajs)
    row = rows[0]
    first = trajs[row.rollout_indices[0]]
    n_prompt = len(first.prompt_token_ids)
    for c, m in enumerate(first.loss_mask):
        assert bool(row.mask[0, n_prompt - 1 + c]) == bool(m)
        assert int(row.target_ids[0, n_prompt - 1 + c]) == first.completion_token_ids[c]


def test_plan_steps_takes_k_whole_groups_in_replay_order():
    # groups of 3, 1, 4, 2, 2 rollouts; K = 2 → groups (0, 1), (2, 3), (4)
    assert plan_steps([3, 1, 4, 2, 2], 2) == [
        (range(0, 4), 2),
        (range(4, 10), 2),
        (range(10, 12), 1),
    ]
    assert plan_steps([3, 1], 5) == [(range(0, 4), 2)]
    with pytest.raises(ValueError, match="groups_per_step"):
        plan_steps([3], 0)


@pytest.mark.parametrize("budget", [1, 9, 23, 10_000])
@pytest.mark.parametrize("groups_per_step", [1, 2, 3, 7])
def test_pack_steps_never_splits_a_group_across_steps(budget, groups_per_step):
    rng = np.random.default_rng(budget * 100 + groups_per_step)
    sizes = [int(g) for g in rng.integers(2, 9, size=11)]
    lengths = [(int(rng.integers(1, 6)), int(rng.integers(1, 12))) for _ in range(sum(sizes))]
    trajs = _trajectories(lengths, seed=budget)
    group_of = [g for g, size in enumerate(sizes) for _ in range(size)]
    advantages = [np.full(len(t.completion_token_ids), i, np.float32) for i, t in enumerate(trajs)]
    steps = pack_steps(trajs, advantages, sizes, groups_per_step, budget)
    seen: list[int] = []
    for n, step in enumerate(steps):
        in_rows = sorted(i for row in step.rows for i in row.rollout_indices)
        assert in_rows == list(step.rollouts)  # every rollout of the step once, no other
        groups = {group_of[i] for i in step.rollouts}
        # whole groups: every member of each group in this step is in this step
        assert all(
            group_of.count(g) == sum(group_of[i] == g for i in step.rollouts) for g in groups
        )
        assert sorted(groups) == list(range(n * groups_per_step, n * groups_per_step + step.groups))
        assert step.groups == min(groups_per_step, len(sizes) - n * groups_per_step)
        for row in step.rows:
            assert row.num_tokens <= budget or len(row.rollout_indices) == 1
        seen += step.rollouts
    assert seen == list(range(len(trajs)))  # replay order, each rollout in exactly one step


def _group_rollouts(sizes, prompt_len, seed=0):
    """Groups whose G rollouts share one prompt (as a group's do), with answers of 1–6."""
    rng = np.random.default_rng(seed)
    out = []
    for g, size in enumerate(sizes):
        prompt = tuple(int(x) for x in rng.integers(0, 64, prompt_len))
        for i in range(size):
            n = int(rng.integers(1, 7))
            out.append(
                make_rollout(
                    sample_index=g * 100 + i,
                    prompt=prompt,
                    completion=tuple(int(x) for x in rng.integers(0, 64, n)),
                    mask=(1,) * n,
                ).trajectory
            )
    return out


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_the_trainers_steps_keep_each_group_that_fits_in_a_row_of_its_own(ranks):
    """shard_steps is what train_policy packs with: on every rank, a row is one whole group
    when the group fits the budget, and never mixes two groups."""
    sizes = [4, 3, 4, 2, 4, 1, 4]
    trajs = _group_rollouts(sizes, prompt_len=20)
    group_of = [g for g, size in enumerate(sizes) for _ in range(size)]
    advantages = [np.ones(len(t.completion_token_ids), np.float32) for t in trajs]
    budget = 4 * (20 + 6)  # every group fits; two groups together often would too
    held: list[int] = []
    for rank in range(ranks):
        steps = shard_steps(trajs, advantages, sizes, 3, budget, World(rank=rank, size=ranks))
        for step in steps:
            for row in step.rows:
                (group,) = {group_of[i] for i in row.rollout_indices}
                assert list(row.rollout_indices) == [
                    i for i, g in enumerate(group_of) if g == group
                ]
                held.append(group)
    assert sorted(held) == list(range(len(sizes)))  # every group on exactly one rank

    # A group over the budget is split into rows of its own rollouts only.
    [step] = shard_steps(trajs[:4], advantages[:4], [4], 1, 2 * 26, World(rank=0, size=1))
    assert len(step.rows) >= 2 and sorted(i for r in step.rows for i in r.rollout_indices) == [
        0,
        1,
        2,
        3,
    ]


def test_packed_singles_share_rows_and_larger_groups_keep_their_own():
    """With pack_singles the trainer packs a step's groups of one rollout (demonstrations)
    several to a row; a group of several keeps its own row; every rollout is trained once."""
    sizes = [1, 1, 3, 1, 1, 1, 2, 1]
    trajs = _group_rollouts(sizes, prompt_len=20)
    group_of = [g for g, size in enumerate(sizes) for _ in range(size)]
    advantages = [np.ones(len(t.completion_token_ids), np.float32) for t in trajs]
    budget = 4 * (20 + 6)
    world = World(rank=0, size=1)
    apart = shard_steps(trajs, advantages, sizes, 8, budget, world)
    packed = shard_steps(trajs, advantages, sizes, 8, budget, world, pack_singles=True)
    assert len(apart[0].rows) == len(sizes)
    assert len(packed[0].rows) < len(apart[0].rows)
    for row in packed[0].rows:
        groups = {group_of[i] for i in row.rollout_indices}
        if len(groups) > 1:
            assert all(sizes[g] == 1 for g in groups)
        assert row.num_tokens <= budget
    held = sorted(i for row in packed[0].rows for i in row.rollout_indices)
    assert held == list(range(len(trajs)))
    assert packed[0].rollouts == apart[0].rollouts and packed[0].groups == apart[0].groups


def test_a_row_of_one_group_forwards_its_prompt_once():
    trajs = _group_rollouts([4, 4], prompt_len=50, seed=3)
    advantages = [np.ones(len(t.completion_token_ids), np.float32) for t in trajs]
    [step] = shard_steps(trajs, advantages, [4, 4], 2, 10_000, World(rank=0, size=1))
    assert len(step.rows) == 2
    for row in step.rows:
        longest = max(len(trajs[i].completion_token_ids) for i in row.rollout_indices)
        # the shared prompt once, then R right-padded answers (less any prefix they share)
        assert forwarded_positions(row) <= 50 + 4 * longest
        assert forwarded_positions(row) < row.num_tokens
    both = pack_trajectories(trajs, advantages, 10_000)  # rollouts packed one by one
    assert sum(forwarded_positions(r) for r in both) > sum(
        forwarded_positions(r) for r in step.rows
    )


def test_pack_steps_refuses_group_sizes_that_do_not_cover_the_rollouts():
    trajs = _trajectories([(2, 3), (2, 3), (2, 3)])
    advantages = [np.zeros(3, np.float32)] * 3
    with pytest.raises(ValueError, match="add up to 2 rollouts, but 3"):
        pack_steps(trajs, advantages, [2], 1, 64)


def test_packing_rejects_a_rollout_without_prompt():
    traj = make_rollout(prompt=()).trajectory
    with pytest.raises(ValueError, match="no prompt tokens"):
        pack_trajectories([traj], [np.ones(4, dtype=np.float32)], 16)


def test_packing_avoids_the_padding_of_length_sorted_batches():
    stats = packing_stats([10, 200, 30, 900, 55, 400], budget_tokens=1000)
    assert stats.packed_waste == 0
    # replay order: [10, 200, 30] → 3·200, [900] → 900, [55, 400] → 2·400 slots
    assert stats.replay_padded_slots == 600 + 900 + 800
    # sorted: [10, 30, 55, 200] → 800, [400] → 400, [900] → 900 slots
    assert stats.sorted_padded_slots == 800 + 400 + 900
    assert stats.sorted_padded_waste > 0.1


@pytest.mark.parametrize("chunk", [2, 1024])
def test_packed_chunked_logprobs_equal_separate_full_vocabulary_forward(tiny_model_dir, chunk):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa")
    trajs = _trajectories([(3, 5), (1, 4), (6, 3), (2, 6)], seed=3)
    zero_adv = [np.zeros(len(t.completion_token_ids), dtype=np.float32) for t in trajs]
    rows = pack_trajectories(trajs, zero_adv, budget_tokens=64)
    assert len(rows) == 1 and len(rows[0].rollout_indices) == 4
    row = rows[0]
    temperature = 0.7
    logp, entropy = token_logprobs(model, row, temperature, chunk)
    logp.sum().backward()  # the checkpointed chunk path is differentiable
    logp = logp.detach()
    offset = 0
    for i in row.rollout_indices:
        t = trajs[i]
        seq = torch.tensor([list(t.prompt_token_ids) + list(t.completion_token_ids)])
        with torch.no_grad():
            logits = model(input_ids=seq).logits[0].float() / temperature
        ref = logits.log_softmax(-1)
        n_prompt = len(t.prompt_token_ids)
        for c, m in enumerate(t.loss_mask):
            pos = offset + n_prompt - 1 + c
            if m:
                want = ref[n_prompt - 1 + c, t.completion_token_ids[c]]
                assert float(logp[0, pos]) == pytest.approx(float(want), abs=1e-5)
                want_h = -(ref[n_prompt - 1 + c].exp() * ref[n_prompt - 1 + c]).sum()
                assert float(entropy[0, pos]) == pytest.approx(float(want_h), abs=1e-5)
            else:
                assert float(logp[0, pos]) == 0.0
        offset += seq.shape[1]


def _group_trajectories(prompt_len: int, completions: list[int], seed: int = 0):
    """Rollouts of one prompt (a group), completions of the given lengths, random masks."""
    rng = np.random.default_rng(seed)
    prompt = tuple(int(x) for x in rng.integers(0, 64, prompt_len))
    return [
        make_rollout(
            sample_index=i,
            prompt=prompt,
            completion=tuple(int(x) for x in rng.integers(0, 64, n)),
            mask=(*(int(x) for x in rng.integers(0, 2, n - 1)), 1),
        ).trajectory
        for i, n in enumerate(completions)
    ]


@pytest.mark.parametrize("same_prompt", [True, False])
def test_a_row_sharing_its_prompt_gives_the_values_and_gradients_of_separate_forwards(
    tiny_model_dir, same_prompt
):
    """A row of a group's rollouts forwards the common prompt once (far fewer positions than
    the packed row); its log-probs and their gradients equal one forward per rollout. With
    unrelated prompts of different lengths the row is computed packed, with the same result."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trajs = _group_trajectories(40, [3, 9, 5, 1])
    if not same_prompt:
        trajs += _trajectories([(7, 4), (30, 2)], seed=3)
    advantages = [np.linspace(-1, 1, len(t.completion_token_ids)) for t in trajs]
    (row,) = pack_trajectories(trajs, advantages, 10_000)
    weights = torch.linspace(0.5, 2.0, row.num_tokens)[None]
    forwarded: list[int] = []
    hook = model.model.register_forward_pre_hook(
        lambda _m, _a, kwargs: forwarded.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    model.zero_grad()
    together, _ = token_logprobs(model, row, 0.8, chunk_tokens=4)
    hook.remove()
    if same_prompt:
        assert forwarded == [40, 4 * 9]  # the prompt once, then the longest remainder × 4
    else:
        assert forwarded == [row.num_tokens]
    (together * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    separate = torch.zeros_like(together)
    offset = 0
    for i in row.rollout_indices:
        (single,) = pack_trajectories([trajs[i]], [advantages[i]], 10_000)
        logp, _ = token_logprobs(model, single, 0.8, chunk_tokens=4)
        n = single.num_tokens
        (logp * weights[:, offset : offset + n]).sum().backward()
        separate[:, offset : offset + n] = logp.detach()
        offset += n
    assert torch.allclose(together.detach(), separate, atol=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(grads[name], p.grad, atol=1e-5), name
