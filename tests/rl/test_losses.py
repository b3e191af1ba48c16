"""Decoupled PPO and SFT losses: hand-computed cases, invariants and a loop reference."""

from __future__ import annotations

import math

import pytest
import torch

from futureworld.rl.config import LossAggregation, Objective, TrainConfig
from futureworld.rl.losses import (
    NORMALIZERS,
    OBJECTIVES,
    LossInputs,
    decoupled_ppo_loss,
    off_policy_mask,
    sft_loss,
    step_normalizer,
    summarize_metrics,
)

CONFIG = TrainConfig()


def _inputs(prox, mu, adv, mask, **kw):
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    return LossInputs(
        logp_prox=t(prox),
        logp_behaviour=t(mu),
        advantages=t(adv),
        mask=torch.tensor([mask], dtype=torch.bool),
        **kw,
    )


def test_registry_covers_every_objective():
    assert set(OBJECTIVES) == set(Objective)


def test_registry_covers_every_loss_aggregation():
    assert set(NORMALIZERS) == set(LossAggregation)


def test_step_normalizers_count_mask_tokens_or_a_constant_per_rollout():
    assert step_normalizer(37, 5, CONFIG) == 37
    constant = TrainConfig(loss_aggregation="constant", normalizer_tokens_per_rollout=12)
    assert step_normalizer(37, 5, constant) == 5 * 12


def test_on_policy_loss_equals_minus_mean_advantage():
    torch.manual_seed(0)
    logp = -torch.rand(2, 7, dtype=torch.float64)
    adv = torch.randn(2, 7, dtype=torch.float64)
    mask = torch.rand(2, 7) > 0.3
    inputs = LossInputs(logp_prox=logp, logp_behaviour=logp, advantages=adv, mask=mask)
    out = decoupled_ppo_loss(logp.clone(), inputs, CONFIG)
    assert float(out.loss) == pytest.approx(float(-(adv[mask]).mean()))
    metrics = summarize_metrics(out.sums)
    assert metrics["rejected_fraction"] == 0 and metrics["chi2"] == pytest.approx(0)
    assert metrics["kl_behaviour"] == pytest.approx(0)


def test_hand_computed_clipped_and_capped_tokens():
    # r = 1.5, 0.5, 1.0; π_prox/μ = 1, 3 (capped at C = 2), 0.5; A = 1, −1, 2
    inputs = _inputs(
        prox=[-1.0, -1.0, -1.0],
        mu=[-1.0, -1.0 - math.log(3), -1.0 + math.log(2)],
        adv=[1.0, -1.0, 2.0],
        mask=[True, True, True],
    )
    logp = torch.tensor([[-1.0 + math.log(1.5), -1.0 + math.log(0.5), -1.0]], dtype=torch.float64)
    out = decoupled_ppo_loss(logp, inputs, CONFIG)
    # ℓ = −1·min(1.5, 1.28), −2·min(−0.5, −0.8), −0.5·min(2, 2) = −1.28, 1.6, −1
    assert float(out.loss) == pytest.approx((-1.28 + 1.6 - 1.0) / 3)
    metrics = summarize_metrics(out.sums)
    assert metrics["clip_high_fraction"] == pytest.approx(1 / 3)
    assert metrics["clip_low_fraction"] == pytest.approx(1 / 3)
    assert metrics["clip_fraction"] == pytest.approx(2 / 3)
    # χ² = mean((π_prox/μ)²) − 1 = (1 + 9 + 0.25)/3 − 1
    assert metrics["chi2"] == pytest.approx(10.25 / 3 - 1)


def test_mask_zero_tokens_get_zero_gradient():
    torch.manual_seed(1)
    prox = -torch.rand(1, 9, dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1, 1, 0, 0, 1, 0, 1]], dtype=torch.bool)
    inputs = LossInputs(
        logp_prox=prox,
        logp_behaviour=prox - 0.1,
        advantages=torch.randn(1, 9, dtype=torch.float64),
        mask=mask,
    )
    logp = (prox + 0.05).requires_grad_()
    decoupled_ppo_loss(logp, inputs, CONFIG).loss.backward()
    assert torch.all(logp.grad[~mask] == 0)
    assert torch.all(logp.grad[mask] != 0)


def test_tokens_beyond_the_rejection_bound_are_masked_and_counted():
    inputs = _inputs(
        prox=[-1.0, -1.0], mu=[-1.0 - math.log(20), -1.0], adv=[5.0, 1.0], mask=[True, True]
    )
    logp = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    out = decoupled_ppo_loss(logp, inputs, CONFIG)
    # the rejected token leaves the sum but still counts in N (ARCHITECTURE §6)
    assert float(out.loss) == pytest.approx(-1.0 / 2)
    assert summarize_metrics(out.sums)["rejected_fraction"] == pytest.approx(0.5)


