"""Per-token log-probs of a packed row, projected to the vocabulary in chunks.

`token_logprobs` computes a row either packed (transformers turns restarting position ids
into a block-diagonal causal mask, so attention never crosses rollouts and no token is
padding) or, when that forwards fewer positions, as the rollouts' shared prefix once plus a
padded batch of their remainders (a group's G rollouts share their whole prompt, and with
short answers the prompt is most of every sequence), and projects to the vocabulary only at
generated positions, in chunks. The entropy it returns carries a gradient only inside
`entropy_gradient(True)` (an entropy bonus in the loss); otherwise it is a metric, computed
without one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache

from futureworld.rl.batch import PackedRow

_ENTROPY_GRADIENT: ContextVar[bool] = ContextVar("entropy_gradient", default=False)


@contextmanager
def entropy_gradient(enabled: bool) -> Iterator[None]:
    """Within it, `token_logprobs` returns the entropy with its gradient (when autograd is on).

    A context rather than an argument so that every forward path (the local one and the DDP
    module around it) honours it unchanged. Off, the entropy is a detached metric: its graph
    would hold a (generated tokens × vocabulary) tensor alive until the next micro-batch.
    """
    token = _ENTROPY_GRADIENT.set(enabled)
    try:
        yield
    finally:
        _ENTROPY_GRADIENT.reset(token)


def _backbone_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The transformer body and the LM head of a causal LM, looking through a peft wrapper."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.base_model, inner.get_output_embeddings()


def _chunk_logprobs(
    hidden: Tensor, targets: Tensor, head: nn.Module, temperature: float, entropy_grad: bool
) -> tuple[Tensor, Tensor]:
    """(N, H) hidden states, (N,) targets → log π(target), entropy; both (N,).

    The vocabulary projection runs in fp32 even under bf16 autocast: bf16 logits carry
    ~3 significant digits, enough noise in log π to swamp the π_θ/π_prox ratios near 1.
    `entropy_grad` is an argument, not read from the context here, so that activation
    checkpointing recomputes the same graph in backward.
    """
    with torch.autocast(hidden.device.type, enabled=False):
        logits = head(hidden.float())
    logp_all = (logits.float() / temperature).log_softmax(-1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    with torch.enable_grad() if entropy_grad else torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def token_logprobs(
    model: nn.Module,
    row: PackedRow,
    temperature: float,
    chunk_tokens: int,
    *,
    entropy_grad: bool | None = None,
) -> tuple[Tensor, Tensor]:
    """log π(target) at temperature T (logits / T) and the entropy of π; both (1, L).

    Only generated positions are projected to the vocabulary, `chunk_tokens` at a time.
    Under autograd with more than one chunk each chunk is recomputed in backward
    (activation checkpointing), so at most chunk_tokens × V logits exist at once.
    Non-generated positions hold 0. The entropy has a gradient when `entropy_grad` (None:
    inside `entropy_gradient(True)`) and autograd is on; else it is detached.
    """
    if entropy_grad is None:
        entropy_grad = _ENTROPY_GRADIENT.get()
    entropy_grad = entropy_grad and torch.is_grad_enabled()
    backbone, head = _backbone_and_head(model)
    hidden, index = _hidden_states(backbone, row)
    positions = row.mask[0].nonzero().squeeze(-1)
    h = hidden[index[positions]]
    targets = row.target_ids[0, positions]
    chunked = torch.is_grad_enabled() and len(positions) > chunk_tokens
    logps, entropies = [], []
    for start in range(0, len(positions), chunk_tokens):
        part = (
            h[start : start + chunk_tokens],
            targets[start : start + chunk_tokens],
            head,
            temperature,
            entropy_grad,
        )
        lp, ent = (
            checkpoint(_chunk_logprobs, *part, use_reentrant=False)
            if chunked
            else _chunk_logprobs(*part)
        )
        logps.append(lp)
        entropies.append(ent)
    length = row.num_tokens
    zeros = torch.zeros(length, device=hidden.device, dtype=torch.float32)
    if not logps:
        return zeros[None], zeros[None].detach()
    logp = zeros.index_put((positions,), torch.cat(logps))
    entropy = torch.cat(entropies)
    entropy = zeros.index_put((positions,), entropy if entropy_grad else entropy.detach())
    return logp[None], entropy[None]


def _hidden_states(backbone: nn.Module, row: PackedRow) -> tuple[Tensor, Tensor]:
    """The last hidden states of a row's tokens: (N, H) and, per packed position, the index
    of its state among the N.

    A row of one rollout is one forward. A row of several is computed the cheaper of two
    exact ways, by the token positions each forwards (attention cost aside):
    - packed: the row as it is, L positions; transformers turns restarting position ids into
      a block-diagonal causal mask (no KV cache, or attention would cross rollouts);
    - shared prefix: the leading tokens all its rollouts share (a group's prompt; at least
      the system turn of one agent's prompts) forwarded once, P positions, then every
      rollout's remainder as a right-padded batch on top of that prefix's keys and values,
      R × S positions. Gradients reach the prefix through each rollout's attention to it,
      so both ways compute the same function of the weights.
    """
    spans, shared, widest = _row_plan(row)
    if not widest:
        hidden = backbone(
            input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False
        ).last_hidden_state[0]
        return hidden, torch.arange(row.num_tokens, device=hidden.device)
    ids = row.input_ids[0]
    device = ids.device
    rest = torch.zeros((len(spans), widest), dtype=torch.long, device=device)
    for j, (start, end) in enumerate(spans):
        rest[j, : end - start - shared] = ids[start + shared : end]
    parts, cache = [], None
    if shared:
        out = backbone(input_ids=ids[None, :shared], use_cache=True)
        parts.append(out.last_hidden_state[0])
        cache = DynamicCache(
            [
                (
                    layer.keys.expand(len(spans), -1, -1, -1),
                    layer.values.expand(len(spans), -1, -1, -1),
                )
                for layer in out.cache.layers
            ]
        )
    # Right padding: a real token attends only to the prefix and the real tokens before it.
    out = backbone(
        input_ids=rest,
        position_ids=(shared + torch.arange(widest, device=device)).expand(len(spans), -1),
        cache=cache,
        use_cache=cache is not None,
    )
    parts.append(out.last_hidden_state.reshape(len(spans) * widest, -1))
    index = torch.empty(row.num_tokens, dtype=torch.long, device=device)
    for j, (start, end) in enumerate(spans):
        index[start : start + shared] = torch.arange(shared, device=device)
        index[start + shared : end] = (
            shared + j * widest + torch.arange(end - start - shared, device=device)
        )
    return torch.cat(parts), index


def _row_plan(row: PackedRow) -> tuple[list[tuple[int, int]], int, int]:
    """(rollout spans, shared prefix P, widest remainder S) of the shared-prefix way, or
    (spans, 0, 0) when the row is forwarded packed as it is (one rollout, or P + R·S ≥ L)."""
    starts = (row.position_ids[0] == 0).nonzero().squeeze(-1).tolist()
    spans = list(zip(starts, [*starts[1:], row.num_tokens], strict=True))
    if len(spans) == 1:
        return spans, 0, 0
    shared = _shared_prefix_length(row.input_ids[0], spans)
    widest = max(end - start for start, end in spans) - shared
    if shared + len(spans) * widest >= row.num_tokens:
        return spans, 0, 0
    return spans, shared, widest


def forwarded_positions(row: PackedRow) -> int:
    """Token positions the forward of `row` computes: P + R·S by the shared prefix, else L."""
    spans, shared, widest = _row_plan(row)
    return shared + len(spans) * widest if widest else row.num_tokens


def _shared_prefix_length(ids: Tensor, spans: Sequence[tuple[int, int]]) -> int:
    """Leading tokens every rollout of the row shares, leaving each at least one of its own."""
    shortest = min(end - start for start, end in spans) - 1
    first = ids[spans[0][0] : spans[0][0] + shortest]
    same = torch.ones(shortest, dtype=torch.bool, device=ids.device)
    for start, _ in spans[1:]:
        same &= ids[start : start + shortest] == first
    differs = (~same).nonzero()
    return int(differs[0]) if len(differs) else shortest
