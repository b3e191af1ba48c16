"""report_to: every tracker writes through its real backend and is read back with that
backend's own reader (TensorBoard's EventAccumulator, MlflowClient on a local SQLite store,
W&B's offline run file); `none` writes nothing; a missing package is one line."""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from flows.settings import Settings
from flows.tracking import (
    STEP_HEADLINE_METRICS,
    TRACKERS,
    ReportTo,
    TrackerUnavailable,
    flatten_config,
    log_update_step,
    log_update_summary,
    log_version_scores,
    open_tracker,
    tracking_run,
)
from flows.tracking_summary import update_summary
from futureworld.domain import Turn
from futureworld.rl.config import Estimator, TrainConfig
from futureworld.rl.trainer import TrainResult, train_policy
from tests.rl.rl_builders import build_tiny_model, make_rollout

CONFIG = {
    "train": {"learning_rate": 1e-6, "estimator": "dr_grpo", "lora": True, "max_kl_prox": None},
    "groups": 12,
    "reward_fn": "brier",
    "kind_rewards": ["crps"],
    "resumed_from": None,
}
"""A run_config as the training stage builds it (nested, with None and lists)."""


def _step_metrics(step: int) -> dict[str, float]:
    """The keys train_step and the trainer put in one step's metrics."""
    return {
        "loss": 0.5 / step,
        "clip_low_fraction": 0.01 * step,
        "clip_high_fraction": 0.02 * step,
        "clip_fraction": 0.03 * step,
        "kl_behaviour": 0.001 * step,
        "chi2": 0.1,
        "rejected_fraction": 0.0,
        "entropy": 2.0 - 0.1 * step,
        "kl_ref": 0.0,
        "tokens": 96.0,
        "grad_norm": 1.5 * step,
        "tokens_per_s": 1000.0 + step,
        "kl_prox": 0.002 * step,
        "rows": 2.0,
        "positions": 96.0,
        "step": float(step),
        "epoch": 0.0,
        "groups": 1.0,
        "rollouts": 4.0,
        "staleness_mean": 1.5,
        "staleness_max": 3.0,
    }


STEPS = (1, 2, 3)
SUMMARY = {"reward_mean": -0.2, "reward_std": 0.1, "identical_group_fraction": 0.25}
SCORES = {"panel/brier": 0.21, "panel/ece": 0.05, "panel/parse_rate": 0.98, "live/brier": 0.23}


def _settings(tmp_path: Path, report_to: ReportTo, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return Settings(data_dir=tmp_path / "data", report_to=report_to)


def _log_one_update(settings: Settings) -> None:
    with tracking_run(settings, "forecaster/a", "run-7 v3", CONFIG) as tracker:
        for step in STEPS:
            log_update_step(tracker, step, _step_metrics(step))
        log_update_summary(tracker, 3, SUMMARY)
        log_version_scores(tracker, 3, SCORES)


def test_every_report_to_choice_has_a_tracker():
    assert set(TRACKERS) == set(ReportTo)


def test_report_to_is_none_by_default_and_read_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("FW_REPORT_TO", raising=False)
    monkeypatch.delenv("FW_TRACKING_DIR", raising=False)
    monkeypatch.delenv("FW_MLFLOW_TRACKING_URI", raising=False)
    settings = Settings(data_dir=tmp_path)
    assert settings.report_to is ReportTo.NONE
    assert settings.tracking_root == (tmp_path / "tracking").resolve()
    assert settings.mlflow_store_uri == f"sqlite:///{tmp_path.resolve()}/tracking/mlflow.db"
    monkeypatch.setenv("FW_REPORT_TO", "tensorboard")
    monkeypatch.setenv("FW_TRACKING_DIR", str(tmp_path / "tb"))
    settings = Settings(data_dir=tmp_path)
    assert settings.report_to is ReportTo.TENSORBOARD
    assert settings.tracking_root == (tmp_path / "tb").resolve()


def test_a_wandb_key_is_a_secret_the_settings_redact(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "wk-123456")
    settings = Settings(data_dir=tmp_path)
    assert settings.redact("key wk-123456") == "key ***"


def test_flatten_config_keeps_numbers_and_writes_the_rest_as_json():
    assert flatten_config(CONFIG) == {
        "train.learning_rate": 1e-6,
        "train.estimator": "dr_grpo",
        "train.lora": True,
        "train.max_kl_prox": "null",
        "groups": 12,
        "reward_fn": "brier",
        "kind_rewards": '["crps"]',
        "resumed_from": "null",
    }


def test_none_logs_nothing_and_creates_no_files(tmp_path, monkeypatch):
    settings = _settings(tmp_path, ReportTo.NONE, monkeypatch)
    _log_one_update(settings)
    assert list(tmp_path.iterdir()) == []


def _event_accumulator(log_dir: Path):
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        str(log_dir),
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0},
    )
    return accumulator.Reload()


