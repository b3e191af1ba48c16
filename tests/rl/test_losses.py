"""Decoupled PPO and SFT losses: hand-computed cases, invariants and a loop reference."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from futureworld.rl.config import LossAggregation, Objective, PolicyLoss, TrainConfig
from futureworld.rl.losses import (
    NORMALIZERS,
    OBJECTIVES,
    POLICY_LOSSES,
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


def test_registry_covers_every_policy_loss():
    assert set(POLICY_LOSSES) == set(PolicyLoss)
    assert POLICY_LOSSES[PolicyLoss.PPO_CLIP] is decoupled_ppo_loss


def test_step_normalizers_count_mask_tokens_or_a_constant_per_rollout():
    assert step_normalizer(37, 5, CONFIG) == 37
    constant = TrainConfig(loss_aggregation="constant", normalizer_tokens_per_rollout=12)
    assert step_normalizer(37, 5, constant) == 5 * 12
    assert step_normalizer(37, 5, TrainConfig(loss_aggregation="sequence_mean")) == 5


def _fixed_inputs(**kw) -> tuple[torch.Tensor, LossInputs]:
    """One row that clips above and below, caps w, rejects a token and masks one."""
    t = lambda x: torch.tensor([x], dtype=torch.float64)  # noqa: E731
    inputs = LossInputs(
        logp_prox=t([-0.7, -1.2, -2.0, -0.3, -1.5, -0.9, -2.4, -0.5]),
        logp_behaviour=t([-0.9, -1.0, -4.8, -0.3, -1.1, -0.2, -2.0, -0.6]),
        advantages=t([1.0, -0.5, 2.0, -1.5, 0.8, -0.3, 0.6, 1.2]),
        mask=torch.tensor([[True, True, True, True, True, False, True, True]]),
        logp_ref=t([-0.8, -1.0, -2.1, -0.4, -1.4, -1.0, -2.2, -0.5]),
        **kw,
    )
    return t([-0.2, -1.6, -1.9, -0.5, -1.0, -1.1, -2.4, -0.45]), inputs


@pytest.mark.parametrize(
    ("config", "loss", "grad"),
    [
        (
            TrainConfig(),
            -0.3558011350903814,
            [
                0.0,
                0.0,
                0.0,
                0.1754423042309961,
                0.0,
                0.0,
                -0.05745600394591194,
                -0.19917158446770566,
            ],
        ),
        (
            TrainConfig(kl_coef=0.1),
            -0.3491003696152856,
            [
                0.0064455480557996225,
                -0.011744554291292985,
                0.0,
                0.17393986254420113,
                0.004709713628062296,
                0.0,
                -0.06061890049105721,
                -0.198474861960573,
            ],
        ),
    ],
)
def test_default_objective_is_unchanged_on_a_fixed_input(config, loss, grad):
    # values recorded from decoupled_ppo_loss before the policy-loss registry existed
    assert config.policy_loss is PolicyLoss.PPO_CLIP
    logp, inputs = _fixed_inputs()
    logp.requires_grad_()
    out = OBJECTIVES[config.objective].loss(logp, inputs, config)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(loss, rel=1e-15, abs=0)
    assert logp.grad[0].tolist() == pytest.approx(grad, rel=1e-15, abs=1e-300)
    assert (out.sums["clip_low"], out.sums["clip_high"], out.sums["kept_tokens"]) == (1, 2, 6)


def test_asymmetric_clip_bounds_are_clip_low_below_and_clip_high_above():
    # ε_low = 0.1, ε_high = 0.5: r is clipped to [0.9, 1.5], on the side that would gain
    config = TrainConfig(clip_low=0.1, clip_high=0.5)
    r = [0.85, 0.85, 1.4, 1.6, 1.6]
    adv = [-1.0, 1.0, 1.0, 1.0, -1.0]
    inputs = _inputs(prox=[-1.0] * 5, mu=[-1.0] * 5, adv=adv, mask=[True] * 5)
    logp = torch.tensor([[-1.0 + math.log(x) for x in r]], dtype=torch.float64)
    logp.requires_grad_()
    out = decoupled_ppo_loss(logp, inputs, config)
    out.loss.backward()
    # ℓ = −min(rA, clip(r, 0.9, 1.5) A): 0.9 (clipped low), −0.85, −1.4, −1.5 (clipped high), 1.6
    expected = [-min(x * a, min(max(x, 0.9), 1.5) * a) for x, a in zip(r, adv, strict=True)]
    assert expected == pytest.approx([0.9, -0.85, -1.4, -1.5, 1.6])
    assert out.loss.item() == pytest.approx(sum(expected) / 5)
    # a clipped token has no gradient; the others get −r·A/N
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.85 / 5, -1.4 / 5, 0.0, 1.6 / 5])
    metrics = summarize_metrics(out.sums)
    assert (metrics["clip_low_fraction"], metrics["clip_high_fraction"]) == (0.2, 0.2)
    # the default bounds (0.8, 1.28) clip r = 1.4 too and leave r = 0.85 alone
    default = decoupled_ppo_loss(logp.detach(), inputs, CONFIG)
    assert float(default.loss) == pytest.approx((0.85 - 0.85 - 1.28 - 1.28 + 1.6) / 5)


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


def test_sampler_gap_is_the_mean_absolute_log_ratio_over_generated_tokens():
    # |log μ − log π_prox| = 0.5, 1.0, ln 20 (rejected, still a generated token), masked, 0
    inputs = _inputs(
        prox=[-1.0, -2.0, -1.0, -0.5, -0.7],
        mu=[-1.5, -1.0, -1.0 - math.log(20), -3.0, -0.7],
        adv=[1.0, 1.0, 1.0, 1.0, 1.0],
        mask=[True, True, True, False, True],
        entropy=torch.tensor([[0.3, 0.6, 0.9, 5.0, 1.2]], dtype=torch.float64),
    )
    logp = torch.tensor([[-1.0, -2.0, -1.0, -0.5, -0.7]], dtype=torch.float64)
    for objective in OBJECTIVES.values():
        out = objective.loss(logp, inputs, CONFIG)
        metrics = summarize_metrics(out.sums)
        assert out.sums["sampler_gap"] == pytest.approx(0.5 + 1.0 + math.log(20))
        assert metrics["sampler_gap"] == pytest.approx((1.5 + math.log(20)) / 4)
        # every step also reports the clip fraction and the entropy per generated token
        assert metrics["entropy"] == pytest.approx((0.3 + 0.6 + 0.9 + 1.2) / 4)
        assert "clip_fraction" in metrics
    ppo = summarize_metrics(decoupled_ppo_loss(logp, inputs, CONFIG).sums)
    assert (ppo["clip_fraction"], ppo["rejected_fraction"]) == (0.0, 0.25)


def test_summed_sampler_gaps_of_micro_batches_average_over_all_their_tokens():
    a = _inputs(prox=[-1.0, -1.0], mu=[-1.2, -0.4], adv=[0.0, 0.0], mask=[True, True])
    b = _inputs(prox=[-2.0], mu=[-2.0], adv=[0.0], mask=[True])
    sums = Counter()
    for inputs in (a, b):
        sums.update(decoupled_ppo_loss(inputs.logp_prox, inputs, CONFIG).sums)
    assert summarize_metrics(sums)["sampler_gap"] == pytest.approx((0.2 + 0.6 + 0.0) / 3)
