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
every joining row, whose own suffix is then prefilled on top of it, at its true positions:
[shared prefix][padding][its suffix], the padding masked (and then packed away, below).
The stream keeps the last shared prefix, so a later admission whose prompts all extend it
(groups joining one at a time as earlier ones finish) prefills only suffixes. The stream
lives for one engine run, over fixed weights, so the kept prefix cannot go stale. The keys
and values are the same computation split in two, equal to a whole prefill to float rounding
(the engine's test against the one-at-a-time loop holds them to 1e-5).

Conversations: an agent's next turn is its last prompt, the tokens it generated and the tool's
observation, so its prompt begins with a finished row's tokens. A row that finishes leaves its
keys and values behind (`KeptConversations`, bounded by `max_kept_tokens`, rows already
continued first out), and a joining prompt that extends a kept row prefills only what follows
it: the observation, not the whole conversation again. Rows joining together prefill their
suffixes on top of their heads left-padded to the longest, [padding][its head][padding][its
suffix]; each row's columns are then packed to the right, so the batch is as wide as its
longest row and not its longest head plus its longest suffix. The kept keys are those the
decode steps computed, which equal a prefill's to float rounding, as the shared prefix's do.
An HTTP server does the same for itself (vLLM's automatic prefix caching); the rollout engine
only has to send each turn as its conversation so far, which it does for token fidelity anyway.

Admission is bounded by a token budget: rows × the widest row's reservation (its prompt plus
its `max_new_tokens`) must stay within `max_batch_tokens`, which bounds the padded cache, the
logits and the attention at every step; an empty batch takes any request. Sampling is
`futureworld.policy.sampling.sample_rows`: per-row seeds, so batching never changes a sample.
"""

from __future__ import annotations

import math
from collections import OrderedDict
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

KEPT_BLOCK = 16
"""Kept conversations are found by a hash chain over blocks of this many tokens."""

KEPT_PER_BATCH_TOKEN = 2
"""Kept tokens per token of the batch's budget, by default. The conversations waiting for
their next turn can be as many as the batch holds, each a turn longer than it was there: on
a research panel of 1920 three-turn rollouts (benchmarks/conversation_cache.py), 1x the
budget kept what 0.74-0.94x of the whole-conversation prefill needed again, 2x what an
unbounded store keeps (0.69-0.77x)."""


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
        max_kept_tokens: int | None = None,
    ) -> None:
        """`max_kept_tokens` bounds the finished rows' kept keys and values (default
        `KEPT_PER_BATCH_TOKEN` × `max_batch_tokens`; 0 keeps none)."""
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
        self.kept = KeptConversations(
            KEPT_PER_BATCH_TOKEN * max_batch_tokens if max_kept_tokens is None else max_kept_tokens
        )

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
        self.kept.clear()

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
                self._keep(index, row)
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
        pending input), one prefill per distinct prompt, on top of the longest kept
        conversation each extends, or else of a shared prefix's cache where they have one,
        and merge them into the batch."""
        prefixes: dict[tuple[int, ...], int] = {}
        which = [prefixes.setdefault(r.request.prompt[:-1], len(prefixes)) for r in joining]
        unique = list(prefixes)
        heads = self._heads(unique)
        suffixes = [p[n:] for p, (n, _) in zip(unique, heads, strict=True)]
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
            starts = torch.tensor([n for n, _ in heads], device=self._device)
            positions = starts[:, None] + (mask.cumsum(-1) - 1).clamp(min=0)
            past, past_mask = _stack_heads(heads, self._device)
            if past_mask is not None:
                mask = torch.cat([past_mask, mask], dim=1)
            out = self._model(
                input_ids=input_ids.to(self._device),
                attention_mask=mask,
                position_ids=positions,
                cache=past,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.cache
            mask = _compact(cache, mask)
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

    def _heads(self, unique: list[tuple[int, ...]]) -> list[tuple[int, _KV]]:
        """Per prompt, how many leading tokens are cached already and their keys and values
        (batch of one): the longest kept conversation it extends, else the prefix it shares
        with the others that extend none (`_shared_prefix`), else nothing."""
        found = [self.kept.longest(p) for p in unique]
        fresh = [p for p, f in zip(unique, found, strict=True) if f is None]
        shared, layers = self._shared_prefix(fresh) if fresh else ((), [])
        return [(len(shared), layers) if f is None else (len(f[0]), f[1]) for f in found]

    def _shared_prefix(self, unique: list[tuple[int, ...]]) -> tuple[tuple[int, ...], _KV]:
        """The leading tokens all of `unique` share (each keeping a suffix of at least one
        token) and their keys and values (batch of one): from the kept prefix, cut to what
        they share with it, when that is at least `MIN_SHARED_PREFIX` long; else prefilled
        now (and kept) when at least two prompts share that many; else nothing."""
        common = min(_common_length(unique), min(len(p) for p in unique) - 1)
        if common < MIN_SHARED_PREFIX:
            return (), []
        if self._shared is not None:
            kept, layers = self._shared
            reuse = _common_length([kept, unique[0][:common]])
            if reuse >= MIN_SHARED_PREFIX:
                return kept[:reuse], [(k[:, :, :reuse], v[:, :, :reuse]) for k, v in layers]
        if len(unique) < 2:
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

    def _keep(self, index: int, row: _Row) -> None:
        """Keep a finished row's keys and values: those of its prompt and every token it
        generated but the last, which was sampled and never forwarded."""
        if self.kept.max_tokens == 0:
            return
        tokens = (*row.request.prompt, *row.tokens[:-1])
        columns = self._mask[index].nonzero().squeeze(1)
        if len(columns) != len(tokens):
            raise AssertionError(f"row {row.request.key}: {len(columns)} cached, {len(tokens)}")
        self.kept.put(
            tokens,
            [
                (
                    layer.keys[index : index + 1, :, columns],
                    layer.values[index : index + 1, :, columns],
                )
                for layer in self._cache.layers
            ],
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


class KeptConversations:
    """Finished rows' keys and values by their tokens, found again by a prompt that extends
    them. At most `max_tokens` tokens are kept. Over that, rows a prompt has already extended
    go first (their conversation has moved on, and its next turn will be kept longer), then
    the longest-kept: with every row waiting for its next turn, least recently used would
    drop the rows whose turn comes next.

    A kept row is indexed by the hash chain of its whole blocks of `KEPT_BLOCK` tokens, so
    finding the longest kept row a prompt extends hashes the prompt's blocks once and
    compares tokens only with rows whose blocks match."""

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"max_kept_tokens must be >= 0, got {max_tokens}")
        self.max_tokens = max_tokens
        self.tokens = 0
        self.hits = 0
        """Prompts that found a kept row (a count for tests and benchmarks)."""
        self._rows: OrderedDict[tuple[int, ...], tuple[int, _KV]] = OrderedDict()
        """Each kept row's index key (its whole blocks' hash) and keys and values."""
        self._index: dict[int, list[tuple[int, ...]]] = {}

    def put(self, tokens: tuple[int, ...], layers: _KV) -> None:
        if len(tokens) < KEPT_BLOCK or len(tokens) > self.max_tokens or tokens in self._rows:
            return
        key = _block_hashes(tokens)[-1]
        self._rows[tokens] = (key, layers)
        self._index.setdefault(key, []).append(tokens)
        self.tokens += len(tokens)
        while self.tokens > self.max_tokens:
            oldest, (key, _) = self._rows.popitem(last=False)
            self._index[key].remove(oldest)
            if not self._index[key]:
                del self._index[key]
            self.tokens -= len(oldest)

    def longest(self, prompt: tuple[int, ...]) -> tuple[tuple[int, ...], _KV] | None:
        """The longest kept row `prompt` extends by at least one token, and its keys and values."""
        if not self._rows:
            return None
        hashes = _block_hashes(prompt)
        for blocks in range(len(hashes), 0, -1):
            matches = [
                t
                for t in self._index.get(hashes[blocks - 1], ())
                if len(t) < len(prompt) and prompt[: len(t)] == t
            ]
            if matches:
                tokens = max(matches, key=len)
                self._rows.move_to_end(tokens, last=False)  # first to go
                self.hits += 1
                return tokens, self._rows[tokens][1]
        return None

    def clear(self) -> None:
        self._rows.clear()
        self._index.clear()
        self.tokens = 0


def _block_hashes(tokens: tuple[int, ...]) -> list[int]:
    """The hash chain over `tokens`' whole blocks: entry j stands for the first j + 1 blocks."""
    chain, value = [], 0
    for start in range(0, len(tokens) - KEPT_BLOCK + 1, KEPT_BLOCK):
        value = hash((value, tokens[start : start + KEPT_BLOCK]))
        chain.append(value)
    return chain


def _stack_heads(
    heads: list[tuple[int, _KV]], device: torch.device
) -> tuple[DynamicCache | None, torch.Tensor | None]:
    """One cache for rows whose cached heads may differ: each head left-padded to the
    longest, with its mask; rows sharing one head (the shared prefix) share its tensors."""
    width = max(n for n, _ in heads)
    if width == 0:
        return None, None
    mask = torch.zeros((len(heads), width), dtype=torch.long, device=device)
    for i, (n, _) in enumerate(heads):
        if n:
            mask[i, width - n :] = 1
    first = heads[0][1]
    if all(layers is first and n == width for n, layers in heads):
        return _repeat(first, len(heads)), mask
    template = next(layers for n, layers in heads if n)
    stacked = []
    for depth, (k0, _) in enumerate(template):
        blank = k0.new_zeros((1, k0.shape[1], 0, k0.shape[3]))
        keys, values = [], []
        for n, layers in heads:
            k, v = layers[depth] if n else (blank, blank)
            k, v = k[:, :, :n], v[:, :, :n]
            keys.append(torch.nn.functional.pad(k, (0, 0, width - n, 0)))
            values.append(torch.nn.functional.pad(v, (0, 0, width - n, 0)))
        stacked.append((torch.cat(keys), torch.cat(values)))
    return DynamicCache(stacked), mask


def _compact(cache: DynamicCache, mask: torch.Tensor) -> torch.Tensor:
    """Move every row's cached columns to the right end, in order, dropping the columns no row
    uses (the padding between a row's head and its suffix); the rows' new mask. A key keeps
    its position (rotated in when it was computed), so only the mask says where it sits."""
    width = int(mask.sum(dim=1).max())
    if width == mask.shape[1]:
        return mask
    columns = torch.sort(mask, dim=1, stable=True).indices[:, mask.shape[1] - width :]
    for layer in cache.layers:
        index = columns[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
        layer.keys = layer.keys.gather(2, index)
        layer.values = layer.values.gather(2, index)
    return mask.gather(1, columns)


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
