"""Settings: the one place that reads the environment (prefix `FW_`). Built only in
entrypoints (the CLI, flow entrypoints), never at import time.

Secrets (the database URL's password, FW_METACULUS_TOKEN) live only here, in the process's
environment: never in a Prefect parameter, a timer job or a printed line. `redact` hides them
in any text a command prints."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated
from urllib.parse import quote, unquote

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from flows.tracking import ReportTo
from futureworld.validation import DEFAULT_VALIDATION_FRACTION, GateOptions

DAILY_CRON = "0 6 * * *"
"""The daily cycle's default schedule (UTC), as in prefect.yaml."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FW_", extra="ignore")

    data_dir: Path = Path(".futureworld")
    """Where the embedded database, checkpoints and reports live."""
    db_url: str | None = None
    """SQLAlchemy URL; default `<data_dir>/futureworld.db`; `postgresql://` uses psycopg 3."""
    db_url_secret: str | None = None
    """Name of a Prefect Secret block holding the database URL, read by the Prefect flows
    when FW_DB_URL is unset (a worker that should not keep the password in its environment)."""
    feeds: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """RSS/Atom feed URLs, comma-separated in FW_FEEDS."""
    feeds_file: Path | None = None
    """A file with one feed URL per line (# comments allowed)."""
    manifold_base_url: str = "https://api.manifold.markets"
    polymarket_base_url: str = "https://gamma-api.polymarket.com"
    metaculus_base_url: str = "https://www.metaculus.com"
    metaculus_token: SecretStr | None = None
    kalshi_base_url: str = "https://api.elections.kalshi.com"
    http_timeout_s: float = 20.0
    http_max_retries: int = 4
    http_rate_per_s: float = Field(default=5.0, ge=0)
    """Requests a second to each source (FW_HTTP_RATE_PER_S); 0 lifts the limit, e.g. for a
    mirror or simulated world on loopback."""
    user_agent: str = "futureworld/0.1 (+https://github.com/futureworld)"
    device: str = "cpu"
    """Torch device for local generation and training: cpu, cuda, cuda:1 …"""
    torch_threads: int | None = Field(default=None, ge=1)
    """Torch intra-op threads of local generation and in-process training (FW_TORCH_THREADS);
    unset: the cores this process may use (its CPU affinity), shared out among the processes
    a job runs side by side (futureworld.torch_threads)."""
    judge_agent: str | None = None
    """Registered agent whose model judges generated questions after they close; unset:
    generated questions wait for `futureworld resolve --manual`."""
    worker_id: str | None = None
    """Identifies this process in prediction claims; default: host:pid."""
    claim_lease_s: float = 1800.0
    """How long a predict worker's claim on a question group lives before others may take it."""
    serve_restart_command: str | None = None
    """Full fine-tuning over the HTTP backend: the command that restarts the agent's vLLM
    server on a new checkpoint, with {checkpoint}, {served_name} and {port} filled in, e.g.
    `infra/vllm/restart.sh {checkpoint} {served_name}` (flows.stages.serving)."""
    serve_timeout_s: float = 900.0
    """How long the serve step waits for the server to list a new version."""
    predict_max_failures: int = 3
    """Failed prediction attempts (prompt too long, generation or persistence error) after
    which predict parks a question for that agent: reported, no longer retried."""
    reforecast_every_days: float | None = None
    """Re-forecast a still-open question when its agent's newest forecast of it is at least
    this many days old and a newer policy version exists; unset: each question is forecast
    once per agent (flows.stages.predicting, storage.repositories.reforecasts)."""
    validation_fraction: float = Field(default=DEFAULT_VALIDATION_FRACTION, ge=0.0, lt=1.0)
    """Share of questions held out of training as the promotion gate's validation set
    (FW_VALIDATION_FRACTION; futureworld.validation.is_held_out, by a hash of the question's
    id). A setting, not an update's option: replay must leave out the same slice every update,
    or a later gate would score a version on questions it trained on. 0 turns the gate off:
    every update is served as soon as it is registered."""
    gate_max_questions: int = Field(default=GateOptions.max_questions, ge=1)
    """The promotion gate scores a candidate on at most this many resolved validation
    questions, the most recently resolved (FW_GATE_MAX_QUESTIONS; GateOptions.max_questions)."""
    gate_max_unresolved: int = Field(default=GateOptions.max_unresolved, ge=0)
    """...and judges its health also on up to this many open questions, the newest first
    (FW_GATE_MAX_UNRESOLVED; GateOptions.max_unresolved; 0: resolved ones only)."""
    gate_max_trained: int = Field(default=GateOptions.max_trained, ge=0)
    """...and its fit on up to this many of its update's own resolved training questions
    (FW_GATE_MAX_TRAINED; GateOptions.max_trained; 0: no fit rule). The gate forecasts every
    one of them with the candidate, `GateOptions.samples` rollouts or more each, so these
    three size its cost: an agent that researches over several turns costs several times a
    one-turn forecast a rollout."""
    report_to: ReportTo = ReportTo.NONE
    """Where training and evaluation runs log their config and metrics (FW_REPORT_TO):
    tensorboard, mlflow, wandb or none, as TRL's `report_to` (flows.tracking)."""
    tracking_dir: Path | None = None
    """The trackers' local files (FW_TRACKING_DIR); default `<data_dir>/tracking`."""
    mlflow_tracking_uri: str | None = None
    """MLflow's store (FW_MLFLOW_TRACKING_URI): a server's http(s) URL or a database URL;
    default a SQLite file `<tracking dir>/mlflow.db`, no server needed."""
    wandb_api_key: SecretStr | None = Field(default=None, validation_alias="WANDB_API_KEY")
    """W&B's own WANDB_API_KEY: unset, report_to=wandb writes offline runs (`wandb sync`)."""

    @field_validator("feeds", mode="before")
    @classmethod
    def _split_feeds(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @property
    def database_url(self) -> str:
        return self.db_url or f"sqlite:///{(self.data_dir / 'futureworld.db').resolve()}"

    @property
    def tracking_root(self) -> Path:
        return (self.tracking_dir or self.data_dir / "tracking").resolve()

    @property
    def mlflow_store_uri(self) -> str:
        return self.mlflow_tracking_uri or f"sqlite:///{self.tracking_root / 'mlflow.db'}"

    def gate(self, validation_fraction: float | None = None) -> GateOptions:
        """The promotion gate's options: these settings' sizes, on `validation_fraction`
        (default FW_VALIDATION_FRACTION, the slice replay leaves out)."""
        fraction = self.validation_fraction if validation_fraction is None else validation_fraction
        return GateOptions(
            validation_fraction=fraction,
            max_questions=self.gate_max_questions,
            max_unresolved=self.gate_max_unresolved,
            max_trained=self.gate_max_trained,
        )

    def with_db(self, db_url: str | None) -> Settings:
        return self if db_url is None else self.model_copy(update={"db_url": db_url})

    def secrets(self) -> list[str]:
        """The secret values this configuration holds (the database password, tokens)."""
        tokens = [self.metaculus_token, self.wandb_api_key]
        found = [token.get_secret_value() for token in tokens if token is not None]
        password = url_password(self.database_url)
        return [s for s in [*found, password] if s]

    def redact(self, text: str) -> str:
        """`text` with every secret of this configuration replaced by ***."""
        for secret in self.secrets():
            text = text.replace(secret, "***").replace(quote(secret, safe=""), "***")
        return text


def url_password(url: str) -> str | None:
    """The password in a database URL (user:password@host), None when it has none."""
    _, _, rest = url.partition("://")
    credentials, at, _ = rest.rpartition("@")
    if not at or ":" not in credentials:
        return None
    return unquote(credentials.split(":", 1)[1]) or None


def without_password(url: str) -> str:
    """A database URL safe to print: its password replaced by ***."""
    password = url_password(url)
    if password is None:
        return url
    scheme, _, rest = url.partition("://")
    credentials, _, host = rest.rpartition("@")
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"


def parse_as_of(value: str | datetime | None) -> datetime:
    """An as-of parameter: a date (midnight UTC) or an ISO datetime, naive taken as UTC;
    None is now."""
    if value is None:
        return datetime.now(UTC)
    try:
        parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"as_of {value!r} is neither a date nor an ISO datetime") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
