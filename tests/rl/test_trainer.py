"""train_policy on a real tiny Qwen2: parameters move, LoRA stays in the adapter, stale data is
corrected, steps hold whole groups and accumulate exactly, log-probs are recomputed at the
rollouts' own temperature, KL anchors to the given base, checkpoints are atomic and resumable."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from futureworld.rl.checkpoints import checkpoint_sha256, load_policy
from futureworld.rl.config import Estimator, TrainConfig
from futureworld.rl.trainer import train_policy, train_sft
from tests.rl.rl_builders import make_rollout, sample_rollouts

FAST = TrainConfig(learning_rate=1e-2, micro_batch_tokens=32, groups_per_step=1, precision="fp32")


def _scored(model_dir: Path, *, groups: int = 2, group_size: int = 4, seed: int = 0, staleness=0):
    """Rollouts sampled from the model at `model_dir`, with rewards that prefer low token ids."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    gen = torch.Generator().manual_seed(seed)
    rollouts = []
    for q in range(groups):
        samples = sample_rollouts(
            model, [(1 + q, 2, 3)], samples=group_size, completion_tokens=4, generator=gen
        )
        for s, (prompt, completion, logp) in enumerate(samples):
            rollouts.append(
                make_rollout(
                    question_id=q,
                    sample_index=s,
                    prompt=prompt,
                    completion=completion,
                    mask=(1, 1, 0, 1),
                    logprobs=(logp[0], logp[1], 0.0, logp[3]),
                    reward=-sum(completion) / 256,
                    staleness=staleness,
                )
            )
    return rollouts


def _tensors(path: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(path / name))


