"""Local transformers backend: seeded per-row sampling with continuous batching and a KV
cache, on CPU or CUDA.

Our own decode loop (futureworld.policy.batching) rather than `model.generate`, so the
behaviour log-probs are exactly log softmax(logits / T) of the distribution sampled from,
every row samples from its own seed (futureworld.policy.sampling: what a row samples never
depends on the rows around it), rows join and leave the batch at any step, and stop strings
end a row as soon as they are completed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from futureworld.policy.base import Generation, SamplingParams, is_lora_adapter
from futureworld.policy.batching import ContinuousBatch
from futureworld.policy.streaming import generate_all
from futureworld.torch_threads import set_torch_threads

DEFAULT_MAX_BATCH_TOKENS = 262_144
"""Rows × the widest row's prompt + max_new_tokens per decode batch: about 7 GB of bf16
cache for a 1.5B Qwen2 (28 KB a token), 130 MB for the tiny model; the finished turns kept
for their conversations' next turns take up to twice that (`max_kept_tokens`)."""


class LocalBackend:
    """A causal LM in this process. A prompt is prefilled when it joins the batch; a group's
    identical prompts share one prefill, prompts joining with a common prefix (the system
    turn) share its prefill, and a conversation's next turn prefills only what follows its
    last (futureworld.policy.batching)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        name: str = "local",
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_kept_tokens: int | None = None,
    ) -> None:
        """`max_kept_tokens`: finished rows' keys and values kept for their conversations'
        next turns (futureworld.policy.batching; default twice `max_batch_tokens`, 0 keeps
        none)."""
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer of {name} needs a pad and an eos token")
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.model = model.eval()
        self.max_batch_tokens = max_batch_tokens
        self.max_kept_tokens = max_kept_tokens
        self._tokenizer = tokenizer
        self._name = name
        self._eos_ids = _eos_ids(model, tokenizer)
        # Token ids whose text could end a stop string, per stop-set: only those need a decode.
        self._stop_candidates: dict[tuple[str, ...], frozenset[int]] = {}

    @classmethod
    def from_pretrained(
        cls,
        model_dir: Path,
        adapter_dir: Path | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        torch_threads: int | None = None,
    ) -> LocalBackend:
        """Load a local HF model directory, plus an optional peft LoRA adapter, offline. The
        process's torch threads become `torch_threads`, default the cores it may use
        (futureworld.torch_threads)."""
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{model_dir} is not a model directory (no config.json)")
        set_torch_threads(override=torch_threads)
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=dtype)
        name = f"local:{model_dir.name}"
        if adapter_dir is not None:
            from peft import PeftModel

            adapter_dir = Path(adapter_dir)
            if not is_lora_adapter(adapter_dir):
                raise FileNotFoundError(f"{adapter_dir} is not a peft adapter directory")
            # Merged once: sampling then costs exactly what the base model costs.
            model = PeftModel.from_pretrained(model, adapter_dir, local_files_only=True)
            model = model.merge_and_unload()
            name += f"+{adapter_dir.name}"
        return cls(model.to(device), tokenizer, name=name)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def describe(self) -> str:
        return self._name

    def open_stream(self) -> ContinuousBatch:
        """Continuous batching within `max_batch_tokens` (futureworld.policy.batching)."""
        return self._stream(self.max_kept_tokens)

    def _stream(self, max_kept_tokens: int | None) -> ContinuousBatch:
        return ContinuousBatch(
            self.model,
            self._tokenizer,
            eos_ids=self._eos_ids,
            stop_candidates=self._candidates,
            max_batch_tokens=self.max_batch_tokens,
            max_kept_tokens=max_kept_tokens,
        )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        """Sample all prompts together (row i with seed + i), continuously batched.

        Per step, with logits z (B, V): log μ = log_softmax(z / T) (renormalised over the
        top-p nucleus when top_p < 1); x ~ μ by a seeded Gumbel-max; the stored log-prob is
        log μ(x).
        """
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        # One batch, its stream closed after: no row of it has a next turn to keep it for.
        return generate_all(self._stream(max_kept_tokens=0), prompts, params)

    def _candidates(self, stops: tuple[str, ...]) -> frozenset[int]:
        """Ids whose text contains the last character of some stop string (or a partial byte)."""
        if not stops:
            return frozenset()
        if stops not in self._stop_candidates:
            last_chars = {s[-1] for s in stops} | {"\ufffd"}
            texts = self._tokenizer.batch_decode([[i] for i in range(len(self._tokenizer))])
            self._stop_candidates[stops] = frozenset(
                i for i, text in enumerate(texts) if any(c in text for c in last_chars)
            )
        return self._stop_candidates[stops]


def _eos_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(config_eos)
    return frozenset(i for i in ids if i is not None)
