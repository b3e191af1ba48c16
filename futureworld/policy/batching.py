"""Continuous batching for a causal LM in this process: the local backend's generation
stream. Every decode step runs all active rows together; a row that finishes leaves the batch
at once, and waiting requests join at the next step, so the batch stays full across requests.

Layout (padding-aware batching): one KV cache for the batch, rows right-aligned and
left-padded, every row's attention mask and positions its own. Each row keeps one pending
input token outside the cache (a prompt's last token, then each sampled token): a decode step
forwards all pending tokens at once, so a joining row needs only a prefill of its prompt
minus one token, merged into the cache by padding the narrower side on the left. Rows of one
prompt arriving together (a group's G rollouts) share one prefill. Columns no row uses any
more are trimmed whenever rows leave.

Shared prefixes: the prompts of one agent begin with the same chat-template system turn (two
thirds of the demo's 186-token prompt). When the prompts joining together share at least
`MIN_SHARED_PREFIX` leading tokens, that prefix is prefilled once and its cache copied into
every joining row, whose own suffix is then prefilled on top of it: a row's cache is
[shared prefix][padding][its suffix], the padding masked and the suffix at its true positions.
The stream keeps the last shared prefix, so a later admission whose prompts all extend it
(groups joining one at a time as earlier ones finish) prefills only suffixes. The stream
lives for one engine run, over fixed weights, so the kept prefix cannot go stale. The keys
and values are the same computation split in two, equal to a whole prefill to float rounding
(the engine's test against the one-at-a-time loop holds them to 1e-5).

Admission is bounded by a token budget: rows × the widest row's reservation (its prompt plus
its `max_new_tokens`) must stay within `max_batch_tokens`, which bounds the padded cache, the
logits and the attention at every step; an empty batch takes any request. Sampling is
`futureworld.policy.sampling.sample_rows`: per-row seeds, so batching never changes a sample.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase

from futureworld.policy.base import FinishReason, Generation, find_stop
from futureworld.policy.sampling import sample_rows
from futureworld.policy.streaming import (
    GenerationError,
    StreamRequest,
    StreamResult,
    fresh_seed,
)

_KV = list[tuple[torch.Tensor, torch.Tensor]]
"""Keys and values per layer, (B, H, L, D) each."""

MIN_SHARED_PREFIX = 16
"""Fewest leading tokens worth a prefill of their own to share among joining prompts."""


@dataclass
class _Row:
    request: StreamRequest
    seed: int
    reserved: int
    """Prompt plus max_new_tokens: the most cache width this row can ever need."""
    stop_candidates: frozenset[int]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class ContinuousBatch:
    """A `GenerationStream` over `model` (any HF causal LM with a DynamicCache)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        eos_ids: frozenset[int],
        stop_candidates: Callable[[tuple[str, ...]], frozenset[int]],
        max_batch_tokens: int,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._eos_ids = eos_ids
        self._stop_candidates = stop_candidates
        self._budget = max_batch_tokens
        self._device = next(model.parameters()).device
        self._rows: list[_Row] = []
        self._joining: list[_Row] = []
        self._cache: object | None = None
        self._mask = torch.zeros((0, 0), dtype=torch.long, device=self._device)
        self._pending = torch.zeros(0, dtype=torch.long, device=self._device)
        self._positions = torch.zeros(0, dtype=torch.long, device=self._device)
        self._widest = 0
        self._shared: tuple[tuple[int, ...], _KV] | None = None
        """The last shared prefix prefilled and its keys and values (batch of one)."""

    @property
    def in_flight(self) -> int:
        return len(self._rows) + len(self._joining)

    @property
    def stepped(self) -> bool:
        return True  # one decode step of what was offered: time never enters

    def offer(self, request: StreamRequest) -> bool:
        if not request.prompt:
            raise ValueError(f"request {request.key}: every prompt needs at least one token")
        reserved = len(request.prompt) + request.params.max_new_tokens
        rows = self.in_flight + 1
        if rows > 1 and rows * max(self._widest, reserved) > self._budget:
            return False
        self._widest = max(self._widest, reserved)
        seed = fresh_seed() if request.params.seed is None else request.params.seed
        self._joining.append(
            _Row(request, seed, reserved, self._stop_candidates(request.params.stop))
        )
        return True

    def wake(self) -> None:
        pass  # `advance` is one decode step in this thread; it never blocks on others.

    def close(self) -> None:
        self._rows, self._joining, self._cache, self._shared = [], [], None, None
        self._widest = 0

    @torch.inference_mode()
    def advance(self) -> list[StreamResult]:
        """Admit the joining rows, then one decode step for every row."""
        if self._joining:
            self._admit(self._joining)
            self._joining = []
        if not self._rows:
            return []
        mask = torch.cat([self._mask, self._mask.new_ones((len(self._rows), 1))], dim=1)
        out = self._model(
            input_ids=self._pending[:, None],
            attention_mask=mask,
            position_ids=self._positions[:, None],
            cache=self._cache,
            use_cache=True,
        )
        self._cache, self._mask = out.cache, mask
        rows = self._rows
        temperatures = torch.tensor(
            [r.request.params.temperature for r in rows], device=self._device
        )
        top_ps = torch.tensor([r.request.params.top_p for r in rows], device=self._device)
        ids, logprobs = sample_rows(
            out.logits[:, -1, :],
            temperatures,
            top_ps,
            [r.seed for r in rows],
            [len(r.tokens) for r in rows],
        )
        finished: list[StreamResult] = []
        keep: list[int] = []
        for index, (row, token, logprob) in enumerate(zip(rows, ids, logprobs, strict=True)):
            if not math.isfinite(logprob):
                finished.append(
                    StreamResult(
                        key=row.request.key,
                        error=GenerationError(
                            f"non-finite logits at generated token {len(row.tokens)}"
                        ),
                    )
                )
                continue
            row.tokens.append(token)
            row.logprobs.append(logprob)
            result = self._finish(row, token)
            if result is None:
                keep.append(index)
            else:
                finished.append(result)
        self._pending = torch.tensor(ids, dtype=torch.long, device=self._device)
        self._positions = self._positions + 1
        if len(keep) < len(rows):
            self._select(keep)
        return finished

    def _finish(self, row: _Row, token: int) -> StreamResult | None:
        """The row's result if `token` ended it (eos, a stop string, or its length)."""
        params = row.request.params
        reason: FinishReason | None = None
        stop_hit: str | None = None
        if token in self._eos_ids:
            reason = FinishReason.STOP
        elif token in row.stop_candidates:
            tail_tokens = max(len(s.encode()) for s in params.stop) + 1
            stop_hit = find_stop(self._tokenizer.decode(row.tokens[-tail_tokens:]), params.stop)
            if stop_hit is not None:
                reason = FinishReason.STOP
        if reason is None and len(row.tokens) >= params.max_new_tokens:
            reason = FinishReason.LENGTH
        if reason is None:
            return None
        generation = Generation(
            token_ids=tuple(row.tokens),
            logprobs=tuple(row.logprobs),
            finish_reason=reason,
            stop_string=stop_hit,
        )
        return StreamResult(key=row.request.key, generation=generation)

    def _admit(self, joining: list[_Row]) -> None:
        """Prefill the joining rows' prompts (all but the last token, which becomes their
        pending input), one prefill per distinct prompt, on top of a shared prefix's cache
        where they have one, and merge them into the batch."""
        prefixes: dict[tuple[int, ...], int] = {}
        which = [prefixes.setdefault(r.request.prompt[:-1], len(prefixes)) for r in joining]
        unique = list(prefixes)
        shared, shared_cache = self._shared_prefix(unique)
        suffixes = [p[len(shared) :] for p in unique]
        width = max(len(p) for p in suffixes)
        mask = torch.zeros((len(unique), width), dtype=torch.long, device=self._device)
        cache = None
        if width > 0:
            input_ids = torch.full(
                (len(unique), width), self._tokenizer.pad_token_id, dtype=torch.long
            )
            for i, suffix in enumerate(suffixes):
                if suffix:
                    input_ids[i, width - len(suffix) :] = torch.as_tensor(suffix)
                    mask[i, width - len(suffix) :] = 1
            positions = len(shared) + (mask.cumsum(-1) - 1).clamp(min=0)
            if shared:
                mask = torch.cat([mask.new_ones((len(unique), len(shared))), mask], dim=1)
            out = self._model(
                input_ids=input_ids.to(self._device),
                attention_mask=mask,
                position_ids=positions,
                cache=_repeat(shared_cache, len(unique)),
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.cache
        index = torch.tensor(which, dtype=torch.long, device=self._device)
        if len(unique) < len(joining):
            mask = mask.index_select(0, index)
            if cache is not None:
                for layer in cache.layers:
                    layer.keys = layer.keys.index_select(0, index)
                    layer.values = layer.values.index_select(0, index)
        pending = torch.tensor(
            [r.request.prompt[-1] for r in joining], dtype=torch.long, device=self._device
        )
        positions = torch.tensor(
            [len(r.request.prompt) - 1 for r in joining], dtype=torch.long, device=self._device
        )
        self._merge(cache, mask)
        self._rows.extend(joining)
        self._pending = torch.cat([self._pending, pending])
        self._positions = torch.cat([self._positions, positions])

    def _shared_prefix(self, unique: list[tuple[int, ...]]) -> tuple[tuple[int, ...], _KV]:
        """The leading tokens all of `unique` share (each keeping a suffix of at least one
        token) and their keys and values (batch of one): from the kept prefix, cut to what
        they share with it, when that is at least `MIN_SHARED_PREFIX` long; else prefilled
        now (and kept) when at least two prompts share that many; else nothing."""
        common = min(_common_length(unique), min(len(p) for p in unique) - 1)
        if self._shared is not None:
            kept, layers = self._shared
            reuse = _common_length([kept, unique[0][:common]])
            if reuse >= MIN_SHARED_PREFIX:
                return kept[:reuse], [(k[:, :, :reuse], v[:, :, :reuse]) for k, v in layers]
        if len(unique) < 2 or common < MIN_SHARED_PREFIX:
            return (), []
        shared = unique[0][:common]
        out = self._model(
            input_ids=torch.tensor([shared], dtype=torch.long, device=self._device),
            position_ids=torch.arange(common, device=self._device)[None, :],
            use_cache=True,
            logits_to_keep=1,
        )
        self._shared = (shared, [(layer.keys, layer.values) for layer in out.cache.layers])
        return self._shared

    def _merge(self, cache: object | None, mask: torch.Tensor) -> None:
        """Append rows (their cache and mask) to the batch, left-padding the narrower side.
        A None `cache` stands for joining rows with nothing cached (one-token prompts)."""
        old_width, new_width = self._mask.shape[1], mask.shape[1]
        width = max(old_width, new_width)
        if self._cache is None:  # An empty batch: the joining rows are the batch.
            self._cache = cache
        else:
            new_layers = [None] * len(self._cache.layers) if cache is None else cache.layers
            for old, new in zip(self._cache.layers, new_layers, strict=True):
                old.keys = _cat_rows(old.keys, None if new is None else new.keys, len(mask), width)
                old.values = _cat_rows(
                    old.values, None if new is None else new.values, len(mask), width
                )
        self._mask = torch.cat(
            [
                torch.nn.functional.pad(self._mask, (width - old_width, 0)),
                torch.nn.functional.pad(mask, (width - new_width, 0)),
            ]
        )

    def _select(self, keep: list[int]) -> None:
        """Keep only these rows, then drop the leading columns no remaining row uses."""
        self._rows = [self._rows[i] for i in keep]
        self._widest = max((r.reserved for r in self._rows), default=0)
        self._widest = max([self._widest, *(r.reserved for r in self._joining)])
        if not self._rows:
            self._cache = None
            self._mask = self._mask.new_zeros((0, 0))
            self._pending = self._pending[:0]
            self._positions = self._positions[:0]
            return
        index = torch.tensor(keep, dtype=torch.long, device=self._device)
        mask = self._mask.index_select(0, index)
        used = mask.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else mask.shape[1]
        self._mask = mask[:, start:]
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:]
            layer.values = layer.values.index_select(0, index)[:, :, start:]
        self._pending = self._pending.index_select(0, index)
        self._positions = self._positions.index_select(0, index)


