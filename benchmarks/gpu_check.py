"""The GPU check: what one accelerator does with this code, in three measurements.

1. train: one bf16 optimiser step of the trainer (`futureworld.rl.step.train_step`, packed
   rows, decoupled PPO) on a ~0.5B Qwen2-shaped model built from a config (hidden 896,
   24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151936, tied embeddings):
   tokens/s and MFU = 6·N·T / step time / peak (N parameters, T tokens of the step; the
   H200's dense bf16 peak is taken as 989 TFLOP/s).
2. generate: the local backend's `generate` (continuous batching, the predict path) against
   one raw batched `model.generate` on the same prompts: generated tokens/s and their ratio.
3. fsdp: the same training step with the policy under FSDP2 (`fully_shard` per decoder
   layer and at the root) in a 1-process group: tokens/s and its ratio to step 1.

`--smoke` runs every path on the CPU with a tiny config (gloo instead of NCCL), so a test
keeps the script from rotting where no GPU is lent. Results go to stdout and `--out` (JSON).

    benchmarks/gpu_check.sh [--smoke] [--out gpu_check.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from raw_generate import raw_generate
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

from futureworld.domain import Trajectory
from futureworld.policy.base import SamplingParams
from futureworld.policy.local import LocalBackend
from futureworld.policy.tiny import init_tiny_model
from futureworld.rl.batch import PackedRow, pack_trajectories
from futureworld.rl.config import TrainConfig
from futureworld.rl.parallel import RowLogprobs, StepForward
from futureworld.rl.step import frozen_logprobs, train_step

H200_BF16_DENSE_FLOPS = 989e12
"""The H200 SXM's dense bf16 tensor-core peak (NVIDIA's datasheet, without sparsity)."""


@dataclass(frozen=True)
class Scale:
    """Sizes of one run: the real check or the CPU smoke run."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    rows: int
    """Packed rows per training step."""
    row_tokens: int
    """Tokens per packed row (one rollout each)."""
    prompt_tokens: int
    prompts: int
    """Prompts generated in step 2."""
    new_tokens: int
    device: str
    dtype: torch.dtype
    steps: int
    """Measured training steps (after one warm-up)."""


FULL = Scale(
    hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936,
    rows=8, row_tokens=4096, prompt_tokens=256, prompts=256, new_tokens=256,
    device="cuda", dtype=torch.bfloat16, steps=3,
)  # fmt: skip
SMOKE = Scale(
    hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=512,
    rows=2, row_tokens=64, prompt_tokens=16, prompts=4, new_tokens=8,
    device="cpu", dtype=torch.float32, steps=1,
)  # fmt: skip


def build_model(scale: Scale) -> Qwen2ForCausalLM:
    """A Qwen2 causal LM of `scale`'s shape with random weights, built from a config."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=scale.vocab,
        hidden_size=scale.hidden,
        intermediate_size=scale.intermediate,
        num_hidden_layers=scale.layers,
        num_attention_heads=scale.heads,
        num_key_value_heads=scale.kv_heads,
        max_position_embeddings=max(4096, scale.row_tokens),
        tie_word_embeddings=True,
    )
    return Qwen2ForCausalLM(config)


def parameter_count(model: torch.nn.Module) -> int:
    """N of the 6·N·T bound: every parameter once (the tied head counts once)."""
    return sum(p.numel() for p in model.parameters())


def training_rows(scale: Scale, device: torch.device) -> list[PackedRow]:
    """`scale.rows` rollouts, one per row: a prompt, then generated tokens (mask 1) with
    behaviour log-probs near the model's and advantages of either sign."""
    rng = np.random.default_rng(0)
    trajectories, advantages = [], []
    completion = scale.row_tokens - scale.prompt_tokens
    for i in range(scale.rows):
        ids = rng.integers(0, scale.vocab, size=scale.row_tokens).tolist()
        trajectories.append(
            Trajectory(
                question_id=i,
                agent_id=1,
                policy_version=0,
                sample_index=i,
                prompt_token_ids=tuple(ids[: scale.prompt_tokens]),
                completion_token_ids=tuple(ids[scale.prompt_tokens :]),
                loss_mask=(1,) * completion,
                behaviour_logprobs=(-float(np.log(scale.vocab)),) * completion,
            )
        )
        advantages.append(np.full(completion, 1.0 if i % 2 else -1.0))
    rows = pack_trajectories(trajectories, advantages, scale.row_tokens)
    return [r.to(device) for r in rows]


