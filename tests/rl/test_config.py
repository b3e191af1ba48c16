"""TrainConfig validation: bad values fail with the field named."""

from __future__ import annotations

import json
import math

import pytest

from futureworld.rl.checkpoints import TRAINER_STATE_FILE, load_trainer_state
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


def test_a_config_stored_under_the_old_name_siop_reads_as_provisional_consensus(tmp_path):
    # A checkpoint's trainer state (and a training run's config) as written before the rename.
    stored = {**TrainConfig().to_json(), "estimator": "siop"}
    (tmp_path / TRAINER_STATE_FILE).write_text(json.dumps({"config": stored, "global_step": 3}))
    state = load_trainer_state(tmp_path, lora=stored["lora"])
    config = TrainConfig(**state["config"])
    assert config.estimator is Estimator.PROVISIONAL_CONSENSUS
    assert config.to_json()["estimator"] == "provisional_consensus"
    # The old name is read, never offered: the choices (the CLI's) hold the new one only.
    assert [str(e) for e in Estimator].count("siop") == 0
    assert "provisional_consensus" in [str(e) for e in Estimator]


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
