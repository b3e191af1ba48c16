"""SQLModel tables: the system of record (ARCHITECTURE §3).

Rows never leave `storage`; repositories translate them to and from domain objects.
Token arrays are packed bytea (storage.codec). Full-text search columns and the SQLite
FTS5 mirror are created by the migrations, not declared here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    Column,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    UniqueConstraint,
    text,
)
from sqlmodel import Field, SQLModel

from storage.types import SafeJSON, SafeText, UTCDateTime


def _utc(nullable: bool = False, index: bool = False) -> Any:
    return Field(default=None, sa_column=Column(UTCDateTime(), nullable=nullable, index=index))


def _json() -> Any:
    return Field(default_factory=dict, sa_column=Column(SafeJSON, nullable=False))


def _blob() -> Any:
    return Field(default=b"", sa_column=Column(LargeBinary(), nullable=False))


def _text() -> Any:
    return Field(default="", sa_column=Column(SafeText(), nullable=False))


def _str(default: Any = ..., **kwargs: Any) -> Any:
    """A short text column (VARCHAR in the migrations): SafeText like every text column."""
    return Field(default=default, sa_type=SafeText, **kwargs)


class QuestionRow(SQLModel, table=True):
    __tablename__ = "question"
    __table_args__ = (UniqueConstraint("source", "external_id", name="uq_question_source_ext"),)

    id: int | None = Field(default=None, primary_key=True)
    source: str = _str(index=True)
    external_id: str = _str()
    kind: str = _str("binary")
    title: str = _text()
    background: str = _text()
    resolution_criteria: str = _text()
    url: str = _str("")
    domain: str = _str(default="", index=True)
    created_at: datetime = _utc()
    info_cutoff_at: datetime = _utc(index=True)
    close_at: datetime | None = _utc(nullable=True)
    resolve_by: datetime | None = _utc(nullable=True)
    status: str = _str(default="open", index=True)
    crowd_probability: float | None = None
    options: list[str] = Field(default_factory=list, sa_column=Column(SafeJSON, nullable=False))
    extra: dict[str, Any] = _json()
    harvested_at: datetime = _utc()


class ArticleRow(SQLModel, table=True):
    __tablename__ = "article"
    __table_args__ = (
        UniqueConstraint("guid", name="uq_article_guid"),
        UniqueConstraint("link", name="uq_article_link"),
        # Newest-first scans of what was visible at a cut-off, ties by id (storage.search).
        Index("ix_article_visible_at_id", "visible_at", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    feed: str = _str(index=True)
    guid: str = _str()
    link: str = _str()
    title: str = _text()
    summary: str = _text()
    body: str = _text()
    published_at: datetime = _utc()
    fetched_at: datetime = _utc()
    visible_at: datetime = _utc()
    """From when a search may return it (storage.repositories.articles.visible_from)."""
    flags: list[str] = Field(default_factory=list, sa_column=Column(SafeJSON, nullable=False))


class FeedStateRow(SQLModel, table=True):
    """Conditional-GET state per feed (ETag / Last-Modified)."""

    __tablename__ = "feed_state"

    url: str = _str(primary_key=True)
    etag: str | None = _str(None)
    last_modified: str | None = _str(None)
    last_fetched_at: datetime | None = _utc(nullable=True)


class OutcomeRow(SQLModel, table=True):
    __tablename__ = "outcome"
    __table_args__ = (UniqueConstraint("question_id", "revision", name="uq_outcome_revision"),)

    id: int | None = Field(default=None, primary_key=True)
    question_id: int = Field(foreign_key="question.id", index=True)
    revision: int
    status: str = _str()
    value: float | None = None
    resolved_at: datetime = _utc()
    raw: dict[str, Any] = _json()
    recorded_at: datetime = _utc()


class AgentRow(SQLModel, table=True):
    __tablename__ = "agent"

    id: int | None = Field(default=None, primary_key=True)
    name: str = _str(unique=True)
    base_model: str = _str()
    backend: str = _str()
    base_url: str | None = _str(None)
    served_model: str | None = _str(None)
    generation: dict[str, Any] = _json()
    created_at: datetime = _utc()


class PolicyVersionRow(SQLModel, table=True):
    __tablename__ = "policy_version"
    __table_args__ = (UniqueConstraint("agent_id", "version", name="uq_policy_version"),)

    id: int | None = Field(default=None, primary_key=True)
    agent_id: int = Field(foreign_key="agent.id", index=True)
    version: int
    parent_version: int | None = None
    checkpoint_path: str = _str()
    checkpoint_sha256: str = _str("")
    training_run_id: int | None = None
    created_at: datetime = _utc()
    status: str = _str("promoted")
    """candidate | promoted | rejected (futureworld.domain.VersionStatus)."""
    status_reason: str = _text()
    validation_questions: int = 0
    validation_brier: float | None = None
    validation_parse_rate: float | None = None
    validation_forecasts: dict[str, Any] = _json()
    """The promotion gate's forecasts by this version of held-out questions: question id →
    each rollout's P(yes), null where it did not parse. Never rollouts, so never replayed."""