def _timed_steps(
    model: torch.nn.Module,
    rows: list[PackedRow],
    config: TrainConfig,
    steps: int,
    forward: StepForward | None,
) -> tuple[float, float]:
    """(seconds per optimiser step after one warm-up step, the warm-up step's loss)."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    first = train_step(model, optimizer, rows, config, forward=forward).metrics
    _sync(rows[0].input_ids.device)
    started = time.perf_counter()
    for _ in range(steps):
        train_step(model, optimizer, rows, config, forward=forward)
    _sync(rows[0].input_ids.device)
    return (time.perf_counter() - started) / steps, first["loss"]


def check_train(scale: Scale, *, fsdp: bool) -> dict[str, Any]:
    """One trainer step (after a warm-up): plain, or with the policy under FSDP2. Under FSDP2
    the row forward is the root module (its pre-forward gathers the embeddings, the final norm
    and the tied head), each decoder layer its own unit."""
    from dataclasses import replace

    device = torch.device(scale.device)
    precision = "bf16" if scale.dtype is torch.bfloat16 else "fp32"
    config = TrainConfig(precision=precision, temperature=1.0, device=scale.device)
    model = build_model(scale).to(device)
    n_params = parameter_count(model)
    rows = training_rows(scale, device)
    prox = frozen_logprobs(model, rows, config)  # before sharding: a plain forward
    rows = [replace(r, logp_prox=p) for r, p in zip(rows, prox, strict=True)]
    forward = None
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        root = RowLogprobs(model, 1.0, config.logprob_chunk_tokens)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(root)
        forward = StepForward(logprobs=root)
    seconds, first_loss = _timed_steps(model, rows, config, scale.steps, forward)
    tokens = sum(r.num_tokens for r in rows)
    flops = 6 * n_params * tokens / seconds
    del model, forward
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "parameters": n_params,
        "first_step_loss": first_loss,
        "tokens_per_step": tokens,
        "step_s": seconds,
        "tokens_per_s": tokens / seconds,
        "tflops": flops / 1e12,
        "mfu": flops / H200_BF16_DENSE_FLOPS,
    }


@torch.inference_mode()
def check_generate(scale: Scale, tokenizer_dir: Path) -> dict[str, Any]:
    device = torch.device(scale.device)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    model = build_model(scale).to(device=device, dtype=scale.dtype)
    # no eos inside the tiny tokenizer's range ends a row early: both sides decode all steps
    model.generation_config.eos_token_id = None
    backend = LocalBackend(model, tokenizer, name="gpu-check")
    rng = np.random.default_rng(1)
    high = min(scale.vocab, len(tokenizer))
    prompts = [
        rng.integers(0, high, size=scale.prompt_tokens).tolist() for _ in range(scale.prompts)
    ]
    params = SamplingParams(temperature=1.0, max_new_tokens=scale.new_tokens, seed=0)
    backend.generate(prompts[:2], SamplingParams(temperature=1.0, max_new_tokens=2, seed=0))
    _sync(device)
    started = time.perf_counter()
    generations = backend.generate(prompts, params)
    _sync(device)
    backend_s = time.perf_counter() - started
    backend_tokens = sum(len(g.token_ids) for g in generations)
    input_ids = torch.tensor(prompts, device=device)
    started = time.perf_counter()
    out = raw_generate(
        model,
        input_ids,
        torch.ones_like(input_ids),
        steps=scale.new_tokens,
        pad_token_id=tokenizer.pad_token_id,
    )
    _sync(device)
    raw_s = time.perf_counter() - started
    raw_tokens = (out.shape[1] - input_ids.shape[1]) * out.shape[0]
    del model, backend
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "prompts": len(prompts),
        "backend_tokens_per_s": backend_tokens / backend_s,
        "raw_tokens_per_s": raw_tokens / raw_s,
        "ratio": (backend_tokens / backend_s) / (raw_tokens / raw_s),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _one_process_group(device: str) -> None:
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny config on the CPU")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    scale = SMOKE if args.smoke else FULL
    if scale.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --smoke for the CPU paths")
    started = time.perf_counter()
    results: dict[str, Any] = {"mode": "smoke" if args.smoke else "h200", "device": scale.device}
    if scale.device == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
    results["train"] = check_train(scale, fsdp=False)
    print(f"train: {json.dumps(results['train'])}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = init_tiny_model(Path(tmp) / "tokenizer", vocab_size=512)
        results["generate"] = check_generate(scale, tokenizer_dir)
    print(f"generate: {json.dumps(results['generate'])}", flush=True)
    _one_process_group(scale.device)
    try:
        results["fsdp"] = check_train(scale, fsdp=True)
    finally:
        import torch.distributed as dist

        dist.destroy_process_group()
    results["fsdp"]["ratio_to_plain"] = (
        results["fsdp"]["tokens_per_s"] / results["train"]["tokens_per_s"]
    )
    print(f"fsdp: {json.dumps(results['fsdp'])}", flush=True)
    results["wall_s"] = time.perf_counter() - started
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
