"""TrainConfig validation: bad values fail with the field named."""

from __future__ import annotations

import math

import pytest

from futureworld.rl.config import Estimator, LossAggregation, Objective, PolicyLoss, TrainConfig


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
        ("clip_low", -0.1),
        ("clip_high", math.nan),
        ("cispo_clip_low", 1.5),
        ("cispo_clip_low", -0.1),
        ("cispo_clip_high", -0.1),
        ("gspo_clip_low", 1.0),
        ("gspo_clip_high", math.nan),
        ("kl_cov_fraction", 0.0),
        ("kl_cov_fraction", 1.5),
        ("kl_cov_coef", -1.0),
        ("kl_cov_coef", math.inf),
        ("entropy_coef", -0.01),
        ("entropy_coef", math.inf),
        ("entropy_coef", math.nan),
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


def test_siop_and_provisional_consensus_are_two_estimators_and_both_learn_before_outcomes():
    assert Estimator("siop") is Estimator.SIOP
    assert Estimator("provisional_consensus") is Estimator.PROVISIONAL_CONSENSUS
    learning_early = {e for e in Estimator if e.learns_before_outcomes}
    assert learning_early == {Estimator.SIOP, Estimator.PROVISIONAL_CONSENSUS}
    with pytest.raises(ValueError, match="siop_lambda"):
        TrainConfig(siop_lambda=1.5)


def test_defaults_follow_the_architecture():
    config = TrainConfig()
    assert config.estimator is Estimator.DR_GRPO and config.objective is Objective.DECOUPLED_PPO
    assert (config.clip_low, config.clip_high, config.is_cap, config.kl_coef) == (0.2, 0.28, 2.0, 0)
    assert config.entropy_coef == 0  # no entropy bonus unless asked for
    assert TrainConfig(estimator="sft").objective is Objective.SFT
    assert config.loss_aggregation is LossAggregation.TOKEN_MEAN
    assert config.temperature is None  # read from the rollouts
    assert config.policy_loss is PolicyLoss.PPO_CLIP


def test_policy_loss_defaults_follow_their_papers():
    config = TrainConfig()
    assert (config.cispo_clip_low, config.cispo_clip_high) == (1.0, 0.28)  # no lower bound
    assert (config.gspo_clip_low, config.gspo_clip_high) == (3e-4, 4e-4)
    assert (config.kl_cov_fraction, config.kl_cov_coef) == (2e-3, 1.0)
    assert TrainConfig(policy_loss="cispo").policy_loss is PolicyLoss.CISPO
    assert TrainConfig(policy_loss="kl_cov").to_json()["policy_loss"] == "kl_cov"


def test_unknown_policy_loss_is_refused():
    with pytest.raises(ValueError, match="ppo3"):
        TrainConfig(policy_loss="ppo3")


def test_gspo_needs_the_sequence_mean():
    with pytest.raises(ValueError, match="sequence_mean"):
        TrainConfig(policy_loss="gspo")
    config = TrainConfig(policy_loss="gspo", loss_aggregation="sequence_mean")
    assert config.loss_aggregation is LossAggregation.SEQUENCE_MEAN


def test_unknown_loss_aggregation_is_refused():
    with pytest.raises(ValueError, match="seq_mean"):
        TrainConfig(loss_aggregation="seq_mean")
