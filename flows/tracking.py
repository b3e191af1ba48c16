"""Experiment tracking (`report_to`, as in TRL and verl): a run's configuration and its
scalars (train/ per optimiser step, update/ per update, eval/ per version) sent to TensorBoard,
MLflow or W&B. Not what is measured (futureworld.rl, flows.tracking_summary) nor the training
run records in the database (storage.repositories.training)."""

from __future__ import annotations

import json
import numbers
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from flows.settings import Settings


class ReportTo(StrEnum):
    """Where a run's configuration and metrics go (FW_REPORT_TO)."""

    NONE = "none"
    """Nowhere: no files, no imports."""
    TENSORBOARD = "tensorboard"
    """Event files under <tracking dir>/tensorboard/<agent>/<run> (`tensorboard --logdir`)."""
    MLFLOW = "mlflow"
    """An MLflow store (FW_MLFLOW_TRACKING_URI; default a SQLite file under the tracking dir),
    one experiment per agent; needs the `mlflow` extra (mlflow-skinny)."""
    WANDB = "wandb"
    """Weights & Biases, project "futureworld", one group per agent; offline (a run directory
    under <tracking dir>/wandb, `wandb sync` later) unless WANDB_API_KEY is set; needs the
    `wandb` extra."""


class TrackerUnavailable(RuntimeError):
    """The tracker's package is not installed; the message is one line saying what to install."""


class Tracker(Protocol):
    def start_run(self, name: str, config: Mapping[str, Any]) -> None:
        """Opens run `name` and records its configuration (nested JSON values)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int, prefix: str) -> None:
        """Logs each metric as `prefix/key` at `step` (each prefix is its own x-axis)."""

    def finish(self, *, failed: bool = False) -> None:
        """Closes the run, marked failed when the work it tracked raised."""


TRAIN_PREFIX = "train"
"""Per optimiser step, x-axis the global step (continued across updates)."""
UPDATE_PREFIX = "update"
"""Per update, x-axis the policy version it produced."""
EVAL_PREFIX = "eval"
"""Per policy version scored, x-axis the version."""

STEP_HEADLINE_METRICS = (
    "loss",
    "clip_fraction",
    "kl_prox",
    "entropy",
    "grad_norm",
    "kl_behaviour",
    "staleness_mean",
    "tokens_per_s",
)
"""The step metrics of futureworld.rl.step.train_step and the trainer (`TrainResult.metrics`)
that TensorBoard's HPARAMS view shows next to each run's configuration."""


def _safe_name(name: str) -> str:
    """`name` as one path component (agent and run names may hold / or spaces)."""
    return re.sub(r"[^A-Za-z0-9._=+-]+", "_", name).strip("._") or "_"


def flatten_config(config: Mapping[str, Any], parent: str = "") -> dict[str, str | float | bool]:
    """Nested config → {"train.lr": 1e-6, …}: numbers and booleans kept, None and lists as
    JSON text, so every tracker can show and compare it as flat hyperparameters."""
    flat: dict[str, str | float | bool] = {}
    for key, value in config.items():
        name = f"{parent}.{key}" if parent else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, name))
        elif isinstance(value, bool | int | float | str):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, sort_keys=True, default=str)
    return flat


def _scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics that are numbers, as floats (NaN kept: a diverged loss is worth seeing;
    None and text left out)."""
    return {key: float(value) for key, value in metrics.items() if isinstance(value, numbers.Real)}


class NullTracker:
    """report_to=none: every call does nothing."""

    def __init__(self, settings: Settings, agent_name: str) -> None:
        pass

    def start_run(self, name: str, config: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int, prefix: str) -> None:
        pass

    def finish(self, *, failed: bool = False) -> None:
        pass