def test_rejecting_a_token_does_not_rescale_the_others():
    torch.manual_seed(4)
    prox = -torch.rand(1, 7, dtype=torch.float64) - 0.5
    adv = torch.randn(1, 7, dtype=torch.float64)
    mask = torch.ones(1, 7, dtype=torch.bool)
    on_policy = prox.clone()
    one_rejected = prox.clone()
    one_rejected[0, 3] -= math.log(50)  # π_prox/μ = 50 > reject_bound 10

    def grad(mu: torch.Tensor) -> torch.Tensor:
        logp = (prox + 0.01).requires_grad_()
        out = decoupled_ppo_loss(logp, LossInputs(prox, mu, adv, mask), CONFIG)
        out.loss.backward()
        rejected_fraction = summarize_metrics(out.sums)["rejected_fraction"]
        assert rejected_fraction == pytest.approx(1 / 7 if mu is one_rejected else 0)
        return logp.grad

    full, rejected = grad(on_policy), grad(one_rejected)
    others = torch.arange(7) != 3
    assert rejected[0, 3] == 0
    torch.testing.assert_close(rejected[0, others], full[0, others], rtol=1e-12, atol=0)
    # the old normaliser (kept tokens) would have scaled every other gradient by 7/6
    assert not torch.allclose(rejected[0, others], full[0, others] * 7 / 6)


def test_m2po_drops_the_largest_second_moments_until_the_mean_is_within_tau():
    # m2 = 0, 0.01, 0.04, 0.25: mean 0.075 > 0.04; without 0.25 the mean is 0.0167
    prox = torch.tensor([[0.0, 0.1, 0.2, 0.5, 0.3]])
    mask = torch.tensor([[True, True, True, True, False]])
    keep = off_policy_mask(prox, torch.zeros_like(prox), mask, TrainConfig(m2po_tau=0.04))
    assert keep.tolist() == [[True, True, True, False, False]]
    assert off_policy_mask(prox, torch.zeros_like(prox), mask, CONFIG).tolist() == mask.tolist()


def test_k3_penalty_to_the_reference_adds_kl_coef_times_k3():
    inputs = _inputs(
        prox=[-1.0], mu=[-1.0], adv=[0.0], mask=[True], logp_ref=torch.tensor([[-1.5]])
    )
    logp = torch.tensor([[-1.0]], dtype=torch.float64)
    out = decoupled_ppo_loss(logp, inputs, TrainConfig(kl_coef=0.1))
    k3 = math.exp(-0.5) + 0.5 - 1
    assert float(out.loss) == pytest.approx(0.1 * k3)


def test_sft_loss_is_minus_mean_logprob_of_generated_tokens():
    logp = torch.tensor([[-0.5, -2.0, -1.0]])
    inputs = LossInputs(
        logp_prox=logp,
        logp_behaviour=torch.zeros(1, 3),
        advantages=torch.ones(1, 3),
        mask=torch.tensor([[True, False, True]]),
    )
    assert float(sft_loss(logp, inputs, CONFIG).loss) == pytest.approx(0.75)


def test_normalizer_spreads_the_mean_over_the_whole_step_batch():
    logp = torch.zeros(1, 2, dtype=torch.float64)
    inputs = _inputs(
        prox=[0.0, 0.0], mu=[0.0, 0.0], adv=[1.0, 1.0], mask=[True, True], normalizer=8.0
    )
    assert float(decoupled_ppo_loss(logp, inputs, CONFIG).loss) == pytest.approx(-2 / 8)


def test_decoupled_ppo_matches_a_python_loop_reference():
    torch.manual_seed(3)
    shape = (3, 11)
    prox = -torch.rand(shape, dtype=torch.float64) * 3
    mu = prox + torch.randn(shape, dtype=torch.float64) * 1.2
    logp = prox + torch.randn(shape, dtype=torch.float64) * 0.3
    adv = torch.randn(shape, dtype=torch.float64)
    mask = torch.rand(shape) > 0.25
    config = TrainConfig(reject_bound=4.0)
    out = decoupled_ppo_loss(logp, LossInputs(prox, mu, adv, mask), config)
    total, count = 0.0, 0
    for b in range(shape[0]):
        for t in range(shape[1]):
            if not mask[b, t] or math.exp(prox[b, t] - mu[b, t]) > 4.0:
                continue
            r = math.exp(logp[b, t] - prox[b, t])
            w = min(math.exp(prox[b, t] - mu[b, t]), 2.0)
            a = float(adv[b, t])
            total += -w * min(r * a, min(max(r, 0.8), 1.28) * a)
            count += 1
    assert 0 < count < int(mask.sum())
    assert float(out.loss) == pytest.approx(total / int(mask.sum()), rel=1e-9)
