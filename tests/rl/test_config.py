"""TrainConfig validation: bad values fail with the field named."""

from __future__ import annotations

import pytest

from futureworld.rl.config import Estimator, LossAggregation, Objective, TrainConfig


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("learning_rate", 0.0),
        ("groups_per_step", 0),
        ("normalizer_tokens_per_rollout", 0),
        ("micro_batch_tokens", 0),
        ("ppo_epochs", 0),
        ("clip_low", 1.0),
        ("clip_high", -0.1),
        ("is_cap", -1.0),
        ("temperature", 0.0),
        ("m2po_tau", 0.0),
        ("kl_coef", -0.1),
        ("lora_dropout", 1.0),
        ("logprob_chunk_tokens", 0),
    ],
)
def test_invalid_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: value})


def test_reject_bound_below_the_importance_cap_is_refused():
    with pytest.raises(ValueError, match="reject_bound"):
        TrainConfig(reject_bound=1.5, is_cap=2.0)


def test_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="ppo2"):
        TrainConfig(estimator="ppo2")


def test_defaults_follow_the_architecture():
    config = TrainConfig()
    assert config.estimator is Estimator.DR_GRPO and config.objective is Objective.DECOUPLED_PPO
    assert (config.clip_low, config.clip_high, config.is_cap, config.kl_coef) == (0.2, 0.28, 2.0, 0)
    assert TrainConfig(estimator="sft").objective is Objective.SFT
    assert config.loss_aggregation is LossAggregation.TOKEN_MEAN
    assert config.temperature is None  # read from the rollouts


def test_unknown_loss_aggregation_is_refused():
    with pytest.raises(ValueError, match="seq_mean"):
        TrainConfig(loss_aggregation="seq_mean")