class TensorBoardTracker:
    """torch's SummaryWriter (the tensorboard package's own `Writer` is marked experimental
    and writes scalars only): scalars, the config as JSON text and as HPARAMS."""

    def __init__(self, settings: Settings, agent_name: str) -> None:
        self.agent_dir = settings.tracking_root / "tensorboard" / _safe_name(agent_name)
        self._writer: Any = None
        self.log_dir: Path | None = None

    def start_run(self, name: str, config: Mapping[str, Any]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams
        except ImportError:
            raise TrackerUnavailable(
                "report_to=tensorboard needs the tensorboard package: pip install tensorboard"
            ) from None
        self.log_dir = self.agent_dir / _safe_name(name)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))
        text = json.dumps(dict(config), indent=2, sort_keys=True, default=str)
        # Indented: TensorBoard renders text as markdown, a 4-space block keeps the JSON as is
        self._writer.add_text("config", "\n".join(f"    {line}" for line in text.splitlines()))
        metric_tags = {f"{TRAIN_PREFIX}/{key}": 0.0 for key in STEP_HEADLINE_METRICS}
        experiment, session_start, _ = hparams(flatten_config(config), metric_tags)
        self._writer.file_writer.add_summary(experiment)
        self._writer.file_writer.add_summary(session_start)

    def log_metrics(self, metrics: Mapping[str, float], step: int, prefix: str) -> None:
        for key, value in _scalars(metrics).items():
            self._writer.add_scalar(f"{prefix}/{key}", value, global_step=step)

    def finish(self, *, failed: bool = False) -> None:
        if self._writer is None:
            return
        self._writer.file_writer.add_summary(_session_end(failed))
        self._writer.close()
        self._writer = None


