"""The seeded Gumbel-max sampler: it samples softmax(z / T) exactly, and a row's draw depends
on its own seed, step and logits only."""

from __future__ import annotations

import torch

from futureworld.policy.sampling import gumbel_noise, sample_rows, step_key


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