class RolloutRow(SQLModel, table=True):
    __tablename__ = "rollout"
    __table_args__ = (
        UniqueConstraint(
            "question_id", "agent_id", "policy_version", "sample_index", name="uq_rollout_sample"
        ),
        Index("ix_rollout_group", "question_id", "agent_id", "policy_version"),
    )

    id: int | None = Field(default=None, primary_key=True)
    idempotency_key: str = _str(unique=True)
    question_id: int = Field(foreign_key="question.id")
    agent_id: int = Field(foreign_key="agent.id", index=True)
    policy_version: int
    group_id: str = _str()
    sample_index: int
    prompt_token_ids: bytes = _blob()
    completion_token_ids: bytes = _blob()
    loss_mask: bytes = _blob()
    behaviour_logprobs: bytes = _blob()
    n_completion_tokens: int = 0
    p_yes: float | None = None
    choice: int | None = None
    quantiles: list[float] = Field(default_factory=list, sa_column=Column(SafeJSON, nullable=False))
    probabilities: list[float] = Field(
        default_factory=list,
        sa_column=Column(SafeJSON, nullable=False, server_default=text("'[]'")),
    )
    """Choice answers: P(option i) for every option (migration 0005); empty otherwise."""
    parse_status: str = _str()
    stop_reason: str = _str()
    sampling: dict[str, Any] = _json()
    timings: dict[str, Any] = _json()
    as_of: datetime | None = _utc(nullable=True)
    created_at: datetime = _utc()


class TurnRow(SQLModel, table=True):
    __tablename__ = "turn"
    __table_args__ = (UniqueConstraint("rollout_id", "index", name="uq_turn_index"),)

    id: int | None = Field(default=None, primary_key=True)
    rollout_id: int = Field(foreign_key="rollout.id", index=True)
    index: int
    role: str = _str()
    text: str = _text()
    token_start: int = 0
    token_end: int = 0
    tool_name: str | None = _str(None)
    tool_args: str | None = _str(None)
    tool_result_ids: list[int] = Field(
        default_factory=list, sa_column=Column(SafeJSON, nullable=False)
    )
    belief: float | None = None


class RewardRow(SQLModel, table=True):
    __tablename__ = "reward"
    __table_args__ = (
        UniqueConstraint("rollout_id", "reward_fn", "outcome_revision", name="uq_reward_once"),
    )

    id: int | None = Field(default=None, primary_key=True)
    rollout_id: int = Field(foreign_key="rollout.id")
    """Looked up through uq_reward_once, whose leading column it is."""
    reward_fn: str = _str()
    outcome_revision: int
    """0 for a provisional (label-free) reward made before any outcome existed."""
    value: float
    components: dict[str, Any] = _json()
    voided: bool = False
    provisional: bool = False
    created_at: datetime = _utc()
    made_at: datetime | None = _utc(nullable=True)
    """The run's as-of when written (migration 0007); created_at is the wall clock."""


class TrainingRunRow(SQLModel, table=True):
    __tablename__ = "training_run"

    id: int | None = Field(default=None, primary_key=True)
    agent_id: int = Field(foreign_key="agent.id", index=True)
    from_version: int
    to_version: int | None = None
    config: dict[str, Any] = _json()
    status: str = _str("running")
    rollouts_consumed: int = 0
    error: str | None = _str(None)
    started_at: datetime = _utc()
    finished_at: datetime | None = _utc(nullable=True)
    made_at: datetime | None = _utc(nullable=True)
    """The run's as-of (migration 0007); started_at is the wall clock."""
    summary: dict[str, Any] = _json()
    """The update's health, written when it completes (migration 0009;
    flows.tracking_summary.update_summary)."""


class TrainStepRow(SQLModel, table=True):
    __tablename__ = "train_step"
    __table_args__ = (UniqueConstraint("training_run_id", "step", name="uq_train_step"),)

    id: int | None = Field(default=None, primary_key=True)
    training_run_id: int = Field(foreign_key="training_run.id", index=True)
    step: int
    loss: float
    clip_fraction: float | None = None
    kl_behaviour: float | None = None
    staleness: float | None = None
    tokens_per_s: float | None = None
    grad_norm: float | None = None
    metrics: dict[str, Any] = _json()


class ReplayConsumptionRow(SQLModel, table=True):
    """Which rollouts (with which reward revision) a training run of an agent trained on."""

    __tablename__ = "replay_consumption"
    __table_args__ = (
        UniqueConstraint(
            "training_run_id", "rollout_id", "outcome_revision", name="uq_consumption"
        ),
        Index("ix_consumption_agent_rollout", "agent_id", "rollout_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    training_run_id: int = Field(foreign_key="training_run.id")
    agent_id: int = Field(foreign_key="agent.id")
    rollout_id: int = Field(foreign_key="rollout.id")
    outcome_revision: int
    provisional: bool = False


class PredictionClaimRow(SQLModel, table=True):
    """A worker's lease on (question, agent, policy version) while it runs the group."""

    __tablename__ = "prediction_claim"
    __table_args__ = (
        UniqueConstraint("question_id", "agent_id", "policy_version", name="uq_claim"),
    )

    id: int | None = Field(default=None, primary_key=True)
    question_id: int = Field(foreign_key="question.id")
    agent_id: int = Field(foreign_key="agent.id")
    policy_version: int
    worker: str = _str()
    lease_expires_at: datetime = _utc()


class PipelineEventRow(SQLModel, table=True):
    """Problems and notable events per stage run (bad feed entries, broken pages …), counted."""

    __tablename__ = "pipeline_event"

    id: int | None = Field(default=None, primary_key=True)
    run_key: str = _str(index=True)
    stage: str = _str()
    source: str = _str("")
    level: str = _str("error")
    kind: str = _str()
    detail: str = _text()
    created_at: datetime = _utc()


class BackfillQueueRow(SQLModel, table=True):
    """A rollout whose rewards may be missing: queued at revision 0 when it is stored, and at
    revision k when its question's outcome revision k is stored. Filled by triggers
    (migration 0003), emptied by backfill once the rollout is scored (or its rewards voided)
    at a revision no older than the queued one."""

    __tablename__ = "backfill_queue"

    rollout_id: int = Field(
        sa_column=Column(Integer, ForeignKey("rollout.id", ondelete="CASCADE"), primary_key=True)
    )
    outcome_revision: int = 0
    question_id: int = Field(index=True)