def _session_end(failed: bool) -> Any:
    """The HPARAMS plugin's session-end summary with the run's status."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    status = api_pb2.STATUS_FAILURE if failed else api_pb2.STATUS_SUCCESS
    content = plugin_data_pb2.HParamsPluginData(
        session_end_info=plugin_data_pb2.SessionEndInfo(status=status),
        version=metadata.PLUGIN_DATA_VERSION,
    )
    return Summary(
        value=[
            Summary.Value(
                tag=metadata.SESSION_END_INFO_TAG,
                metadata=metadata.create_summary_metadata(content),
            )
        ]
    )


MLFLOW_PARAM_VALUE_CHARS = 6000
"""MLflow's limit on a parameter's value; the whole config is also logged as config.json."""
MLFLOW_BATCH = 100
"""Parameters per log_batch call (MLflow's limit; metrics allow 1000)."""


class MlflowTracker:
    """An MlflowClient on FW_MLFLOW_TRACKING_URI (no server needed for the default SQLite
    store: MLflow 3 refuses a bare ./mlruns file store), one experiment per agent; the config
    as flat params and as the artifact config.json."""

    def __init__(self, settings: Settings, agent_name: str) -> None:
        self.tracking_uri = settings.mlflow_store_uri
        self.experiment_name = agent_name
        # A local store keeps its artifacts beside it, not in ./mlruns of whatever the cwd is
        local = self.tracking_uri.startswith(("sqlite:", "file:"))
        self.artifact_location = (
            (settings.tracking_root / "mlartifacts").resolve().as_uri() if local else None
        )
        self.run_id: str | None = None
        self._client: Any = None

    def start_run(self, name: str, config: Mapping[str, Any]) -> None:
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise TrackerUnavailable(
                "report_to=mlflow needs MLflow: pip install 'futureworld[mlflow]' (mlflow-skinny)"
            ) from None
        if self.tracking_uri.startswith("sqlite:///"):
            Path(self.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(
                parents=True, exist_ok=True
            )
        self._client = MlflowClient(tracking_uri=self.tracking_uri)
        run = self._client.create_run(
            self._experiment_id(), run_name=name, tags={"futureworld.agent": self.experiment_name}
        )
        self.run_id = run.info.run_id
        params = [
            Param(key, str(value)[:MLFLOW_PARAM_VALUE_CHARS])
            for key, value in flatten_config(config).items()
        ]
        for start in range(0, len(params), MLFLOW_BATCH):
            self._client.log_batch(self.run_id, params=params[start : start + MLFLOW_BATCH])
        self._client.log_dict(
            self.run_id, json.loads(json.dumps(config, default=str)), "config.json"
        )

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self._client.get_experiment_by_name(self.experiment_name)
        if experiment is not None:
            return experiment.experiment_id
        try:
            return self._client.create_experiment(
                self.experiment_name, artifact_location=self.artifact_location
            )
        except MlflowException:  # created by another process in between
            experiment = self._client.get_experiment_by_name(self.experiment_name)
            if experiment is None:
                raise
            return experiment.experiment_id

    def log_metrics(self, metrics: Mapping[str, float], step: int, prefix: str) -> None:
        from mlflow.entities import Metric

        at_ms = int(time.time() * 1000)
        batch = [
            Metric(f"{prefix}/{key}", value, at_ms, step)
            for key, value in _scalars(metrics).items()
        ]
        for start in range(0, len(batch), 1000):
            self._client.log_batch(self.run_id, metrics=batch[start : start + 1000])

    def finish(self, *, failed: bool = False) -> None:
        if self.run_id is None:
            return
        self._client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
        self.run_id = None


WANDB_PROJECT = "futureworld"


class WandbTracker:
    """A W&B run (project futureworld, group = agent); each prefix has its own x-axis
    `prefix/step` (define_metric), as W&B's own step must only grow."""

    def __init__(self, settings: Settings, agent_name: str) -> None:
        self.dir = settings.tracking_root
        self.group = agent_name
        self.api_key = settings.wandb_api_key
        self.run: Any = None
        self._axes: set[str] = set()

    def start_run(self, name: str, config: Mapping[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise TrackerUnavailable(
                "report_to=wandb needs the wandb package: pip install wandb "
                "(or pip install 'futureworld[wandb]')"
            ) from None
        self.dir.mkdir(parents=True, exist_ok=True)
        online = self.api_key is not None
        self.run = wandb.init(
            project=WANDB_PROJECT,
            group=self.group,
            name=name,
            dir=str(self.dir),
            config=json.loads(json.dumps(config, default=str)),
            mode="online" if online else "offline",
            reinit="create_new",  # a demo's run and an update's run may be open together
            settings=wandb.Settings(api_key=self.api_key.get_secret_value()) if online else None,
        )

    def log_metrics(self, metrics: Mapping[str, float], step: int, prefix: str) -> None:
        axis = f"{prefix}/step"
        if prefix not in self._axes:
            self.run.define_metric(axis)
            self.run.define_metric(f"{prefix}/*", step_metric=axis)
            self._axes.add(prefix)
        scalars = {f"{prefix}/{key}": value for key, value in _scalars(metrics).items()}
        self.run.log({**scalars, axis: step})

    def finish(self, *, failed: bool = False) -> None:
        if self.run is None:
            return
        self.run.finish(exit_code=1 if failed else 0)
        self.run = None


TrackerFactory = Callable[["Settings", str], Tracker]
"""(settings, agent name) → a tracker, not yet started."""

TRACKERS: dict[ReportTo, TrackerFactory] = {
    ReportTo.NONE: NullTracker,
    ReportTo.TENSORBOARD: TensorBoardTracker,
    ReportTo.MLFLOW: MlflowTracker,
    ReportTo.WANDB: WandbTracker,
}


def open_tracker(
    settings: Settings,
    agent_name: str,
    run_name: str,
    config: Mapping[str, Any],
    *,
    report_to: ReportTo | None = None,
) -> Tracker:
    """A started run of `settings.report_to` (or `report_to`) with its configuration logged."""
    tracker = TRACKERS[report_to or settings.report_to](settings, agent_name)
    tracker.start_run(run_name, config)
    return tracker


@contextmanager
def tracking_run(
    settings: Settings,
    agent_name: str,
    run_name: str,
    config: Mapping[str, Any],
    *,
    report_to: ReportTo | None = None,
) -> Iterator[Tracker]:
    """`open_tracker` as a context: the run is finished on exit, marked failed on an error."""
    tracker = open_tracker(settings, agent_name, run_name, config, report_to=report_to)
    try:
        yield tracker
    except BaseException:
        tracker.finish(failed=True)
        raise
    tracker.finish()


def log_update_step(tracker: Tracker, step: int, metrics: Mapping[str, float]) -> None:
    """One optimiser step's metrics (the trainer's on_step) under train/, at the global step;
    every number is kept (`STEP_HEADLINE_METRICS` and the rest: clip low/high, chi2, …)."""
    tracker.log_metrics({k: v for k, v in metrics.items() if k != "step"}, step, TRAIN_PREFIX)


def log_update_summary(tracker: Tracker, version: int, summary: Mapping[str, float]) -> None:
    """One update's summary (`update_summary`, or any numbers) under update/, at the version
    it produced."""
    tracker.log_metrics(summary, version, UPDATE_PREFIX)


def log_version_scores(
    tracker: Tracker, version: int, scores: Mapping[str, float], *, prefix: str = EVAL_PREFIX
) -> None:
    """A policy version's scores (e.g. {"panel/brier": …, "panel/ece": …, "live/brier": …,
    "panel/parse_rate": …}) under eval/, at the version."""
    tracker.log_metrics(scores, version, prefix)
