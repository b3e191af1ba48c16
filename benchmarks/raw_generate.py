"""The raw baseline the generation benchmarks time our code against: one batched Hugging Face
`model.generate` with plain sampling (temperature 1, no top-k or top-p cut) forced to exactly
`steps` new tokens, so it makes as many decode steps as the run it is compared with."""

from __future__ import annotations

import torch


def raw_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    steps: int,
    pad_token_id: int,
) -> torch.Tensor:
    """The prompts (B, P) with their `steps` sampled tokens: (B, P + steps)."""
    return model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=steps,
        min_new_tokens=steps,
        pad_token_id=pad_token_id,
    )
