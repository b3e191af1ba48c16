"""Local transformers backend: batched sampling with a KV cache on CPU or CUDA.

Our own decode loop rather than `model.generate`, so the behaviour log-probs are exactly
log softmax(logits / T) of the distribution sampled from, seeding goes through one
`torch.Generator`, and stop strings end a row as soon as they are completed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from futureworld.policy.base import (
    FinishReason,
    Generation,
    SamplingParams,
    find_stop,
    is_lora_adapter,
)


class LocalBackend:
    """A causal LM in this process. Prefixes are recomputed per call (no prefix cache)."""

    def __init__(
        self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, *, name: str = "local"
    ) -> None:
        if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer of {name} needs a pad and an eos token")
        self.model = model.eval()
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
    ) -> LocalBackend:
        """Load a local HF model directory, plus an optional peft LoRA adapter, offline."""
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{model_dir} is not a model directory (no config.json)")
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

    @torch.inference_mode()
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        """Sample all prompts together: left padding, one forward per step, KV cache.

        Per step, with logits z (B, V): log μ = log_softmax(z / T) (renormalised over the
        top-p nucleus when top_p < 1); x ~ μ; the stored log-prob is log μ(x).
        """
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        device = self.device
        batch, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self._tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        generator = torch.Generator(device=device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
        stop_candidates = self._candidates(params.stop)
        tail_tokens = max((len(s.encode()) for s in params.stop), default=0) + 1

        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        finish: list[FinishReason | None] = [None] * batch
        stop_hit: list[str | None] = [None] * batch
        active = list(range(batch))
        logits, cache = self._prefill(input_ids, attention_mask, position_ids, prompts)
        for step in range(params.max_new_tokens):
            logp = torch.log_softmax(logits.float() / params.temperature, dim=-1)
            if params.top_p < 1.0:
                logp = _nucleus(logp, params.top_p)
            next_ids = torch.multinomial(logp.exp(), 1, generator=generator)
            chosen = logp.gather(1, next_ids)
            ids_list = next_ids.squeeze(1).tolist()
            lp_list = chosen.squeeze(1).tolist()
            still_active = []
            for row in active:
                token = ids_list[row]
                tokens[row].append(token)
                logprobs[row].append(lp_list[row])
                if token in self._eos_ids:
                    finish[row] = FinishReason.STOP
                elif token in stop_candidates:
                    tail = self._tokenizer.decode(tokens[row][-tail_tokens:])
                    stop_hit[row] = find_stop(tail, params.stop)
                    if stop_hit[row] is not None:
                        finish[row] = FinishReason.STOP
                if finish[row] is None:
                    still_active.append(row)
            active = still_active
            if not active or step + 1 == params.max_new_tokens:
                break
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], 1)
            position_ids = position_ids[:, -1:] + 1
            out = self.model(
                input_ids=next_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
            )
            logits, cache = out.logits[:, -1, :], out.cache
        return [
            Generation(
                token_ids=tuple(tokens[row]),
                logprobs=tuple(logprobs[row]),
                finish_reason=finish[row] or FinishReason.LENGTH,
                stop_string=stop_hit[row],
            )
            for row in range(batch)
        ]

    def _prefill(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        prompts: Sequence[Sequence[int]],
    ) -> tuple[torch.Tensor, object]:
        """Last-position logits (B, V) and the KV cache of the prompts.

        The G rollouts of a group start from one prompt: it is encoded once and its cache
        repeated G times, which cuts the first turn's prefill by a factor G.
        """
        batch = input_ids.shape[0]
        shared = batch > 1 and all(p == prompts[0] for p in prompts)
        rows = slice(0, 1) if shared else slice(None)
        out = self.model(
            input_ids=input_ids[rows],
            attention_mask=attention_mask[rows],
            position_ids=position_ids[rows],
            use_cache=True,
            logits_to_keep=1,
        )
        logits, cache = out.logits[:, -1, :], out.cache
        if not shared:
            return logits, cache
        if not hasattr(cache, "batch_repeat_interleave"):  # A cache type we cannot repeat.
            out = self.model(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=True,
                logits_to_keep=1,
            )
            return out.logits[:, -1, :], out.cache
        cache.batch_repeat_interleave(batch)
        return logits.expand(batch, -1), cache

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


def _nucleus(logp: torch.Tensor, top_p: float) -> torch.Tensor:
    """Renormalised log-probs over the smallest set of tokens with mass >= top_p. (B, V)."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()
    sorted_logp = sorted_logp.masked_fill(mass_before >= top_p, float("-inf"))
    kept = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
    return torch.log_softmax(kept, dim=-1)


def _eos_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(config_eos, int):
        ids.add(config_eos)
    elif config_eos:
        ids.update(config_eos)
    return frozenset(i for i in ids if i is not None)
