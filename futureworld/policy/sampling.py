"""Seeded per-row sampling for batched decoding: a row's tokens depend on its own seed and
logits only, never on which other rows share the batch.

A shared `torch.Generator` hands out random numbers in batch order, so a rollout's sample
would change with the batch around it. Here every draw is a Gumbel-max over noise that is a
pure function of (row seed, step, token id):

    x = argmax_k (log μ_k + g_k),   g_k = −log(−log u_k),   u_k = hash(key(seed, step), k)

which is an exact sample of μ (Gumbel 1954; Maddison et al. 2014, "A* sampling"). `hash` is a
Weyl sequence through a 32-bit integer finaliser (Wellons' hash-prospector constants), computed
in int64 without overflow, so it is bit-identical on every device and batch shape. A tiny
difference in logits between a batched and an unbatched forward can only flip the sample when
the two best perturbed scores lie within that difference of each other (about 1e-6), unlike
inverse-CDF sampling with one uniform per row, where every one of the V bucket edges counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
_WEYL32 = 0x9E3779B9
_MIX1 = 0x21F0AAAD
_MIX2 = 0x735A2D97
"""Both below 2³¹: a 32-bit value times either fits in int64, so nothing overflows."""


def step_key(seed: int, step: int) -> int:
    """A 32-bit key for draw `step` of a row seeded `seed` (splitmix64 of the pair)."""
    z = (seed * 0x9E3779B97F4A7C15 + (step + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 32


def gumbel_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel noise (B, V) from int64 keys (B,) in [0, 2³²): row b, token k gets
    −log(−log u) with u from hash(keys[b] + k·φ)."""
    tokens = torch.arange(vocab, dtype=torch.int64, device=keys.device) * _WEYL32
    x = keys[:, None] + tokens[None, :]
    x.bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 16)
    x.mul_(_MIX1).bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 15)
    x.mul_(_MIX2).bitwise_and_(_MASK32)
    x.bitwise_xor_(x >> 15)
    return uniform_from_bits(x).log_().neg_().log_().neg_()


def uniform_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """u strictly inside (0, 1) in float32 from int64 hash values in [0, 2³²).

    The top 23 bits pick one of 2²³ equal bins and u is the bin's midpoint, (j + ½)/2²³: every
    midpoint is exact in float32 (24 significant bits), so the largest is 1 − 2⁻²⁴ < 1 and the
    smallest 2⁻²⁴ > 0. With 24 bits the top midpoint 1 − 2⁻²⁵ would round to 1.0, −log(−log u)
    would be +inf, and that token would be chosen whatever its probability."""
    return (bits >> 9).to(torch.float32).add_(0.5).mul_(1.0 / 8_388_608.0)


def nucleus(logp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Log-probs renormalised over each row's smallest token set of mass >= top_p. (B, V),
    top_p (B,); rows with top_p = 1 come back unchanged."""
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_logp.exp()
    mass_before = probs.cumsum(-1) - probs
    sorted_logp = sorted_logp.masked_fill(mass_before >= top_p[:, None], float("-inf"))
    kept = torch.full_like(logp, float("-inf")).scatter(-1, order, sorted_logp)
    return torch.log_softmax(kept, dim=-1)


def sample_rows(
    logits: torch.Tensor,
    temperatures: torch.Tensor,
    top_ps: torch.Tensor,
    seeds: Sequence[int],
    steps: Sequence[int],
) -> tuple[list[int], list[float]]:
    """One token per row of `logits` (B, V) and its behaviour log-prob log μ(x), where
    μ = softmax(logits / T) (renormalised over the top-p nucleus when top_p < 1).

    Row b draws with key(seeds[b], steps[b]), so equal (seed, step, logits) give equal tokens
    whatever else is in the batch."""
    logp = torch.log_softmax(logits.float() / temperatures[:, None], dim=-1)
    truncated = top_ps < 1.0
    if bool(truncated.any()):
        rows = truncated.nonzero().squeeze(1)
        logp[rows] = nucleus(logp[rows], top_ps[rows])
    keys = torch.tensor(
        [step_key(seed, step) for seed, step in zip(seeds, steps, strict=True)],
        dtype=torch.int64,
        device=logits.device,
    )
    choice = (logp + gumbel_noise(keys, logp.shape[-1])).argmax(dim=-1, keepdim=True)
    chosen = logp.gather(1, choice)
    return choice.squeeze(1).tolist(), chosen.squeeze(1).tolist()