def _common_length(seqs: list[tuple[int, ...]]) -> int:
    """Length of the prefix all of `seqs` share: that of the lexicographically first and last
    (whatever they share, everything between them shares)."""
    low, high = min(seqs), max(seqs)
    for i, (a, b) in enumerate(zip(low, high, strict=False)):
        if a != b:
            return i
    return min(len(low), len(high))


def _repeat(layers: _KV, rows: int) -> DynamicCache | None:
    """A fresh cache holding `rows` copies of a batch-of-one prefix's keys and values, which
    the suffix prefill then extends without touching the kept original."""
    if not layers:
        return None
    return DynamicCache(
        [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in layers]
    )


def _cat_rows(old: torch.Tensor, new: torch.Tensor | None, n_new: int, width: int) -> torch.Tensor:
    """Cache rows (B, H, L, D) of the batch and of joining rows, left-padded to `width`.
    A None `new` stands for joining rows with nothing cached (all padding)."""
    if new is None:
        new = old.new_zeros((n_new, old.shape[1], 0, old.shape[3]))
    pad_old = width - old.shape[2]
    pad_new = width - new.shape[2]
    return torch.cat(
        [
            torch.nn.functional.pad(old, (0, 0, pad_old, 0)),
            torch.nn.functional.pad(new, (0, 0, pad_new, 0)),
        ]
    )
