"""The update learns: a synthetic forecasting task whose true probabilities are known.

Prompt = [BOS, cue]; each of 4 cues has a true P(yes) in {0.1, 0.4, 0.6, 0.9}. The answer is
one token: bucket k (ids 0..10) means p = k/10; any other token is unparseable (reward −1.25).
Each round samples G answers per question from the current policy, draws outcomes from the
true p, rewards −(p − y)², and trains with dr_grpo from the previous round's checkpoint.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from futureworld.rl.config import TrainConfig
from futureworld.rl.trainer import train_policy
from tests.rl.rl_builders import build_tiny_model, make_rollout, sample_rollouts

BUCKETS = 11
CUES = {11: 0.1, 12: 0.4, 13: 0.6, 14: 0.9}
BOS = 15
UNPARSEABLE = -1.25


def _reward(token: int, y: float) -> float:
    return -((token / 10 - y) ** 2) if token < BUCKETS else UNPARSEABLE


def _expected_loss(token: int, p: float) -> float:
    """E_y[−reward] under the TRUE p: (q − p)² + p(1 − p) for a bucket."""
    return (token / 10 - p) ** 2 + p * (1 - p) if token < BUCKETS else -UNPARSEABLE


def _answer_distribution(model_dir: Path) -> dict[int, np.ndarray]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        ids = torch.tensor([[BOS, cue] for cue in CUES])
        probs = model(input_ids=ids).logits[:, -1].float().softmax(-1).numpy()
    return {cue: probs[i] for i, cue in enumerate(CUES)}


def _sampled_answers(model_dir: Path, rng: np.random.Generator, n: int) -> list[tuple[int, float]]:
    """n (answer token, true p) pairs per cue, answers sampled from the policy."""
    out = []
    for cue, probs in _answer_distribution(model_dir).items():
        out += [(int(t), CUES[cue]) for t in rng.choice(len(probs), size=n, p=probs / probs.sum())]
    return out


def _bootstrap_low(before: np.ndarray, after: np.ndarray, rng: np.random.Generator) -> float:
    """2.5th percentile of the bootstrap distribution of mean(before) − mean(after)."""
    diffs = [
        rng.choice(before, len(before)).mean() - rng.choice(after, len(after)).mean()
        for _ in range(500)
    ]
    return float(np.percentile(diffs, 2.5))


def _exact_loss(model_dir: Path) -> float:
    dist = _answer_distribution(model_dir)
    return float(
        np.mean(
            [sum(p * _expected_loss(t, CUES[c]) for t, p in enumerate(d)) for c, d in dist.items()]
        )
    )


def _round(model_dir: Path, round_index: int, out: Path, config: TrainConfig) -> Path:
    gen = torch.Generator().manual_seed(1000 + round_index)
    rng = np.random.default_rng(round_index)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rollouts = []
    questions_per_cue, group = 12, 8
    for cue, p in CUES.items():
        samples = sample_rollouts(
            model,
            [(BOS, cue)] * questions_per_cue,
            samples=group,
            completion_tokens=1,
            generator=gen,
        )
        for q in range(questions_per_cue):
            y = float(rng.random() < p)
            question_id = cue * 1000 + q
            for s, (prompt, completion, logp) in enumerate(samples[q * group : (q + 1) * group]):
                rollouts.append(
                    make_rollout(
                        question_id=question_id,
                        sample_index=s,
                        prompt=prompt,
                        completion=completion,
                        logprobs=logp,
                        reward=_reward(completion[0], y),
                        outcome_value=y,
                        policy_version=round_index,
                    )
                )
    result = train_policy(model_dir, rollouts, config, out)
    assert result.groups_used == len(CUES) * questions_per_cue
    return result.checkpoint_path


def test_dr_grpo_lowers_expected_brier_against_the_true_probabilities(tmp_path):
    base = build_tiny_model(tmp_path / "v0", vocab=16, hidden=32, seed=0)
    config = TrainConfig(learning_rate=2e-2, micro_batch_tokens=512, ppo_epochs=2, precision="fp32")
    current = base
    for r in range(10):
        current = _round(current, r, tmp_path / f"v{r + 1}", dataclasses.replace(config, seed=r))
    rng = np.random.default_rng(42)
    before, after = _sampled_answers(base, rng, 1500), _sampled_answers(current, rng, 1500)
    # the whole objective, unparseable answers included
    loss_before = np.array([_expected_loss(t, p) for t, p in before])
    loss_after = np.array([_expected_loss(t, p) for t, p in after])
    assert _bootstrap_low(loss_before, loss_after, rng) > 0, (loss_before.mean(), loss_after.mean())
    # calibration proper: Brier of the parsed forecasts against the true p, (q − p)²
    brier_before = np.array([(t / 10 - p) ** 2 for t, p in before if t < BUCKETS])
    brier_after = np.array([(t / 10 - p) ** 2 for t, p in after if t < BUCKETS])
    assert _bootstrap_low(brier_before, brier_after, rng) > 0, (
        brier_before.mean(),
        brier_after.mean(),
    )
    assert brier_after.mean() < 0.5 * brier_before.mean()
    assert _exact_loss(current) < _exact_loss(base)