def test_two_steps_change_every_parameter_of_full_fine_tuning(tiny_model_dir, tmp_path):
    seen = []
    result = train_policy(
        tiny_model_dir,
        _scored(tiny_model_dir),
        FAST,
        tmp_path / "v1",
        on_step=lambda step, metrics: seen.append((step, metrics)),
    )
    assert result.steps == 2 and [s for s, _ in seen] == [1, 2]
    for key in (
        "loss",
        "clip_low_fraction",
        "clip_high_fraction",
        "kl_behaviour",
        "chi2",
        "rejected_fraction",
        "staleness_mean",
        "staleness_max",
        "entropy",
        "grad_norm",
        "tokens_per_s",
    ):
        assert math.isfinite(seen[-1][1][key]), key
    before = _tensors(tiny_model_dir, "model.safetensors")
    after = _tensors(result.checkpoint_path, "model.safetensors")
    assert before.keys() == after.keys()
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == []
    assert result.checkpoint_sha256 == checkpoint_sha256(result.checkpoint_path)
    state = json.loads((result.checkpoint_path / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["config"]["estimator"] == "dr_grpo"


def test_lora_changes_only_the_adapter(tiny_model_dir, tmp_path):
    config = dataclasses.replace(FAST, lora=True, lora_rank=4)
    result = train_policy(tiny_model_dir, _scored(tiny_model_dir), config, tmp_path / "v1")
    assert not (result.checkpoint_path / "model.safetensors").exists()
    trained = _tensors(result.checkpoint_path, "adapter_model.safetensors")
    assert trained and all("lora_" in k for k in trained)
    torch.manual_seed(config.seed)  # the trainer seeds before creating the adapter
    initial = {
        k.replace(".default", ""): v
        for k, v in load_policy(tiny_model_dir, config).state_dict().items()
        if "lora_" in k
    }
    assert initial.keys() == trained.keys()
    assert all(not torch.equal(initial[k], trained[k]) for k in trained)
    optimizer = torch.load(result.checkpoint_path / "optimizer.pt", weights_only=True)
    assert len(optimizer["state"]) == len(trained)  # nothing but adapter weights was optimised


def _drifted(model_dir: Path, tmp_path: Path) -> Path:
    """A copy of the model with several versions' worth of drift, exaggerated."""
    old = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(5)
    with torch.no_grad():
        for p in old.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    old.save_pretrained(tmp_path / "drifted")
    return tmp_path / "drifted"


def test_stale_behaviour_data_stays_finite_and_reports_rejections(tiny_model_dir, tmp_path):
    rollouts = _scored(_drifted(tiny_model_dir, tmp_path), groups=3, group_size=4, staleness=6)
    seen = []
    result = train_policy(
        tiny_model_dir,
        rollouts,
        dataclasses.replace(FAST, reject_bound=3.0),
        tmp_path / "v7",
        on_step=lambda step, metrics: seen.append(metrics),
    )
    assert result.steps >= 1
    for metrics in seen:
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert metrics["staleness_mean"] == 6
    assert 0 < max(m["rejected_fraction"] for m in seen) < 1
    assert max(m["chi2"] for m in seen) > 0.1


def test_crash_while_checkpointing_leaves_no_checkpoint_at_the_target(tiny_model_dir, tmp_path):
    def crash(tmp_dir: Path) -> None:
        assert (tmp_dir / "model.safetensors").exists()
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        train_policy(tiny_model_dir, _scored(tiny_model_dir), FAST, tmp_path / "v1", on_save=crash)
    assert not (tmp_path / "v1").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]


def test_failed_rename_leaves_no_checkpoint_at_the_target(tiny_model_dir, tmp_path, monkeypatch):
    def failing_replace(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="rename failed"):
        train_policy(tiny_model_dir, _scored(tiny_model_dir), FAST, tmp_path / "v1")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base"]


def test_an_existing_target_is_refused_before_training(tiny_model_dir, tmp_path):
    (tmp_path / "v1").mkdir()
    with pytest.raises(FileExistsError, match="v1"):
        train_policy(tiny_model_dir, _scored(tiny_model_dir), FAST, tmp_path / "v1")


def test_resume_continues_weights_and_optimizer_state(tiny_model_dir, tmp_path):
    data = _scored(tiny_model_dir)
    # SFT: each of the 8 trajectories is a group of its own, 4 to a step
    config = dataclasses.replace(FAST, learning_rate=3e-3, groups_per_step=4)
    whole = train_sft(
        tiny_model_dir, data, dataclasses.replace(config, ppo_epochs=2), tmp_path / "a"
    )
    half = train_sft(tiny_model_dir, data, config, tmp_path / "b1")
    rest = train_sft(
        tiny_model_dir, data, config, tmp_path / "b2", resume_from=half.checkpoint_path
    )
    assert (whole.global_step, half.global_step, rest.global_step) == (4, 2, 4)
    a = _tensors(whole.checkpoint_path, "model.safetensors")
    b = _tensors(rest.checkpoint_path, "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    fresh = train_sft(half.checkpoint_path, data, config, tmp_path / "c")  # new optimizer state
    c = _tensors(fresh.checkpoint_path, "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_resume_keeps_the_moments_but_takes_the_new_learning_rate(tiny_model_dir, tmp_path):
    data = _scored(tiny_model_dir)
    first = train_sft(
        tiny_model_dir, data, dataclasses.replace(FAST, learning_rate=3e-3), tmp_path / "a"
    )
    slow = dataclasses.replace(FAST, learning_rate=1e-5, weight_decay=0.1)
    rest = train_sft(tiny_model_dir, data, slow, tmp_path / "b", resume_from=first.checkpoint_path)
    saved = torch.load(rest.checkpoint_path / "optimizer.pt", weights_only=True)
    assert {(g["lr"], g["weight_decay"]) for g in saved["param_groups"]} == {(1e-5, 0.1)}
    before = torch.load(first.checkpoint_path / "optimizer.pt", weights_only=True)
    steps = {float(v["step"]) for v in saved["state"].values()}
    assert steps == {float(v["step"]) + rest.steps for v in before["state"].values()}


def test_sft_accepts_bare_trajectories_and_lowers_their_loss(tiny_model_dir, tmp_path):
    trajectories = [r.trajectory for r in _scored(tiny_model_dir)]
    config = dataclasses.replace(FAST, ppo_epochs=5, groups_per_step=len(trajectories))
    result = train_sft(tiny_model_dir, trajectories, config, tmp_path / "v1")
    assert result.steps == 5
    assert result.groups_skipped == 0
    assert result.metrics[-1]["loss"] < result.metrics[0]["loss"]


def test_lr_decay_steps_the_learning_rate_linearly_to_zero(tiny_model_dir, tmp_path):
    """Step k of N trains at lr·(1 − k/N), k from 0 (the recorded `lr` is the step's own); the
    weights move less than at a constant rate; the saved optimiser ends at zero."""
    trajectories = [r.trajectory for r in _scored(tiny_model_dir)]
    config = dataclasses.replace(FAST, ppo_epochs=2, groups_per_step=2, lr_decay=True)
    decayed = train_sft(tiny_model_dir, trajectories, config, tmp_path / "decayed")
    assert decayed.steps == 8
    assert [m["lr"] for m in decayed.metrics] == pytest.approx(
        [1e-2 * (1 - k / 8) for k in range(8)]
    )
    saved = torch.load(decayed.checkpoint_path / "optimizer.pt", weights_only=True)
    assert {g["lr"] for g in saved["param_groups"]} == {0.0}
    constant = train_sft(
        tiny_model_dir, trajectories, dataclasses.replace(config, lr_decay=False), tmp_path / "c"
    )
    assert {m["lr"] for m in constant.metrics} == {1e-2}
    base = _tensors(tiny_model_dir, "model.safetensors")
    moved = {
        name: sum(
            (_tensors(r.checkpoint_path, "model.safetensors")[name] - w).norm().item()
            for name, w in base.items()
        )
        for name, r in (("decayed", decayed), ("constant", constant))
    }
    assert 0 < moved["decayed"] < moved["constant"]
    # a call resumed from a decayed one decays from its own peak, not the saved one
    again = dataclasses.replace(config, learning_rate=3e-3)
    resumed = train_sft(
        tiny_model_dir, trajectories, again, tmp_path / "r", resume_from=decayed.checkpoint_path
    )
    assert [m["lr"] for m in resumed.metrics] == pytest.approx(
        [3e-3 * (1 - k / 8) for k in range(8)]
    )


def test_sft_on_packed_demonstrations_equals_a_row_each(tiny_model_dir, tmp_path):
    trajectories = [r.trajectory for r in _scored(tiny_model_dir)]
    config = dataclasses.replace(FAST, ppo_epochs=2, groups_per_step=len(trajectories))
    apart = train_sft(tiny_model_dir, trajectories, config, tmp_path / "apart")
    packed = train_sft(
        tiny_model_dir,
        trajectories,
        dataclasses.replace(config, pack_single_rollouts=True),
        tmp_path / "packed",
    )
    assert packed.metrics[0]["rows"] < apart.metrics[0]["rows"]
    for a, b in zip(apart.metrics, packed.metrics, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4, abs=1e-6)
    one = _tensors(apart.checkpoint_path, "model.safetensors")
    two = _tensors(packed.checkpoint_path, "model.safetensors")
    for name, weight in one.items():
        torch.testing.assert_close(two[name], weight, rtol=1e-4, atol=1e-5)


def test_rl_training_refuses_unscored_trajectories(tiny_model_dir, tmp_path):
    trajectories = [r.trajectory for r in _scored(tiny_model_dir)]
    with pytest.raises(TypeError, match="ScoredRollout"):
        train_policy(tiny_model_dir, trajectories, FAST, tmp_path / "v1")


def test_training_is_deterministic_on_cpu(tiny_model_dir, tmp_path):
    data = _scored(tiny_model_dir)
    config = dataclasses.replace(FAST, estimator=Estimator.RLOO, m2po_tau=0.04)
    one = train_policy(tiny_model_dir, data, config, tmp_path / "one")
    two = train_policy(tiny_model_dir, data, config, tmp_path / "two")
    a = _tensors(one.checkpoint_path, "model.safetensors")
    b = _tensors(two.checkpoint_path, "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_lora_kl_penalty_measures_distance_from_the_base_without_adapter(tiny_model_dir, tmp_path):
    config = dataclasses.replace(FAST, lora=True, lora_rank=4, kl_coef=0.1)
    result = train_policy(tiny_model_dir, _scored(tiny_model_dir), config, tmp_path / "v1")
    assert result.metrics[0]["kl_ref"] == pytest.approx(0, abs=1e-7)  # LoRA B starts at 0
    assert result.metrics[1]["kl_ref"] > 0


def test_kl_penalty_to_a_separate_reference_model(tiny_model_dir, tmp_path):
    from tests.rl.rl_builders import build_tiny_model

    reference = build_tiny_model(tmp_path / "ref", seed=9)
    config = dataclasses.replace(FAST, kl_coef=0.1)
    result = train_policy(
        tiny_model_dir, _scored(tiny_model_dir), config, tmp_path / "v1", reference_dir=reference
    )
    assert result.metrics[0]["kl_ref"] > 1e-3
    state = json.loads((result.checkpoint_path / "trainer_state.json").read_text())
    assert state["reference"] == str(reference)


def test_kl_without_a_reference_is_refused_not_anchored_to_pi_prox(tiny_model_dir, tmp_path):
    config = dataclasses.replace(FAST, kl_coef=0.1)
    with pytest.raises(ValueError, match="needs a reference policy"):
        train_policy(tiny_model_dir, _scored(tiny_model_dir), config, tmp_path / "v1")
    assert not (tmp_path / "v1").exists()


def test_kl_to_the_base_is_positive_once_the_weights_have_moved(tiny_model_dir, tmp_path):
    v1 = train_policy(tiny_model_dir, _scored(tiny_model_dir), FAST, tmp_path / "v1")
    config = dataclasses.replace(FAST, kl_coef=0.1)
    data = _scored(tiny_model_dir, seed=1)
    from_base = train_policy(
        tiny_model_dir, data, config, tmp_path / "v2a", reference_dir=tiny_model_dir
    )
    assert from_base.metrics[0]["kl_ref"] == pytest.approx(0, abs=1e-7)  # π_θ = base at first
    moved = train_policy(
        v1.checkpoint_path, data, config, tmp_path / "v2b", reference_dir=tiny_model_dir
    )
    assert moved.metrics[0]["kl_ref"] > 1e-4


def test_resuming_lora_training_from_a_full_checkpoint_is_refused(tiny_model_dir, tmp_path):
    data = _scored(tiny_model_dir)
    full = train_policy(tiny_model_dir, data, FAST, tmp_path / "v1")
    lora = dataclasses.replace(FAST, lora=True)
    with pytest.raises(ValueError, match="full fine-tuning checkpoint"):
        train_policy(tiny_model_dir, data, lora, tmp_path / "v2", resume_from=full.checkpoint_path)
    assert not (tmp_path / "v2").exists()


def test_token_ids_outside_the_vocabulary_are_refused(tiny_model_dir, tmp_path):
    data = [make_rollout(sample_index=i, completion=(4, 5, 999), reward=-i) for i in range(2)]
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        train_policy(tiny_model_dir, data, FAST, tmp_path / "v1")


def _with_sampling(rollouts, **sampling):
    return [
        dataclasses.replace(r, trajectory=dataclasses.replace(r.trajectory, sampling=sampling))
        for r in rollouts
    ]


def test_log_probs_are_recomputed_at_the_rollouts_stored_temperature(tiny_model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    gen = torch.Generator().manual_seed(3)
    data = []
    for q in range(2):
        samples = sample_rollouts(
            model, [(1 + q, 2, 3)], samples=4, completion_tokens=4, generator=gen, temperature=0.7
        )
        for s, (prompt, completion, logp) in enumerate(samples):
            rollout = make_rollout(
                question_id=q,
                sample_index=s,
                prompt=prompt,
                completion=completion,
                logprobs=logp,
                reward=-sum(completion) / 256,
            )
            data.append(rollout)
    data = _with_sampling(data, temperature=0.7, top_p=1.0)
    seen = []
    result = train_policy(
        tiny_model_dir, data, FAST, tmp_path / "v1", on_step=lambda s, m: seen.append(m)
    )
    # μ and π_prox agree token for token only when π_prox is taken at T = 0.7
    assert seen[0]["kl_behaviour"] == pytest.approx(0, abs=1e-6)
    assert seen[0]["rejected_fraction"] == 0
    state = json.loads((result.checkpoint_path / "trainer_state.json").read_text())
    assert state["config"]["temperature"] == 0.7
    with pytest.raises(
        ValueError, match=r"sampled at temperature 0\.7 .* recompute log-probs at 1"
    ):
        train_policy(
            tiny_model_dir, data, dataclasses.replace(FAST, temperature=1.0), tmp_path / "v1b"
        )


def test_a_batch_mixing_temperatures_is_refused_naming_the_rollouts(tiny_model_dir, tmp_path):
    data = _scored(tiny_model_dir)
    data = _with_sampling(data[:4], temperature=1.0) + _with_sampling(data[4:], temperature=0.7)
    with pytest.raises(ValueError, match="mixes sampling temperatures") as error:
        train_policy(tiny_model_dir, data, FAST, tmp_path / "v1")
    assert data[0].trajectory.idempotency_key in str(error.value)
    assert data[4].trajectory.idempotency_key in str(error.value)
    assert not (tmp_path / "v1").exists()


@pytest.mark.parametrize(
    ("setting", "shown"), [({"top_p": 0.9}, "top_p=0.9"), ({"top_k": 40}, "top_k=40")]
)
def test_truncated_sampling_is_refused_naming_the_rollouts(
    tiny_model_dir, tmp_path, setting, shown
):
    data = _scored(tiny_model_dir)
    data = _with_sampling(data[:2], temperature=1.0, **setting) + _with_sampling(
        data[2:], temperature=1.0, top_p=1.0, top_k=-1
    )
    with pytest.raises(ValueError, match="cannot reproduce") as error:
        train_policy(tiny_model_dir, data, FAST, tmp_path / "v1")
    message = str(error.value)
    assert message.startswith("2 rollouts") and shown in message
    assert all(r.trajectory.idempotency_key in message for r in data[:2])
    assert data[2].trajectory.idempotency_key not in message


def test_sft_trains_at_the_configured_temperature_whatever_was_stored(tiny_model_dir, tmp_path):
    data = [r.trajectory for r in _with_sampling(_scored(tiny_model_dir), top_p=0.5)]
    result = train_sft(tiny_model_dir, data, FAST, tmp_path / "v1")
    state = json.loads((result.checkpoint_path / "trainer_state.json").read_text())
    assert state["config"]["temperature"] == 1.0


def test_every_step_holds_whole_groups_in_replay_order(tiny_model_dir, tmp_path):
    data = _scored(tiny_model_dir, groups=5, group_size=3)
    seen = []
    config = dataclasses.replace(FAST, groups_per_step=2, micro_batch_tokens=8)
    result = train_policy(
        tiny_model_dir, data, config, tmp_path / "v1", on_step=lambda s, m: seen.append(m)
    )
    assert result.steps == 3  # groups (0, 1), (2, 3), (4); one rollout a row
    assert [(m["groups"], m["rollouts"]) for m in seen] == [(2, 6), (2, 6), (1, 3)]


def _step_gradient(model_dir: Path, rollouts, config: TrainConfig):
    """The gradient one train_step accumulates (nothing clipped, nothing stepped), and the
    step's metrics."""
    from futureworld.rl.advantages import compute_advantages
    from futureworld.rl.batch import pack_steps
    from futureworld.rl.sampling import check_sampling
    from futureworld.rl.trainer import frozen_logprobs, train_step

    config = check_sampling([r.trajectory for r in rollouts], config)
    model = load_policy(model_dir, config)
    adv = compute_advantages(rollouts, config)
    [step] = pack_steps(
        [r.trajectory for r in adv.rollouts],
        adv.token_advantages,
        adv.group_sizes,
        config.groups_per_step,
        config.micro_batch_tokens,
    )
    rows = list(step.rows)
    prox = frozen_logprobs(model, rows, config)
    rows = [dataclasses.replace(r, logp_prox=p) for r, p in zip(rows, prox, strict=True)]
    metrics = train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), rows, config).metrics
    return {n: p.grad.clone() for n, p in model.named_parameters()}, metrics


def test_accumulated_step_gradient_equals_the_gradient_of_one_batch(tiny_model_dir, tmp_path):
    # 8 stale rollouts of 7 tokens: rejection and M2PO must decide over the step, and the
    # normaliser count the step's loss-mask tokens, for the micro-batches to add up
    data = _scored(_drifted(tiny_model_dir, tmp_path), groups=2, group_size=4)
    config = dataclasses.replace(
        FAST, groups_per_step=2, m2po_tau=0.5, reject_bound=3.0, max_grad_norm=1e9
    )
    one_batch, metrics = _step_gradient(
        tiny_model_dir, data, dataclasses.replace(config, micro_batch_tokens=64)
    )
    one_rollout_a_row, _ = _step_gradient(
        tiny_model_dir, data, dataclasses.replace(config, micro_batch_tokens=1)
    )
    assert 0 < metrics["rejected_fraction"] < 1
    assert any(float(g.abs().max()) > 1e-4 for g in one_batch.values())
    for name, grad in one_batch.items():
        torch.testing.assert_close(one_rollout_a_row[name], grad, rtol=1e-4, atol=1e-7)


def test_grad_accumulation_over_micro_batches_equals_one_packed_batch(tiny_model_dir, tmp_path):
    # the same through whole updates: metrics and the weights AdamW moves to
    data = _scored(_drifted(tiny_model_dir, tmp_path), groups=2, group_size=4)
    config = dataclasses.replace(FAST, m2po_tau=0.5, groups_per_step=2)
    one_row = train_policy(
        tiny_model_dir, data, dataclasses.replace(config, micro_batch_tokens=64), tmp_path / "a"
    )
    accumulated = train_policy(
        tiny_model_dir, data, dataclasses.replace(config, micro_batch_tokens=14), tmp_path / "b"
    )
    assert one_row.steps == accumulated.steps == 1
    a = _tensors(one_row.checkpoint_path, "model.safetensors")
    b = _tensors(accumulated.checkpoint_path, "model.safetensors")
    first, second = one_row.metrics[0], accumulated.metrics[0]
    assert first["loss"] == pytest.approx(second["loss"], abs=1e-6)
    assert first["grad_norm"] == pytest.approx(second["grad_norm"], rel=1e-5)
    assert 0 < first["rejected_fraction"] == second["rejected_fraction"] < 1
    # Adam divides by √v, so near-zero gradients amplify float noise: 1% of a step is allowed
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-4, rtol=0)


def test_lora_training_continues_the_adapter_of_the_previous_version(tiny_model_dir, tmp_path):
    config = dataclasses.replace(FAST, lora=True, lora_rank=4)
    v1 = train_policy(tiny_model_dir, _scored(tiny_model_dir), config, tmp_path / "v1")
    v2 = train_policy(
        tiny_model_dir,
        _scored(tiny_model_dir, seed=1),
        config,
        tmp_path / "v2",
        adapter_dir=v1.checkpoint_path,
    )
    # v1's adapter is already non-zero, so π_prox differs from the base and the update moves it on
    before = _tensors(v1.checkpoint_path, "adapter_model.safetensors")
    after = _tensors(v2.checkpoint_path, "adapter_model.safetensors")
    assert before.keys() == after.keys()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert v2.global_step == 2  # a new version starts a new optimizer and step count


def test_an_update_stops_before_the_step_that_exceeds_max_kl_prox(tiny_model_dir, tmp_path):
    """PPO's target KL: each step reports its KL to π_prox; with max_kl_prox set, the update
    ends before the first step over it, having taken exactly the steps before it."""
    scored = _scored(tiny_model_dir, groups=4)
    config = dataclasses.replace(FAST, learning_rate=5e-2)
    free = train_policy(tiny_model_dir, scored, config, tmp_path / "free")
    kls = [m["kl_prox"] for m in free.metrics]
    assert len(kls) == 4 and kls[0] == pytest.approx(0.0, abs=1e-6) and max(kls[1:]) > 0
    bound = max(kls[1:]) / 2
    first_over = next(i for i, kl in enumerate(kls) if kl > bound)
    stopped = train_policy(
        tiny_model_dir,
        scored,
        dataclasses.replace(config, max_kl_prox=bound),
        tmp_path / "stopped",
    )
    assert stopped.steps == first_over
    assert [m["kl_prox"] for m in stopped.metrics] == pytest.approx(kls[:first_over])
    with pytest.raises(ValueError, match="max_kl_prox"):
        TrainConfig(max_kl_prox=0.0)
