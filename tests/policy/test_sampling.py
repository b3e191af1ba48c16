"""The seeded Gumbel-max sampler: it samples softmax(z / T) exactly, and a row's draw depends
on its own seed, step and logits only."""

from __future__ import annotations

import torch

from futureworld.policy.sampling import gumbel_noise, sample_rows, step_key, uniform_from_bits


def test_draws_follow_the_tempered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -3.0])
    n = 40_000
    ids, logprobs = sample_rows(
        logits.expand(n, -1), torch.full((n,), 0.7), torch.ones(n), range(n), [0] * n
    )
    expected = torch.softmax(logits / 0.7, dim=-1)
    counts = torch.bincount(torch.tensor(ids), minlength=5).float() / n
    assert torch.allclose(counts, expected, atol=0.01)
    assert torch.allclose(torch.tensor(logprobs), expected.log()[torch.tensor(ids)], atol=1e-6)


def test_a_rows_draw_does_not_depend_on_the_batch_around_it():
    torch.manual_seed(0)
    logits = torch.randn(6, 300)
    temperatures, top_ps = torch.full((6,), 1.0), torch.tensor([1.0, 1.0, 0.9, 1.0, 0.5, 1.0])
    seeds, steps = [11, 12, 13, 14, 15, 16], [0, 3, 1, 0, 2, 9]
    batched, _ = sample_rows(logits, temperatures, top_ps, seeds, steps)
    alone = [
        sample_rows(logits[i : i + 1], temperatures[i : i + 1], top_ps[i : i + 1], [s], [k])[0][0]
        for i, (s, k) in enumerate(zip(seeds, steps, strict=True))
    ]
    assert batched == alone
    # Another step or seed is another draw: the noise is not reused.
    assert not torch.equal(
        gumbel_noise(torch.tensor([step_key(11, 0)]), 300),
        gumbel_noise(torch.tensor([step_key(11, 1)]), 300),
    )


def test_gumbel_noise_has_the_gumbel_moments():
    noise = gumbel_noise(torch.arange(200, dtype=torch.int64) * 7919, 2048)
    assert abs(noise.mean().item() - 0.5772) < 0.01
    assert abs(noise.std().item() - torch.pi / 6**0.5) < 0.01


def test_uniforms_stay_strictly_inside_the_unit_interval_at_the_extreme_bit_patterns():
    # Every hash value whose top 23 bits are all ones or all zeros, and single bits set.
    top = torch.arange(2**32 - 2**10, 2**32, dtype=torch.int64)
    bottom = torch.arange(0, 2**10, dtype=torch.int64)
    singles = torch.tensor([1 << b for b in range(32)], dtype=torch.int64)
    bits = torch.cat([top, bottom, singles])
    u = uniform_from_bits(bits)
    assert bool((u > 0).all()) and bool((u < 1).all())
    assert u.max().item() == 1 - 2**-24 and u.min().item() == 2**-24
    noise = u.log().neg().log().neg()
    assert bool(torch.isfinite(noise).all())
    # The largest noise any hash can give is about 16.6: a token of probability 9e-14
    # (log μ = −30) can never win against one of probability 0.5.
    assert noise.max().item() < 17


def test_no_key_forces_a_token_of_negligible_probability():
    # A 151,936-token vocabulary (Qwen2's) where one token holds almost all the mass: before
    # the fix about 0.9% of such draws picked a random token through +inf noise.
    # 8 × 64 draws find one with probability 1 − 0.991⁵¹² ≈ 99% if the bug came back.
    vocab, n = 151_936, 64
    logits = torch.full((n, vocab), -30.0)
    logits[:, 7] = 0.0
    for chunk in range(8):
        seeds = range(chunk * n, (chunk + 1) * n)
        ids, logprobs = sample_rows(logits, torch.ones(n), torch.ones(n), seeds, [3] * n)
        assert ids == [7] * n
        assert max(abs(lp) for lp in logprobs) < 1e-6
