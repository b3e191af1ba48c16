"""Builders shared by the RL tests: a tiny real Qwen2 model on disk, rollouts, sampling."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from futureworld.domain import ScoredRollout, Trajectory, Turn

VOCAB = 64


def build_tiny_model(path: Path, *, vocab: int = VOCAB, seed: int = 0, hidden: int = 32) -> Path:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def make_rollout(
    *,
    question_id: int = 1,
    sample_index: int = 0,
    reward: float = 0.0,
    outcome_value: float | None = 1.0,
    prompt: Sequence[int] = (1, 2, 3),
    completion: Sequence[int] = (4, 5, 6, 7),
    mask: Sequence[int] | None = None,
    logprobs: Sequence[float] | None = None,
    turns: Sequence[Turn] = (),
    p_yes: float | None = 0.5,
    policy_version: int = 0,
    staleness: int = 0,
    consensus: float | None = None,
) -> ScoredRollout:
    mask = tuple(mask) if mask is not None else (1,) * len(completion)
    if logprobs is None:
        logprobs = tuple(-1.0 if m else 0.0 for m in mask)
    trajectory = Trajectory(
        question_id=question_id,
        agent_id=1,
        policy_version=policy_version,
        sample_index=sample_index,
        prompt_token_ids=tuple(prompt),
        completion_token_ids=tuple(completion),
        loss_mask=mask,
        behaviour_logprobs=tuple(logprobs),
        turns=tuple(turns),
        p_yes=p_yes,
    )
    return ScoredRollout(
        trajectory=trajectory,
        reward=reward,
        outcome_value=outcome_value,
        outcome_revision=1,
        staleness=staleness,
        consensus=consensus,
    )


def sample_rollouts(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    *,
    samples: int,
    completion_tokens: int,
    generator: torch.Generator,
    temperature: float = 1.0,
) -> list[tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]]:
    """Ancestral sampling at `temperature`: (prompt, completion, behaviour log-probs) per sample."""
    out = []
    model.eval()
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([list(prompt)] * samples)
            logps = []
            for _ in range(completion_tokens):
                logits = model(input_ids=ids).logits[:, -1].float() / temperature
                logp_all = logits.log_softmax(-1)
                token = torch.multinomial(logp_all.exp(), 1, generator=generator)
                logps.append(logp_all.gather(-1, token))
                ids = torch.cat([ids, token], 1)
            lp = torch.cat(logps, 1)
            for i in range(samples):
                completion = tuple(ids[i, len(prompt) :].tolist())
                out.append((tuple(prompt), completion, tuple(lp[i].tolist())))
    return out


def unequal_groups(model_dir: Path, *, groups: int, group_size: int = 4) -> list[ScoredRollout]:
    """Scored groups of the tiny model's own samples, of unequal lengths, so a token mean
    differs from a mean of rank means (the multi-rank tests' batch)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    gen = torch.Generator().manual_seed(0)
    rollouts = []
    for q in range(groups):
        # groups of unequal lengths, so a token mean differs from a mean of rank means
        length = 3 + q % 3
        samples = sample_rollouts(
            model, [(1 + q, 2, 3)], samples=group_size, completion_tokens=length, generator=gen
        )
        for s, (prompt, completion, logp) in enumerate(samples):
            rollouts.append(
                make_rollout(
                    question_id=q,
                    sample_index=s,
                    prompt=prompt,
                    completion=completion,
                    logprobs=logp,
                    reward=-sum(completion) / 256,
                )
            )
    return rollouts
