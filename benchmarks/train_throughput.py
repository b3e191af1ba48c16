"""Training throughput of the RL update step against a minimal torch loop, and packing waste.

Runs `futureworld.rl.trainer.train_step` (decoupled PPO: off-policy mask and normaliser over
the whole step, chunked log-probs, clipped loss, gradient accumulation over the step's packed
rows, grad clipping, AdamW) and a reference loop (per row: full-vocabulary forward,
advantage-weighted NLL, backward; then one AdamW step) on the same group-aligned optimiser
steps (`pack_steps`: one group of 4 rollouts a step, rows of ≤ 2048 tokens) of a Qwen2 with
hidden 256 and 4 layers, and reports tokens/s and their ratio (target ≥ 0.85). Then, on groups
shaped like the demo's (G rollouts sharing one prompt, which starts with the system turn every
question shares, and short answers), the token positions the forward computes and its time
when the trainer's steps pack rollouts one by one across groups (first-fit decreasing, before)
and when each group is a row (`shard_steps`, after). Last, the padding that packing avoids on a
lognormal mix of rollout lengths (200–2000 tokens).

    python benchmarks/train_throughput.py
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Sequence

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from futureworld.domain import Trajectory
from futureworld.rl.batch import (
    PackedRow,
    StepBatch,
    pack_steps,
    pack_trajectories,
    packing_stats,
    plan_steps,
)
from futureworld.rl.config import TrainConfig
from futureworld.rl.forward import forwarded_positions
from futureworld.rl.parallel import World, shard_steps
from futureworld.rl.trainer import frozen_logprobs, train_step

VOCAB = 4096
BUDGETS = (2048, 4096, 8192)
GROUP_SIZE = 4
"""Rollouts per group (question); a step holds `groups_per_step` whole groups."""


def lognormal_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    """Rollout lengths with a median near 600 tokens, clipped to [200, 2000]."""
    return np.clip(rng.lognormal(mean=np.log(600), sigma=0.6, size=n), 200, 2000).astype(int)


def synthetic_trajectories(rng: np.random.Generator, lengths: np.ndarray) -> list[Trajectory]:
    """Prompt = 25% of each rollout; the completion alternates generated and observation spans."""
    out = []
    for i, n in enumerate(lengths):
        n_prompt = max(1, int(n) // 4)
        n_completion = int(n) - n_prompt
        mask = (np.arange(n_completion) // 64 % 3 != 2).astype(int)  # every third span observed
        logp = np.where(mask == 1, -rng.exponential(1.5, n_completion), 0.0)
        out.append(
            Trajectory(
                question_id=i // GROUP_SIZE,
                agent_id=1,
                policy_version=0,
                sample_index=i % GROUP_SIZE,
                prompt_token_ids=tuple(rng.integers(0, VOCAB, n_prompt).tolist()),
                completion_token_ids=tuple(rng.integers(0, VOCAB, n_completion).tolist()),
                loss_mask=tuple(mask.tolist()),
                behaviour_logprobs=tuple(logp.tolist()),
            )
        )
    return out


def build_model(seed: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config)


def reference_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, rows: Sequence[PackedRow]
) -> None:
    """Per row: forward → advantage-weighted NLL on generated tokens → backward; one AdamW step."""
    optimizer.zero_grad(set_to_none=True)
    n = sum(int(r.mask.sum()) for r in rows)
    for row in rows:
        logits = model(
            input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False
        ).logits
        logp = logits.float().log_softmax(-1).gather(-1, row.target_ids[..., None]).squeeze(-1)
        loss = -(logp * row.advantages * row.mask).sum() / n
        loss.backward()
    optimizer.step()


def measure_throughput(
    steps: int, seed: int, groups_per_step: int
) -> tuple[float, float, float, float]:
    """(our tokens/s, reference tokens/s, median per-step throughput ratio, rows per step)."""
    rng = np.random.default_rng(seed)
    config = TrainConfig(
        learning_rate=1e-5,
        micro_batch_tokens=2048,
        groups_per_step=groups_per_step,
        temperature=1.0,
        precision="fp32",
        seed=seed,
    )
    n_rollouts = (steps + 1) * groups_per_step * GROUP_SIZE
    trajectories = synthetic_trajectories(rng, lognormal_lengths(rng, n_rollouts))
    advantages = [rng.normal(size=len(t.completion_token_ids)).astype(np.float32) * t.loss_mask
                  for t in trajectories]  # fmt: skip
    batches: list[StepBatch] = pack_steps(
        trajectories,
        advantages,
        [GROUP_SIZE] * (n_rollouts // GROUP_SIZE),
        config.groups_per_step,
        config.micro_batch_tokens,
    )
    ours, ref = build_model(seed), build_model(seed)
    with_prox = []
    for batch in batches:
        prox = frozen_logprobs(ours, batch.rows, config)
        with_prox.append(
            [dataclasses.replace(r, logp_prox=p) for r, p in zip(batch.rows, prox, strict=True)]
        )
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=config.learning_rate)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=config.learning_rate)
    ref.train()
    train_step(ours, opt_ours, with_prox[0], config)  # warm-up: allocator, AdamW state
    reference_step(ref, opt_ref, with_prox[0])
    pairs = []  # (tokens, ours, reference) seconds per step, interleaved so load bursts hit both
    for rows in with_prox[1:]:
        start = time.perf_counter()
        train_step(ours, opt_ours, rows, config)
        mid = time.perf_counter()
        reference_step(ref, opt_ref, rows)
        pairs.append((sum(r.num_tokens for r in rows), mid - start, time.perf_counter() - mid))
    tokens = sum(n for n, _, _ in pairs)
    ratio = float(np.median([t_ref / t_ours for _, t_ours, t_ref in pairs]))
    return (
        tokens / sum(t for _, t, _ in pairs),
        tokens / sum(t for _, _, t in pairs),
        ratio,
        float(np.mean([len(rows) for rows in with_prox[1:]])),
    )


def demo_shaped_groups(
    rng: np.random.Generator, groups: int, size: int, system: int, question: int
) -> list[Trajectory]:
    """`groups` groups of `size` rollouts: a prompt of a shared system turn (`system` tokens)
    and a question of its own (`question` tokens), answers of 6–30 generated tokens."""
    system_ids = tuple(rng.integers(0, VOCAB, system).tolist())
    out = []
    for g in range(groups):
        prompt = system_ids + tuple(rng.integers(0, VOCAB, question).tolist())
        for i in range(size):
            n = int(rng.integers(6, 31))
            out.append(
                Trajectory(
                    question_id=g,
                    agent_id=1,
                    policy_version=0,
                    sample_index=i,
                    prompt_token_ids=prompt,
                    completion_token_ids=tuple(rng.integers(0, VOCAB, n).tolist()),
                    loss_mask=(1,) * n,
                    behaviour_logprobs=tuple((-rng.exponential(1.5, n)).tolist()),
                )
            )
    return out


def measure_group_rows(
    seed: int, groups: int, size: int, groups_per_step: int, budget: int
) -> dict[str, tuple[float, float, float]]:
    """{packing: (rows, forwarded positions, seconds of a no-grad forward of every row)}."""
    rng = np.random.default_rng(seed)
    trajectories = demo_shaped_groups(rng, groups, size, system=120, question=130)
    advantages = [np.ones(len(t.completion_token_ids), np.float32) for t in trajectories]
    sizes = [size] * groups
    config = TrainConfig(learning_rate=1e-5, temperature=1.0, precision="fp32", seed=seed)
    before = [
        row
        for rollouts, _ in plan_steps(sizes, groups_per_step)
        for row in pack_trajectories(
            [trajectories[i] for i in rollouts], [advantages[i] for i in rollouts], budget
        )
    ]
    steps = shard_steps(trajectories, advantages, sizes, groups_per_step, budget, World(0, 1))
    after = [row for step in steps for row in step.rows]
    model = build_model(seed)
    frozen_logprobs(model, after[:1], config)  # warm-up
    out = {}
    for name, rows in (("rollouts packed across groups", before), ("one group a row", after)):
        start = time.perf_counter()
        frozen_logprobs(model, rows, config)
        seconds = time.perf_counter() - start
        out[name] = (len(rows), sum(forwarded_positions(r) for r in rows), seconds)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed optimiser steps")
    parser.add_argument(
        "--groups-per-step", type=int, default=1, help=f"groups of {GROUP_SIZE} rollouts a step"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    ours, ref, ratio, rows = measure_throughput(args.steps, args.seed, args.groups_per_step)
    title = f"optimiser step: {args.groups_per_step} x {GROUP_SIZE} rollouts, {rows:.1f} rows"
    print(f"{title:<52}{'tokens/s':>12}")
    print(f"{'  futureworld.rl train_step (decoupled PPO)':<52}{ours:>12.0f}")
    print(f"{'  reference loop (forward, backward, AdamW)':<52}{ref:>12.0f}")
    print(f"{'  ratio, median over steps (target >= 0.85)':<52}{ratio:>12.2f}")

    size, groups, k, budget = 4, 32, 8, 4096
    rows = measure_group_rows(args.seed, groups, size, k, budget)
    print(
        f"\n{groups} demo-shaped groups of {size} (250-token prompts, 120 of them shared; "
        f"answers 6-30), {k} groups a step, rows <= {budget} tokens"
    )
    print(f"{'  packing':<36}{'rows':>8}{'positions':>12}{'per row':>10}{'forward s':>12}")
    for name, (n, positions, seconds) in rows.items():
        print(f"  {name:<34}{n:>8}{positions:>12.0f}{positions / n:>10.0f}{seconds:>12.2f}")
    (_, p0, t0), (_, p1, t1) = rows.values()
    print(f"{'  after / before':<36}{'':>8}{p1 / p0:>12.2f}{'':>10}{t1 / t0:>12.2f}")

    lengths = lognormal_lengths(np.random.default_rng(args.seed), 512).tolist()
    print(f"\n{'padding waste, 512 rollouts of 200-2000 tokens':<48}", end="")
    print("".join(f"{f'budget {b}':>14}" for b in BUDGETS))
    stats = [packing_stats(lengths, b) for b in BUDGETS]
    for name, attr in (
        ("  packed rows (first-fit decreasing)", "packed_waste"),
        ("  padded micro-batches, length-sorted", "sorted_padded_waste"),
        ("  padded micro-batches, replay order", "replay_padded_waste"),
    ):
        print(f"{name:<48}" + "".join(f"{getattr(s, attr):>14.1%}" for s in stats))


if __name__ == "__main__":
    main()
