"""Training throughput of the RL update step against a minimal torch loop, and packing waste.

Runs `futureworld.rl.trainer.train_step` (decoupled PPO: off-policy mask, chunked log-probs,
clipped loss, grad clipping, AdamW) and a reference loop (full-vocabulary forward,
advantage-weighted NLL, backward, AdamW) on the same packed rows of a Qwen2 with hidden 256
and 4 layers, and reports tokens/s and their ratio (target ≥ 0.85). Then measures the padding
that packing avoids on a lognormal mix of rollout lengths (200–2000 tokens).

    python benchmarks/train_throughput.py
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from futureworld.domain import Trajectory
from futureworld.rl.batch import PackedRow, pack_trajectories, packing_stats
from futureworld.rl.config import TrainConfig
from futureworld.rl.trainer import frozen_logprobs, train_step

VOCAB = 4096
BUDGETS = (2048, 4096, 8192)


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
                question_id=i // 8,
                agent_id=1,
                policy_version=0,
                sample_index=i % 8,
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
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, row: PackedRow
) -> None:
    """forward → advantage-weighted NLL on generated tokens → backward → AdamW step."""
    optimizer.zero_grad(set_to_none=True)
    logits = model(input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False).logits
    logp = logits.float().log_softmax(-1).gather(-1, row.target_ids[..., None]).squeeze(-1)
    loss = -(logp * row.advantages * row.mask).sum() / row.mask.sum()
    loss.backward()
    optimizer.step()


def measure_throughput(steps: int, seed: int) -> tuple[float, float, float]:
    """(our tokens/s, reference tokens/s, median per-row throughput ratio)."""
    rng = np.random.default_rng(seed)
    config = TrainConfig(learning_rate=1e-5, micro_batch_tokens=2048, precision="fp32", seed=seed)
    trajectories = synthetic_trajectories(rng, lognormal_lengths(rng, 48))
    advantages = [rng.normal(size=len(t.completion_token_ids)).astype(np.float32) * t.loss_mask
                  for t in trajectories]  # fmt: skip
    rows = pack_trajectories(trajectories, advantages, config.micro_batch_tokens)
    rows = sorted(rows, key=lambda r: -r.num_tokens)[: steps + 1]  # the fullest rows
    ours, ref = build_model(seed), build_model(seed)
    prox = frozen_logprobs(ours, rows, config)
    rows = [dataclasses.replace(r, logp_prox=p) for r, p in zip(rows, prox, strict=True)]
    opt_ours = torch.optim.AdamW(ours.parameters(), lr=config.learning_rate)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=config.learning_rate)
    ref.train()
    train_step(ours, opt_ours, rows[:1], config)  # warm-up: allocator, AdamW state
    reference_step(ref, opt_ref, rows[0])
    pairs = []  # (ours, reference) seconds per row, interleaved so load bursts hit both
    for row in rows[1:]:
        start = time.perf_counter()
        train_step(ours, opt_ours, [row], config)
        mid = time.perf_counter()
        reference_step(ref, opt_ref, row)
        pairs.append((row.num_tokens, mid - start, time.perf_counter() - mid))
    tokens = sum(n for n, _, _ in pairs)
    ratio = float(np.median([t_ref / t_ours for _, t_ours, t_ref in pairs]))
    return (
        tokens / sum(t for _, t, _ in pairs),
        tokens / sum(t for _, _, t in pairs),
        ratio,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="timed steps of 2048-token rows")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    ours, ref, ratio = measure_throughput(args.steps, args.seed)
    print(f"{'training step (hidden 256, 4 layers, vocab 4096)':<52}{'tokens/s':>12}")
    print(f"{'  futureworld.rl train_step (decoupled PPO)':<52}{ours:>12.0f}")
    print(f"{'  reference loop (forward, backward, AdamW)':<52}{ref:>12.0f}")
    print(f"{'  ratio, median over rows (target >= 0.85)':<52}{ratio:>12.2f}")

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