def test_tensorboard_run_holds_every_step_the_summary_scores_and_config(tmp_path, monkeypatch):
    from tensorboard.plugins.hparams import api_pb2, metadata

    settings = _settings(tmp_path, ReportTo.TENSORBOARD, monkeypatch)
    _log_one_update(settings)
    log_dir = settings.tracking_root / "tensorboard" / "forecaster_a" / "run-7_v3"
    assert [p.name for p in settings.tracking_root.joinpath("tensorboard").iterdir()] == [
        "forecaster_a"
    ]
    events = _event_accumulator(log_dir)
    tags = set(events.Tags()["scalars"])
    for step in STEPS:
        for key, value in _step_metrics(step).items():
            if key == "step":
                assert "train/step" not in tags
                continue
            points = {e.step: e.value for e in events.Scalars(f"train/{key}")}
            assert points[step] == pytest.approx(value, rel=1e-6), key
    assert {e.step for e in events.Scalars("train/loss")} == set(STEPS)
    for key, value in SUMMARY.items():
        [point] = events.Scalars(f"update/{key}")
        assert (point.step, point.value) == (3, pytest.approx(value))
    for key, value in SCORES.items():
        [point] = events.Scalars(f"eval/{key}")
        assert (point.step, point.value) == (3, pytest.approx(value))

    [text] = events.Tensors("config/text_summary")
    written = text.tensor_proto.string_val[0].decode()
    assert json.loads("\n".join(line[4:] for line in written.splitlines())) == CONFIG

    hparams = events.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(hparams[metadata.SESSION_START_INFO_TAG])
    logged = {
        key: value.string_value or value.bool_value or value.number_value
        for key, value in start.hparams.items()
    }
    assert logged == flatten_config(CONFIG)
    experiment = metadata.parse_experiment_plugin_data(hparams[metadata.EXPERIMENT_TAG])
    assert {m.name.tag for m in experiment.metric_infos} == {
        f"train/{key}" for key in STEP_HEADLINE_METRICS
    }
    end = metadata.parse_session_end_info_plugin_data(hparams[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS


def _mlflow_runs(settings: Settings, experiment: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=settings.mlflow_store_uri)
    found = client.get_experiment_by_name(experiment)
    return client, client.search_runs([found.experiment_id])


def test_mlflow_run_holds_the_config_as_params_and_each_metric_history(tmp_path, monkeypatch):
    settings = _settings(tmp_path, ReportTo.MLFLOW, monkeypatch)
    _log_one_update(settings)
    assert (settings.tracking_root / "mlflow.db").is_file()
    client, [run] = _mlflow_runs(settings, "forecaster/a")
    assert run.info.run_name == "run-7 v3" and run.info.status == "FINISHED"
    assert run.data.params == {k: str(v) for k, v in flatten_config(CONFIG).items()}
    for key in _step_metrics(1):
        if key == "step":
            assert "train/step" not in run.data.metrics
            continue
        history = client.get_metric_history(run.info.run_id, f"train/{key}")
        assert sorted((m.step, m.value) for m in history) == [
            (step, pytest.approx(_step_metrics(step)[key])) for step in STEPS
        ]
    for prefix, logged in (("update", SUMMARY), ("eval", SCORES)):
        for key, value in logged.items():
            [point] = client.get_metric_history(run.info.run_id, f"{prefix}/{key}")
            assert (point.step, point.value) == (3, pytest.approx(value))
    saved = client.download_artifacts(run.info.run_id, "config.json", str(tmp_path))
    assert json.loads(Path(saved).read_text()) == CONFIG
    artifacts = (settings.tracking_root / "mlartifacts").resolve().as_uri()
    assert run.info.artifact_uri.startswith(artifacts)


def test_mlflow_runs_of_one_agent_share_its_experiment(tmp_path, monkeypatch):
    settings = _settings(tmp_path, ReportTo.MLFLOW, monkeypatch)
    for run in ("run-1", "run-2"):
        open_tracker(settings, "forecaster/a", run, CONFIG).finish()
    _, runs = _mlflow_runs(settings, "forecaster/a")
    assert sorted(r.info.run_name for r in runs) == ["run-1", "run-2"]


def test_a_run_that_raises_is_marked_failed(tmp_path, monkeypatch):
    settings = _settings(tmp_path, ReportTo.MLFLOW, monkeypatch)
    with (
        pytest.raises(OSError, match="disk full"),
        tracking_run(settings, "a", "run-1", CONFIG) as tracker,
    ):
        log_update_step(tracker, 1, _step_metrics(1))
        raise OSError("disk full")
    _, [run] = _mlflow_runs(settings, "a")
    assert run.info.status == "FAILED"


def _wandb_records(run_file: Path) -> list:
    """The records of a W&B run file: leveldb-log framing (7-byte header per chunk, 32 KiB
    blocks) around wandb_internal_pb2.Record messages."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        if block - position % block < 7:  # the block's tail is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_writes_an_offline_run_or_says_what_to_install(tmp_path, monkeypatch):
    settings = _settings(tmp_path, ReportTo.WANDB, monkeypatch)
    try:
        import wandb  # noqa: F401
    except ImportError:
        with pytest.raises(TrackerUnavailable) as raised:
            _log_one_update(settings)
        assert "pip install wandb" in str(raised.value) and "\n" not in str(raised.value)
        return
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")  # leave pytest's capture of stdout alone
    for variable in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))  # not the user's home
    _log_one_update(settings)
    [run_dir] = (settings.tracking_root / "wandb").glob("offline-run-*")
    [run_file] = run_dir.glob("run-*.wandb")
    records = _wandb_records(run_file)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.project) == (
        "run-7 v3",
        "forecaster/a",
        "futureworld",
    )
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert {k: v for k, v in config.items() if k != "_wandb"} == CONFIG
    rows = [
        {
            item.key or "/".join(item.nested_key): json.loads(item.value_json)
            for item in r.history.item
        }
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    train = [row for row in rows if "train/loss" in row]
    assert [row["train/step"] for row in train] == list(STEPS)
    for row, step in zip(train, STEPS, strict=True):
        for key in STEP_HEADLINE_METRICS:
            assert row[f"train/{key}"] == pytest.approx(_step_metrics(step)[key])
    [update] = [row for row in rows if "update/reward_mean" in row]
    assert update["update/step"] == 3
    [scores] = [row for row in rows if "eval/panel/brier" in row]
    assert scores["eval/step"] == 3 and scores["eval/live/brier"] == pytest.approx(0.23)


@pytest.mark.parametrize(
    ("report_to", "package", "install"),
    [
        (ReportTo.WANDB, "wandb", "pip install wandb"),
        (ReportTo.MLFLOW, "mlflow", "pip install 'futureworld[mlflow]'"),
        (ReportTo.TENSORBOARD, "torch.utils.tensorboard", "pip install tensorboard"),
    ],
)
def test_a_missing_tracker_package_is_one_line_naming_the_install(
    tmp_path, monkeypatch, report_to, package, install
):
    settings = _settings(tmp_path, report_to, monkeypatch)
    # What `import` sees of an absent package, even after another test imported it
    for name in [m for m in sys.modules if m == package or m.startswith(f"{package}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, package, None)
    with pytest.raises(TrackerUnavailable) as raised:
        open_tracker(settings, "a", "run-1", CONFIG)
    message = str(raised.value)
    assert install in message and "\n" not in message and report_to.value in message


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_a_real_update_logs_every_step_and_its_summary(tmp_path, monkeypatch, one_torch_thread):
    """The trainer's on_step into a TensorBoard run, as the training stage wires it."""
    model_dir = build_tiny_model(tmp_path / "base")
    rollouts = [
        make_rollout(
            question_id=q,
            sample_index=s,
            completion=(4 + s, 5, 6, 7 + q),
            reward=[-0.1, -0.3, -0.1, -0.5][s] if q == 0 else -0.2,  # group 1: all equal
            staleness=q,
        )
        for q in range(2)
        for s in range(4)
    ]
    config = TrainConfig(
        learning_rate=1e-2, micro_batch_tokens=32, groups_per_step=1, precision="fp32"
    )
    settings = _settings(tmp_path, ReportTo.TENSORBOARD, monkeypatch)
    with tracking_run(settings, "a", "run-1", {"train": config.to_json()}) as tracker:
        result = train_policy(
            model_dir,
            rollouts,
            config,
            tmp_path / "v1",
            on_step=lambda step, metrics: log_update_step(tracker, step, metrics),
        )
        summary = update_summary(rollouts, config, result)
        log_update_summary(tracker, 1, summary)
    events = _event_accumulator(settings.tracking_root / "tensorboard" / "a" / "run-1")
    for key in STEP_HEADLINE_METRICS:
        assert [e.step for e in events.Scalars(f"train/{key}")] == list(range(1, result.steps + 1))
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx(
        [m["loss"] for m in result.metrics]
    )
    assert summary["identical_group_fraction"] == 0.5
    assert summary["staleness_mean"] == 0.5 and summary["staleness_max"] == 1.0
    assert events.Scalars("update/identical_group_fraction")[0].value == 0.5


def _result(
    metrics: tuple[dict[str, float], ...], *, rollouts_used: int, groups_used: int
) -> TrainResult:
    """What the trainer returns after one step per `metrics` entry, nothing skipped."""
    return TrainResult(
        checkpoint_path=Path("v1"),
        checkpoint_sha256="",
        steps=len(metrics),
        global_step=len(metrics),
        metrics=metrics,
        rollouts_used=rollouts_used,
        groups_used=groups_used,
        groups_skipped=0,
    )


def test_update_summary_of_a_hand_computed_update():
    rewards = [[0.0, -1.0, 0.0, -1.0], [-0.25] * 4]
    rollouts = [
        # Brier on a YES: p = 1 scores 0 and p = 0 scores −1; group 1 answers 0.5 four times
        make_rollout(
            question_id=q,
            sample_index=s,
            reward=r,
            staleness=2 * q,
            p_yes=1.0 + r if q == 0 else 0.5,
        )
        for q, group in enumerate(rewards)
        for s, r in enumerate(group)
    ]
    result = _result(
        ({"loss": 0.25, "kl_prox": 0.01}, {"loss": 0.75, "kl_prox": 0.03}),
        rollouts_used=8,
        groups_used=2,
    )
    summary = update_summary(rollouts, TrainConfig(estimator=Estimator.DR_GRPO), result)
    # rewards: mean −0.375; deviations ±0.375/0.625 (group 0), 0.125 (group 1), so the
    # variance over all 8 is (2 × 0.140625 + 2 × 0.390625 + 4 × 0.015625) / 8 = 0.375².
    # Dr. GRPO: group 0 gets A = ±0.5 on each of its 4 × 4 tokens, group 1 (all equal) 0,
    # so over the 32 tokens mean |A| = 0.25 and std(A) = sqrt(16 × 0.25 / 32).
    assert summary == pytest.approx(
        {
            "groups": 2.0,
            "groups_skipped": 0.0,
            "rollouts": 8.0,
            "steps": 2.0,
            "loss_mean": 0.5,
            "kl_prox_max": 0.03,
            "reward_mean": -0.375,
            "reward_std": 0.375,
            "group_reward_std_mean": 0.25,
            "identical_group_fraction": 0.5,
            "identical_answer_group_fraction": 0.5,
            "parse_rate": 1.0,
            "answer_tokens_mean": 4.0,
            "staleness_mean": 1.0,
            "staleness_max": 2.0,
            "advantage_std": 0.125**0.5,
            "advantage_abs_mean": 0.25,
        }
    )


def _two_turns(belief: float | None) -> tuple[Turn, ...]:
    """A search turn (eliciting `belief` after its result), the result, then the answer."""
    return (
        Turn(index=0, role="assistant", text="", token_start=0, token_end=2, belief=belief),
        Turn(index=1, role="tool", text="", token_start=2, token_end=3),
        Turn(index=2, role="assistant", text="", token_start=3, token_end=4),
    )


def test_update_summary_counts_multi_turn_rollouts_that_elicited_no_belief():
    """Turn credit from the 0.5 prior is a rescaled outcome credit: an update that got it is
    told so. One-turn rollouts do not count; dr_grpo does not report it."""
    turns = [_two_turns(0.8), _two_turns(None), _two_turns(0.3), ()]
    rollouts = [
        make_rollout(sample_index=s, reward=-0.1 * s, mask=(1, 1, 0, 1), turns=t)
        for s, t in enumerate(turns)
    ]
    result = _result(({"loss": 0.1},), rollouts_used=4, groups_used=1)
    for estimator in (Estimator.FORECAST_INFO_GAIN, Estimator.SIOP):
        summary = update_summary(rollouts, TrainConfig(estimator=estimator), result)
        assert summary["beliefless_multi_turn_fraction"] == pytest.approx(1 / 3)
    dr_grpo = update_summary(rollouts, TrainConfig(estimator=Estimator.DR_GRPO), result)
    assert "beliefless_multi_turn_fraction" not in dr_grpo
    one_turn = update_summary(
        rollouts[3:] * 2, TrainConfig(estimator=Estimator.FORECAST_INFO_GAIN), result
    )
    assert "beliefless_multi_turn_fraction" not in one_turn


def test_update_summary_of_sft_has_no_rewards():
    result = _result(({"loss": 1.0},), rollouts_used=1, groups_used=1)
    trajectory = make_rollout().trajectory
    summary = update_summary([trajectory], TrainConfig(estimator=Estimator.SFT), result)
    assert summary == {
        "groups": 1.0,
        "groups_skipped": 0.0,
        "rollouts": 1.0,
        "steps": 1.0,
        "loss_mean": 1.0,
    }
