"""CISPO, GSPO and KL-Cov: hand-computed cases, a slow loop reference for each, the rollout
segments of a packed row, and the surrogates reached through the config by a real update."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from futureworld.rl.batch import pack_trajectories
from futureworld.rl.config import Objective, PolicyLoss, TrainConfig
from futureworld.rl.forward import entropy_gradient, token_logprobs
from futureworld.rl.loss_terms import rollout_segments
from futureworld.rl.losses import OBJECTIVES, POLICY_LOSSES, LossInputs, summarize_metrics
from futureworld.rl.policy_losses import cispo_loss, gspo_loss, kl_cov_loss
from futureworld.rl.trainer import train_policy
from tests.rl.rl_builders import make_rollout, sample_rollouts

GSPO = TrainConfig(policy_loss="gspo", loss_aggregation="sequence_mean")


def _t(values) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.float64)


def _random_case(seed: int, shape=(2, 12)):
    gen = torch.Generator().manual_seed(seed)
    prox = -torch.rand(shape, generator=gen, dtype=torch.float64) * 3
    mu = prox + torch.randn(shape, generator=gen, dtype=torch.float64) * 1.0
    logp = prox + torch.randn(shape, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = torch.rand(shape, generator=gen) > 0.25
    return prox, mu, logp, adv, mask


# --- CISPO -----------------------------------------------------------------------------------


def test_cispo_hand_computed_keeps_the_gradient_of_a_clipped_token():
    # r = 1.5, 0.5, 1; π_prox/μ = 1, 3 (capped at C = 2), 1; A = 1, −1, 2
    prox = [-1.0, -1.0, -1.0]
    inputs = LossInputs(
        logp_prox=_t(prox),
        logp_behaviour=_t([-1.0, -1.0 - math.log(3), -1.0]),
        advantages=_t([1.0, -1.0, 2.0]),
        mask=torch.tensor([[True, True, True]]),
    )
    logp = _t([-1.0 + math.log(1.5), -1.0 + math.log(0.5), -1.0]).requires_grad_()
    out = cispo_loss(logp, inputs, TrainConfig(policy_loss="cispo"))
    out.loss.backward()
    # r̂ = clip(r, 0, 1.28) = 1.28, 0.5, 1 (no lower bound); ℓ = −w · r̂ · A · log π_θ
    lp = logp.detach()[0].tolist()
    expected = [-1 * 1.28 * 1 * lp[0], -2 * 0.5 * -1 * lp[1], -1 * 1.0 * 2 * lp[2]]
    assert out.loss.item() == pytest.approx(sum(expected) / 3)
    # ∇ = −w r̂ A / N: the token above 1 + ε_high still moves (PPO-clip would give it 0)
    assert logp.grad[0].tolist() == pytest.approx([-1.28 / 3, 1.0 / 3, -2.0 / 3])
    metrics = summarize_metrics(out.sums)
    assert (metrics["clip_high_fraction"], metrics["clip_low_fraction"]) == (1 / 3, 0)
    # with a lower bound 1 − 0.2 the second weight is 0.8 and counts as clipped below
    bounded = cispo_loss(logp.detach(), inputs, TrainConfig(cispo_clip_low=0.2))
    assert summarize_metrics(bounded.sums)["clip_low_fraction"] == pytest.approx(1 / 3)
    assert bounded.loss.item() == pytest.approx((expected[0] + 1.6 * lp[1] + expected[2]) / 3)


def test_cispo_matches_a_python_loop_reference():
    prox, mu, logp, adv, mask = _random_case(11)
    config = TrainConfig(policy_loss="cispo", cispo_clip_low=0.3, cispo_clip_high=0.2)
    logp = logp.requires_grad_()
    out = cispo_loss(logp, LossInputs(prox, mu, adv, mask), config)
    out.loss.backward()
    n = int(mask.sum())
    lp = logp.detach()
    total, grad, clipped = 0.0, torch.zeros_like(lp), 0
    for b in range(prox.shape[0]):
        for t in range(prox.shape[1]):
            if not mask[b, t] or math.exp(prox[b, t] - mu[b, t]) > config.reject_bound:
                continue
            r = math.exp(lp[b, t] - prox[b, t])
            r_hat = min(max(r, 0.7), 1.2)
            clipped += r_hat != r
            w = min(math.exp(prox[b, t] - mu[b, t]), 2.0)
            total += -w * r_hat * float(adv[b, t]) * float(lp[b, t])
            grad[b, t] = -w * r_hat * float(adv[b, t]) / n
    assert clipped > 0
    assert out.loss.item() == pytest.approx(total / n, rel=1e-12)
    torch.testing.assert_close(logp.grad, grad, rtol=1e-12, atol=1e-15)


# --- GSPO ------------------------------------------------------------------------------------


def test_rollout_segments_count_the_restarts_of_the_position_ids():
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 0, 1, 2]])
    assert rollout_segments(position_ids).tolist() == [
        [0, 0, 0, 1, 1, 2, 2, 2, 2],
        [0, 0, 0, 0, 0, 0, 1, 1, 1],
    ]


def test_gspo_hand_computed_clips_one_ratio_per_rollout():
    # two rollouts packed in one row; generated tokens 1, 2 (rollout 0) and 5, 6 (rollout 1)
    mask = torch.tensor([[False, True, True, False, False, True, True]])
    prox = _t([0.0, -1.0, -1.0, 0.0, 0.0, -1.0, -1.0])
    # rollout 1: log(π_prox/μ) = ln 4, 0 → w_1 = exp(mean) = 2; rollout 0 is on-policy
    mu = _t([0.0, -1.0, -1.0, 0.0, 0.0, -1.0 - math.log(4), -1.0])
    logp = prox + _t([0.0, 1e-3, 2e-4, 0.0, 0.0, -1e-4, -1e-4])
    adv = _t([0.0, 1.0, 1.0, 0.0, 0.0, -0.5, -0.5])
    inputs = LossInputs(
        prox,
        mu,
        adv,
        mask,
        normalizer=2.0,  # sequence_mean: N = the step's rollouts
        position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2]]),
    )
    logp.requires_grad_()
    out = gspo_loss(logp, inputs, GSPO)
    out.loss.backward()
    # s_0 = e^{6e-4} > 1 + 4e-4 with A > 0: clipped, ℓ_0 = −1.0004, no gradient
    # s_1 = e^{−1e-4} inside [1 − 3e-4, 1 + 4e-4]: ℓ_1 = −w_1 · s_1 · A_1 = s_1
    s_1 = math.exp(-1e-4)
    assert out.loss.item() == pytest.approx((-1.0004 + s_1) / 2, rel=1e-12)
    # ∂ℓ_1/∂log π_θ(t) = s_1 / |y_1| for each of its tokens, then / N
    expected = [0.0, 0.0, 0.0, 0.0, 0.0, s_1 / 2 / 2, s_1 / 2 / 2]
    assert logp.grad[0].tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)
    metrics = summarize_metrics(out.sums)
    assert (metrics["clip_high_fraction"], metrics["clip_low_fraction"]) == (0.5, 0)


def test_gspo_matches_the_sequence_level_objective_of_a_python_loop():
    # per-turn advantages differ inside a rollout: GSPO-token, one ratio per rollout
    prox, mu, logp, adv, mask = _random_case(5, shape=(2, 10))
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]])
    config = TrainConfig(
        policy_loss="gspo",
        loss_aggregation="sequence_mean",
        gspo_clip_low=0.05,
        gspo_clip_high=0.08,
        reject_bound=4.0,
    )
    inputs = LossInputs(prox, mu, adv, mask, normalizer=5.0, position_ids=position_ids)
    logp = logp.requires_grad_()
    out = gspo_loss(logp, inputs, config)
    out.loss.backward()

    reference = logp.detach().clone().requires_grad_()
    total = torch.zeros((), dtype=torch.float64)
    segments = rollout_segments(position_ids)
    for b in range(2):
        for seg in range(int(segments[b].max()) + 1):
            tokens = [t for t in range(10) if segments[b, t] == seg and mask[b, t]]
            kept = [t for t in tokens if math.exp(prox[b, t] - mu[b, t]) <= 4.0]
            if not kept:
                continue
            log_s = sum(reference[b, t] - prox[b, t] for t in kept) / len(kept)
            w = min(math.exp(sum(float(prox[b, t] - mu[b, t]) for t in kept) / len(kept)), 2.0)
            for t in kept:
                # value s_i, gradient s_i ∇log π_θ(t): s_it = sg(s_i) · π_θ(t) / sg(π_θ(t))
                s_it = torch.exp(log_s.detach() + reference[b, t] - reference[b, t].detach())
                a = float(adv[b, t])
                term = torch.minimum(s_it * a, s_it.clamp(0.95, 1.08) * a)
                total = total - w * term / len(tokens)
    (total / 5.0).backward()
    assert out.loss.item() == pytest.approx((total / 5.0).item(), rel=1e-12)
    torch.testing.assert_close(logp.grad, reference.grad, rtol=1e-10, atol=1e-14)
    assert 0 < float(out.sums["kept_tokens"]) < int(mask.sum())
    assert out.sums["clip_low"] > 0 and out.sums["clip_high"] > 0


def test_gspo_with_one_advantage_per_rollout_has_the_gradient_of_the_sequence_ratio():
    # the paper's form: loss = −(1/R) Σ_i min(s_i A_i, clip(s_i) A_i), s_i = exp(mean log r)
    prox, _, logp, _, _ = _random_case(8, shape=(1, 9))
    mask = torch.tensor([[False, True, True, True, False, True, True, True, True]])
    position_ids = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]])
    adv = _t([0.0, 0.7, 0.7, 0.7, 0.0, -1.3, -1.3, -1.3, -1.3])
    config = TrainConfig(policy_loss="gspo", loss_aggregation="sequence_mean", gspo_clip_high=1.0)
    inputs = LossInputs(prox, prox, adv, mask, normalizer=2.0, position_ids=position_ids)
    logp = logp.requires_grad_()
    gspo_loss(logp, inputs, config).loss.backward()

    reference = logp.detach().clone().requires_grad_()
    loss = torch.zeros((), dtype=torch.float64)
    for tokens, a in (([1, 2, 3], 0.7), ([5, 6, 7, 8], -1.3)):
        s = torch.exp(sum(reference[0, t] - prox[0, t] for t in tokens) / len(tokens))
        loss = loss - torch.minimum(s * a, s.clamp(1 - 3e-4, 2.0) * a) / 2
    loss.backward()
    torch.testing.assert_close(logp.grad, reference.grad, rtol=1e-10, atol=1e-14)


def test_gspo_refuses_a_row_without_position_ids():
    inputs = LossInputs(_t([-1.0]), _t([-1.0]), _t([1.0]), torch.tensor([[True]]))
    with pytest.raises(ValueError, match="position_ids"):
        gspo_loss(_t([-1.0]), inputs, GSPO)


# --- KL-Cov ----------------------------------------------------------------------------------


def _kl_cov_case():
    logp = _t([-0.5, -1.0, -2.0, -0.2, -1.5])
    d = [0.1, -0.2, 0.05, 0.3, 0.0]  # log r = log π_θ − log π_prox
    prox = logp - _t(d)
    inputs = LossInputs(prox, prox, _t([1.0, -1.0, 1.0, 1.0, 0.0]), torch.ones(1, 5, dtype=bool))
    return logp, inputs


def test_kl_cov_penalises_the_tokens_of_largest_covariance():
    # mean log π = −1.04, mean A = 0.4; Cov = 0.324, −0.056, −0.576, 0.504, 0.184
    logp, inputs = _kl_cov_case()
    config = TrainConfig(policy_loss="kl_cov", kl_cov_fraction=0.4, kl_cov_coef=0.5)
    logp.requires_grad_()
    out = kl_cov_loss(logp, inputs, config)
    out.loss.backward()
    # k·N = 2 tokens: t3 (0.504) and t0 (0.324) get β·|log r|; every token gets −r·A, no clip
    expected = [
        -math.exp(0.1) + 0.5 * 0.1,
        math.exp(-0.2),
        -math.exp(0.05),
        -math.exp(0.3) + 0.5 * 0.3,
        0.0,
    ]
    assert out.loss.item() == pytest.approx(sum(expected) / 5)
    grad = [-math.exp(0.1) + 0.5, math.exp(-0.2), -math.exp(0.05), -math.exp(0.3) + 0.5, 0.0]
    assert logp.grad[0].tolist() == pytest.approx([g / 5 for g in grad])
    # the default k = 0.2% still penalises one token per micro-batch: the largest, t3
    default = kl_cov_loss(logp.detach(), inputs, TrainConfig(policy_loss="kl_cov"))
    expected[0] = -math.exp(0.1)
    expected[3] = -math.exp(0.3) + 1.0 * 0.3
    assert default.loss.item() == pytest.approx(sum(expected) / 5)


def test_kl_cov_ranks_only_kept_tokens():
    # t4 would have the largest covariance but is rejected (π_prox/μ = 20 > 10): it neither
    # enters the means nor takes the one penalty, which goes to t3 as without it
    logp, inputs = _kl_cov_case()
    logp = torch.cat([logp, _t([3.0])], 1)
    prox = torch.cat([inputs.logp_prox, _t([3.0])], 1)
    inputs = LossInputs(
        prox,
        torch.cat([inputs.logp_behaviour, _t([3.0 - math.log(20)])], 1),
        torch.cat([inputs.advantages, _t([5.0])], 1),
        torch.ones(1, 6, dtype=bool),
    )
    config = TrainConfig(policy_loss="kl_cov", kl_cov_fraction=0.2, kl_cov_coef=0.5)
    out = kl_cov_loss(logp, inputs, config)
    expected = [-math.exp(0.1), math.exp(-0.2), -math.exp(0.05), -math.exp(0.3) + 0.15, 0.0]
    assert out.loss.item() == pytest.approx(sum(expected) / 6)
    assert out.sums["kept_tokens"] == 5


def test_kl_cov_matches_a_python_loop_reference():
    prox, mu, logp, adv, mask = _random_case(2, shape=(2, 15))
    config = TrainConfig(policy_loss="kl_cov", kl_cov_fraction=0.15, kl_cov_coef=0.7)
    out = kl_cov_loss(logp, LossInputs(prox, mu, adv, mask), config)
    kept = [
        (b, t)
        for b in range(2)
        for t in range(15)
        if mask[b, t] and math.exp(prox[b, t] - mu[b, t]) <= config.reject_bound
    ]
    lp_mean = sum(float(logp[k]) for k in kept) / len(kept)
    a_mean = sum(float(adv[k]) for k in kept) / len(kept)
    cov = {k: (float(logp[k]) - lp_mean) * (float(adv[k]) - a_mean) for k in kept}
    top = set(sorted(kept, key=lambda k: -cov[k])[: max(1, int(0.15 * len(kept)))])
    total = 0.0
    for k in kept:
        w = min(math.exp(prox[k] - mu[k]), 2.0)
        log_r = float(logp[k] - prox[k])
        total += w * (-math.exp(log_r) * float(adv[k]) + (0.7 * abs(log_r) if k in top else 0))
    assert len(top) == 3
    assert out.loss.item() == pytest.approx(total / int(mask.sum()), rel=1e-12)


# --- the registry through the config ---------------------------------------------------------


@pytest.mark.parametrize("policy_loss", list(PolicyLoss))
def test_the_decoupled_objective_runs_the_configured_policy_loss(policy_loss):
    prox, mu, logp, adv, mask = _random_case(4)
    aggregation = "sequence_mean" if policy_loss is PolicyLoss.GSPO else "token_mean"
    config = TrainConfig(policy_loss=policy_loss, loss_aggregation=aggregation)
    position_ids = torch.arange(12).repeat(2, 1) % 6
    inputs = LossInputs(prox, mu, adv, mask, normalizer=4.0, position_ids=position_ids)
    out = OBJECTIVES[config.objective].loss(logp, inputs, config)
    assert config.objective is Objective.DECOUPLED_PPO
    assert out.loss.item() == POLICY_LOSSES[policy_loss](logp, inputs, config).loss.item()
    assert set(out.sums) == {
        "mask_tokens",
        "kept_tokens",
        "kl_behaviour",
        "chi2",
        "sampler_gap",
        "entropy",
        "clip_low",
        "clip_high",
        "kl_ref",
    }


@pytest.mark.parametrize("policy_loss", [PolicyLoss.CISPO, PolicyLoss.KL_COV])
def test_an_update_trains_with_the_policy_loss_its_config_names(
    policy_loss, tiny_model_dir, tmp_path
):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    samples = sample_rollouts(
        model,
        [(1, 2, 3)],
        samples=4,
        completion_tokens=4,
        generator=torch.Generator().manual_seed(0),
    )
    rollouts = [
        make_rollout(sample_index=i, prompt=p, completion=c, logprobs=lp, reward=-sum(c) / 256)
        for i, (p, c, lp) in enumerate(samples)
    ]

    def first_steps(policy_loss: PolicyLoss) -> list[dict[str, float]]:
        config = TrainConfig(
            policy_loss=policy_loss, learning_rate=1e-2, ppo_epochs=2, precision="fp32"
        )
        seen: list[dict[str, float]] = []
        result = train_policy(
            tiny_model_dir,
            rollouts,
            config,
            tmp_path / str(policy_loss),
            on_step=lambda s, m: seen.append(m),
        )
        assert result.steps == 2
        return seen

    seen, ppo = first_steps(policy_loss), first_steps(PolicyLoss.PPO_CLIP)
    assert all(math.isfinite(m["loss"]) and m["grad_norm"] > 0 for m in seen)
    # the second epoch's ratios are off 1, where the surrogates differ from PPO-clip's
    assert seen[1]["kl_prox"] > 0
    assert seen[1]["loss"] != pytest.approx(ppo[1]["loss"])


# --- the entropy bonus -----------------------------------------------------------------------

OBJECTIVE_CONFIGS = {
    "ppo_clip": TrainConfig(),
    "cispo": TrainConfig(policy_loss="cispo"),
    "gspo": GSPO,
    "kl_cov": TrainConfig(policy_loss="kl_cov"),
    "sft": TrainConfig(estimator="sft"),
}


def _entropy_case(seed: int):
    prox, mu, logp, adv, mask = _random_case(seed)
    entropy = torch.rand(
        prox.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    position_ids = torch.arange(12).repeat(2, 1) % 6  # four rollouts of six tokens
    return prox, mu, logp, adv, mask, entropy * 3, position_ids


@pytest.mark.parametrize("name", sorted(OBJECTIVE_CONFIGS))
def test_the_entropy_bonus_subtracts_coef_times_the_entropy_of_each_kept_token(name):
    config = OBJECTIVE_CONFIGS[name]
    prox, mu, logp, adv, mask, entropy, position_ids = _entropy_case(6)
    objective = OBJECTIVES[config.objective]
    keep = objective.keep_mask(prox, mu, mask, config)
    assert 0 < int(keep.sum()) < int(mask.sum()) or config.objective is Objective.SFT

    def run(coef: float):
        lp = logp.clone().requires_grad_()
        h = entropy.clone().requires_grad_()
        inputs = LossInputs(
            prox, mu, adv, mask, entropy=h, normalizer=7.0, position_ids=position_ids
        )
        out = objective.loss(lp, inputs, replace(config, entropy_coef=coef))
        out.loss.backward()
        return out.loss.item(), lp.grad, h.grad

    base, base_grad, no_grad = run(0.0)
    assert no_grad is None  # off: the entropy is not part of the loss at all
    loss, grad, entropy_grad = run(0.05)
    # Hand computation: Σ_{t kept} s_t H_t / N, s_t = 1, or 1/|y_i| for GSPO's per-rollout terms
    bonus, want = 0.0, torch.zeros_like(entropy)
    for b in range(2):
        for t in range(12):
            if not keep[b, t]:
                continue
            rollout = slice(t - t % 6, t - t % 6 + 6)
            scale = 1 / int(mask[b, rollout].sum()) if name == "gspo" else 1.0
            bonus += scale * float(entropy[b, t])
            want[b, t] = -0.05 * scale / 7.0
    assert loss == pytest.approx(base - 0.05 * bonus / 7.0, rel=1e-12)
    torch.testing.assert_close(entropy_grad, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(grad, base_grad, rtol=0, atol=0)  # log π's own terms unchanged


@pytest.mark.parametrize("name", sorted(OBJECTIVE_CONFIGS))
def test_entropy_coef_zero_leaves_every_objective_bit_identical(name):
    config = OBJECTIVE_CONFIGS[name]
    prox, mu, logp, adv, mask, entropy, position_ids = _entropy_case(8)
    outs = []
    for h in (None, entropy.clone().requires_grad_()):
        lp = logp.clone().requires_grad_()
        inputs = LossInputs(
            prox, mu, adv, mask, entropy=h, normalizer=9.0, position_ids=position_ids
        )
        out = OBJECTIVES[config.objective].loss(lp, inputs, config)
        out.loss.backward()
        outs.append((out.loss.detach(), lp.grad))
    (loss_a, grad_a), (loss_b, grad_b) = outs
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)


def test_the_entropy_bonus_refuses_an_entropy_without_its_gradient():
    prox, mu, logp, adv, mask, entropy, _ = _entropy_case(2)
    config = TrainConfig(entropy_coef=0.1)
    lp = logp.clone().requires_grad_()
    with pytest.raises(ValueError, match="entropy_gradient"):
        OBJECTIVES[config.objective].loss(
            lp, LossInputs(prox, mu, adv, mask, entropy=entropy), config
        )
    with pytest.raises(ValueError, match=r"needs LossInputs\.entropy"):
        OBJECTIVES[config.objective].loss(lp, LossInputs(prox, mu, adv, mask), config)


@pytest.mark.parametrize("chunk", [3, 1024])
def test_the_forward_gives_the_entropy_its_gradient_only_when_asked(tiny_model_dir, chunk):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trajectories = [
        make_rollout(
            sample_index=i, prompt=(1, 2, 3 + i), completion=(4, 9, 6, 7, 11), mask=(1, 1, 0, 1, 1)
        ).trajectory
        for i in range(2)
    ]
    (row,) = pack_trajectories(trajectories, [np.zeros(5, dtype=np.float32)] * 2, 64)
    _, detached = token_logprobs(model, row, 0.8, chunk)
    assert not detached.requires_grad
    with entropy_gradient(True):
        _, entropy = token_logprobs(model, row, 0.8, chunk)
    model.zero_grad()
    entropy.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(entropy.detach(), detached, rtol=0, atol=0)
    # Reference: the entropy of each rollout's tempered next-token distributions, by a plain
    # forward of the rollout alone, summed over its generated tokens.
    model.zero_grad()
    for t in trajectories:
        ids = torch.tensor([list(t.prompt_token_ids) + list(t.completion_token_ids)])
        logp_all = (model(input_ids=ids).logits[0].float() / 0.8).log_softmax(-1)
        at = [len(t.prompt_token_ids) - 1 + c for c, m in enumerate(t.loss_mask) if m]
        (-(logp_all[at].exp() * logp_all[at]).sum()).backward()
    assert grads  # the head and the body both get gradient from the entropy
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_an_update_with_only_the_entropy_bonus_raises_the_entropy(tiny_model_dir, tmp_path):
    # Equal rewards: every advantage is 0, so the bonus is the whole loss, −coef · mean H.
    samples = sample_rollouts(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        [(1, 2, 3)],
        samples=4,
        completion_tokens=4,
        generator=torch.Generator().manual_seed(1),
    )
    rollouts = [
        make_rollout(sample_index=i, prompt=p, completion=c, logprobs=lp, reward=-0.25)
        for i, (p, c, lp) in enumerate(samples)
    ]

    def steps(coef: float) -> list[dict[str, float]]:
        config = TrainConfig(entropy_coef=coef, learning_rate=1e-3, ppo_epochs=3, precision="fp32")
        seen: list[dict[str, float]] = []
        train_policy(
            tiny_model_dir,
            rollouts,
            config,
            tmp_path / str(coef),
            on_step=lambda s, m: seen.append(m),
        )
        return seen

    without, with_bonus = steps(0.0), steps(1.0)
    assert all(m["grad_norm"] == 0 for m in without)  # nothing to learn without the bonus
    assert with_bonus[0]["loss"] == pytest.approx(-with_bonus[0]["entropy"], rel=1e-5)
    assert with_bonus[0]["entropy"] == pytest.approx(without[0]["entropy"], rel=1e-6)
    # each step starts from the weights the last one left: the entropy rises step by step
    # (4.1532, 4.1550, 4.1562 here, toward the uniform ln 64 = 4.1589), and stays put without
    assert with_bonus[2]["entropy"] > with_bonus[1]["entropy"] > with_bonus[0]["entropy"]
    assert without[2]["entropy"] == without[0]["entropy"]
    # sampled by the same weights: only numerics separate the sampler from the trainer
    assert all(0 <= m["sampler_gap"] < 1e-5 for m in without[:1])


def test_every_step_reports_the_sampler_gap_against_the_stored_log_probs(tiny_model_dir, tmp_path):
    # Stored log μ = −1 on every generated token (not what the model gives): the first step's
    # π_prox is the initial model, so the gap is the mean |−1 − log π_prox| over those tokens.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rollouts = [
        make_rollout(
            sample_index=i, prompt=(1, 2, 3), completion=(5 + i, 9, 2 * i + 1), reward=-0.1 * i
        )
        for i in range(3)
    ]
    gaps = []
    with torch.no_grad():
        for r in rollouts:
            t = r.trajectory
            ids = torch.tensor([list(t.prompt_token_ids) + list(t.completion_token_ids)])
            logp_all = model(input_ids=ids).logits[0].float().log_softmax(-1)
            for c, token in enumerate(t.completion_token_ids):
                gaps.append(abs(-1.0 - float(logp_all[len(t.prompt_token_ids) - 1 + c, token])))
    seen: list[dict[str, float]] = []
    config = TrainConfig(learning_rate=1e-3, precision="fp32")
    train_policy(
        tiny_model_dir, rollouts, config, tmp_path / "out", on_step=lambda s, m: seen.append(m)
    )
    assert seen and all("sampler_gap" in m for m in seen)
    assert seen[0]["sampler_gap"] == pytest.approx(sum(gaps) / len(gaps), rel=1e-5)
