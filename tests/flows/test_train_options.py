"""One training configuration: every TrainConfig field can be set by `--set name=value` and by a
TOML file, reaches the trainer, and round-trips to the configuration saved with the checkpoint;
a bad name or value is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select
from typer.testing import CliRunner

from flows.cli import app
from flows.stages.train_options import (
    TrainConfigError,
    TrainOptions,
    config_with_overrides,
    settable_fields,
)
from futureworld.rl.config import TrainConfig
from storage.engine import make_engine, session_scope
from storage.tables import TrainingRunRow

# A valid value unlike the default for every settable field, as text for --set and as TOML.
EXAMPLES: dict[str, tuple[str, str]] = {
    "estimator": ("grpo", '"grpo"'),
    "reward_fn": ("log_score", '"log_score"'),
    "learning_rate": ("3e-5", "3e-5"),
    "lr_decay": ("true", "true"),
    "weight_decay": ("0.01", "0.01"),
    "adam_betas": ("[0.8, 0.95]", "[0.8, 0.95]"),
    "max_grad_norm": ("0.5", "0.5"),
    "groups_per_step": ("3", "3"),
    "pack_single_rollouts": ("true", "true"),
    "micro_batch_tokens": ("2048", "2048"),
    "loss_aggregation": ("constant", '"constant"'),
    "normalizer_tokens_per_rollout": ("256", "256"),
    "ppo_epochs": ("2", "2"),
    "policy_loss": ("cispo", '"cispo"'),
    "clip_low": ("0.1", "0.1"),
    "clip_high": ("0.3", "0.3"),
    "cispo_clip_low": ("0.5", "0.5"),
    "cispo_clip_high": ("0.4", "0.4"),
    "gspo_clip_low": ("0.001", "0.001"),
    "gspo_clip_high": ("0.002", "0.002"),
    "kl_cov_fraction": ("0.01", "0.01"),
    "kl_cov_coef": ("2.0", "2.0"),
    "is_cap": ("3.0", "3.0"),
    "reject_bound": ("20.0", "20.0"),
    "m2po_tau": ("0.05", "0.05"),
    "max_kl_prox": ("0.02", "0.02"),
    "kl_coef": ("0.1", "0.1"),
    "entropy_coef": ("0.01", "0.01"),
    "info_gain_lambda": ("0.25", "0.25"),
    "siop_lambda": ("0.75", "0.75"),
    "temperature": ("0.7", "0.7"),
    "lora_rank": ("8", "8"),
    "lora_alpha": ("16", "16.0"),
    "lora_dropout": ("0.1", "0.1"),
    "lora_target_modules": ('["q_proj", "v_proj"]', '["q_proj", "v_proj"]'),
    "seed": ("7", "7"),
    "logprob_chunk_tokens": ("512", "512"),
    "precision": ("fp32", '"fp32"'),
    "parallel": ("fsdp2", '"fsdp2"'),
}


def test_every_training_setting_has_an_example_here() -> None:
    """A new TrainConfig field must be added above, so the tests below cover it."""
    assert set(EXAMPLES) == set(settable_fields())


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_setting_is_reachable_by_set_and_by_toml_and_round_trips(
    name: str, tmp_path: Path
) -> None:
    text, toml_value = EXAMPLES[name]
    by_set = config_with_overrides(TrainConfig(), sets=[f"{name}={text}"])
    toml = tmp_path / "train.toml"
    toml.write_text(f"{name} = {toml_value}\n", encoding="utf-8")
    by_toml = config_with_overrides(TrainConfig(), toml=toml)
    assert by_set == by_toml
    assert getattr(by_set, name) != getattr(TrainConfig(), name)
    saved = json.loads(json.dumps(by_set.to_json()))  # as the checkpoint's trainer state
    assert config_with_overrides(TrainConfig(), sets=[f"{name}={json.dumps(saved[name])}"]) == (
        by_set
    )
    # A Prefect parameter: the same field names under `config`.
    options = TrainOptions.model_validate({"config": {name: saved[name]}})
    assert options.config == by_set


def test_set_wins_over_the_file_and_bad_settings_name_what_is_wrong(tmp_path: Path) -> None:
    toml = tmp_path / "train.toml"
    toml.write_text("learning_rate = 1e-4\nclip_high = 0.3\n", encoding="utf-8")
    config = config_with_overrides(TrainConfig(), sets=["clip_high=0.5"], toml=toml)
    assert (config.learning_rate, config.clip_high) == (1e-4, 0.5)
    for sets, message in (
        (["learnin_rate=1"], "learnin_rate: not a training setting"),
        (["lora=true"], "lora: decided by the update itself"),
        (["learning_rate"], "expected name=value"),
        (["groups_per_step=two"], "groups_per_step=two: not a valid int"),
        (["learning_rate=-1"], "learning_rate must be a positive finite number"),
        (["estimator=ppo"], "estimator=ppo: not a valid Estimator"),
    ):
        with pytest.raises(TrainConfigError, match=message):
            config_with_overrides(TrainConfig(), sets=sets)
    toml.write_text("clip_high = [\n", encoding="utf-8")
    with pytest.raises(TrainConfigError, match="not a readable TOML file"):
        config_with_overrides(TrainConfig(), toml=toml)
    with pytest.raises(ValueError, match="decided by the update itself"):
        TrainOptions(config=TrainConfig(lora=True))


def test_train_set_reaches_the_loss_and_is_saved_with_the_checkpoint(
    db_url: str, scored_tiny_agent, tmp_path: Path, monkeypatch
) -> None:
    """`train --set clip_high=0.3 --set m2po_tau=0.05`: the update runs with both (M2PO's mask
    and the clip bound are the loss's), and the checkpoint and the training run say so."""
    scored_tiny_agent(db_url, tmp_path)
    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
    toml = tmp_path / "train.toml"
    toml.write_text("learning_rate = 1e-3\nclip_high = 0.1\n", encoding="utf-8")
    result = CliRunner().invoke(
        app,
        [
            "train", "--agent", "tiny", "--config", str(toml),
            "--set", "clip_high=0.3", "--set", "m2po_tau=0.05", "--db", db_url,
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "v0 → v1" in result.output
    state = json.loads(
        (tmp_path / "checkpoints" / "tiny" / "v1" / "trainer_state.json").read_text()
    )
    assert state["config"]["clip_high"] == 0.3 and state["config"]["m2po_tau"] == 0.05
    assert state["config"]["learning_rate"] == 1e-3
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        (run,) = session.scalars(select(TrainingRunRow)).all()
    engine.dispose()
    assert run.config["train"]["clip_high"] == 0.3  # the training run records the same
    assert run.config["code"]["version"] and "commit" in run.config["code"]

    bad = CliRunner().invoke(
        app, ["train", "--agent", "tiny", "--set", "clip_hihg=0.3", "--db", db_url]
    )
    assert bad.exit_code == 2
    assert "clip_hihg: not a training setting" in bad.output and "Traceback" not in bad.output


def test_the_demo_takes_the_same_settings(tmp_path: Path) -> None:
    from flows.demo.config import DemoConfig

    config = DemoConfig(out_dir=tmp_path, train_set=("clip_high=0.4", "policy_loss=cispo"))
    assert (config.update.config.clip_high, config.update.config.policy_loss) == (0.4, "cispo")
    # the research demo's own rate (the default demo's)
    assert config.update.config.learning_rate == config.research_rl_learning_rate
    bad = CliRunner().invoke(app, ["demo", "--set", "nope=1", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "nope: not a training setting" in bad.output
