"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 06:11:52.344396
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import storage.types

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    _create_tables()
    _create_full_text_search()


def _create_tables() -> None:
    op.create_table(
        "agent",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("base_model", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("backend", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("base_url", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("generation", storage.types.JSONType, nullable=False),
        sa.Column("created_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_table(
        "article",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("feed", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("guid", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("link", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("published_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("fetched_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("flags", storage.types.JSONType, nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("guid", name="uq_article_guid"),
        sa.UniqueConstraint("link", name="uq_article_link"),
    )
    with op.batch_alter_table("article", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_article_feed"), ["feed"], unique=False)
        batch_op.create_index(batch_op.f("ix_article_published_at"), ["published_at"], unique=False)

    op.create_table(
        "feed_state",
        sa.Column("url", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("etag", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("last_modified", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("last_fetched_at", storage.types.UTCDateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("url"),
    )
    op.create_table(
        "pipeline_event",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_key", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("stage", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("source", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("level", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("created_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("pipeline_event", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_pipeline_event_run_key"), ["run_key"], unique=False)

    op.create_table(
        "question",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("source", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("external_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("background", sa.Text(), nullable=False),
        sa.Column("resolution_criteria", sa.Text(), nullable=False),
        sa.Column("url", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("domain", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("created_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("info_cutoff_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("close_at", storage.types.UTCDateTime(timezone=True), nullable=True),
        sa.Column("resolve_by", storage.types.UTCDateTime(timezone=True), nullable=True),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("crowd_probability", sa.Float(), nullable=True),
        sa.Column("options", storage.types.JSONType, nullable=False),
        sa.Column("extra", storage.types.JSONType, nullable=False),
        sa.Column("harvested_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("source", "external_id", name="uq_question_source_ext"),
    )
    with op.batch_alter_table("question", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_question_domain"), ["domain"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_question_info_cutoff_at"), ["info_cutoff_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_question_source"), ["source"], unique=False)
        batch_op.create_index(batch_op.f("ix_question_status"), ["status"], unique=False)

    op.create_table(
        "outcome",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("question_id", sa.Integer(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("resolved_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("raw", storage.types.JSONType, nullable=False),
        sa.Column("recorded_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["question_id"],
            ["question.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("question_id", "revision", name="uq_outcome_revision"),
    )
    with op.batch_alter_table("outcome", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_outcome_question_id"), ["question_id"], unique=False)

    op.create_table(
        "policy_version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("parent_version", sa.Integer(), nullable=True),
        sa.Column("checkpoint_path", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("checkpoint_sha256", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("training_run_id", sa.Integer(), nullable=True),
        sa.Column("created_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agent.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("agent_id", "version", name="uq_policy_version"),
    )
    with op.batch_alter_table("policy_version", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_policy_version_agent_id"), ["agent_id"], unique=False)

    op.create_table(
        "prediction_claim",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("question_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("worker", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("lease_expires_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agent.id"],
        ),
        sa.ForeignKeyConstraint(
            ["question_id"],
            ["question.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("question_id", "agent_id", "policy_version", name="uq_claim"),
    )
    op.create_table(
        "rollout",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("question_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("group_id", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("sample_index", sa.Integer(), nullable=False),
        sa.Column("prompt_token_ids", sa.LargeBinary(), nullable=False),
        sa.Column("completion_token_ids", sa.LargeBinary(), nullable=False),
        sa.Column("loss_mask", sa.LargeBinary(), nullable=False),
        sa.Column("behaviour_logprobs", sa.LargeBinary(), nullable=False),
        sa.Column("n_completion_tokens", sa.Integer(), nullable=False),
        sa.Column("p_yes", sa.Float(), nullable=True),
        sa.Column("choice", sa.Integer(), nullable=True),
        sa.Column("quantiles", storage.types.JSONType, nullable=False),
        sa.Column("parse_status", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("stop_reason", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("sampling", storage.types.JSONType, nullable=False),
        sa.Column("timings", storage.types.JSONType, nullable=False),
        sa.Column("as_of", storage.types.UTCDateTime(timezone=True), nullable=True),
        sa.Column("created_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agent.id"],
        ),
        sa.ForeignKeyConstraint(
            ["question_id"],
            ["question.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("idempotency_key"),
        sa.UniqueConstraint(
            "question_id", "agent_id", "policy_version", "sample_index", name="uq_rollout_sample"
        ),
    )
    with op.batch_alter_table("rollout", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_rollout_agent_id"), ["agent_id"], unique=False)
        batch_op.create_index(
            "ix_rollout_group", ["question_id", "agent_id", "policy_version"], unique=False
        )

    op.create_table(
        "training_run",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("from_version", sa.Integer(), nullable=False),
        sa.Column("to_version", sa.Integer(), nullable=True),
        sa.Column("config", storage.types.JSONType, nullable=False),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("rollouts_consumed", sa.Integer(), nullable=False),
        sa.Column("error", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("started_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.Column("finished_at", storage.types.UTCDateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agent.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("training_run", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_training_run_agent_id"), ["agent_id"], unique=False)

    op.create_table(
        "replay_consumption",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("training_run_id", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.Integer(), nullable=False),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("outcome_revision", sa.Integer(), nullable=False),
        sa.Column("provisional", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["agent_id"],
            ["agent.id"],
        ),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollout.id"],
        ),
        sa.ForeignKeyConstraint(
            ["training_run_id"],
            ["training_run.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint(
            "training_run_id", "rollout_id", "outcome_revision", name="uq_consumption"
        ),
    )
    with op.batch_alter_table("replay_consumption", schema=None) as batch_op:
        batch_op.create_index(
            "ix_consumption_agent_rollout", ["agent_id", "rollout_id"], unique=False
        )

    op.create_table(
        "reward",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("reward_fn", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("outcome_revision", sa.Integer(), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("components", storage.types.JSONType, nullable=False),
        sa.Column("voided", sa.Boolean(), nullable=False),
        sa.Column("provisional", sa.Boolean(), nullable=False),
        sa.Column("created_at", storage.types.UTCDateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollout.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("rollout_id", "reward_fn", "outcome_revision", name="uq_reward_once"),
    )
    with op.batch_alter_table("reward", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_reward_rollout_id"), ["rollout_id"], unique=False)

    op.create_table(
        "train_step",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("training_run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=False),
        sa.Column("clip_fraction", sa.Float(), nullable=True),
        sa.Column("kl_behaviour", sa.Float(), nullable=True),
        sa.Column("staleness", sa.Float(), nullable=True),
        sa.Column("tokens_per_s", sa.Float(), nullable=True),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.Column("metrics", storage.types.JSONType, nullable=False),
        sa.ForeignKeyConstraint(
            ["training_run_id"],
            ["training_run.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("training_run_id", "step", name="uq_train_step"),
    )
    with op.batch_alter_table("train_step", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_train_step_training_run_id"), ["training_run_id"], unique=False
        )

    op.create_table(
        "turn",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("role", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("token_start", sa.Integer(), nullable=False),
        sa.Column("token_end", sa.Integer(), nullable=False),
        sa.Column("tool_name", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("tool_args", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("tool_result_ids", storage.types.JSONType, nullable=False),
        sa.Column("belief", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(
            ["rollout_id"],
            ["rollout.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("rollout_id", "index", name="uq_turn_index"),
    )
    with op.batch_alter_table("turn", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_turn_rollout_id"), ["rollout_id"], unique=False)


def downgrade() -> None:
    _drop_full_text_search()
    with op.batch_alter_table("turn", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_turn_rollout_id"))

    op.drop_table("turn")
    with op.batch_alter_table("train_step", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_train_step_training_run_id"))

    op.drop_table("train_step")
    with op.batch_alter_table("reward", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_reward_rollout_id"))

    op.drop_table("reward")
    with op.batch_alter_table("replay_consumption", schema=None) as batch_op:
        batch_op.drop_index("ix_consumption_agent_rollout")

    op.drop_table("replay_consumption")
    with op.batch_alter_table("training_run", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_training_run_agent_id"))

    op.drop_table("training_run")
    with op.batch_alter_table("rollout", schema=None) as batch_op:
        batch_op.drop_index("ix_rollout_group")
        batch_op.drop_index(batch_op.f("ix_rollout_agent_id"))

    op.drop_table("rollout")
    op.drop_table("prediction_claim")
    with op.batch_alter_table("policy_version", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_policy_version_agent_id"))

    op.drop_table("policy_version")
    with op.batch_alter_table("outcome", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_outcome_question_id"))

    op.drop_table("outcome")
    with op.batch_alter_table("question", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_question_status"))
        batch_op.drop_index(batch_op.f("ix_question_source"))
        batch_op.drop_index(batch_op.f("ix_question_info_cutoff_at"))
        batch_op.drop_index(batch_op.f("ix_question_domain"))

    op.drop_table("question")
    with op.batch_alter_table("pipeline_event", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_pipeline_event_run_key"))

    op.drop_table("pipeline_event")
    op.drop_table("feed_state")
    with op.batch_alter_table("article", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_article_published_at"))
        batch_op.drop_index(batch_op.f("ix_article_feed"))

    op.drop_table("article")
    op.drop_table("agent")


def _create_full_text_search() -> None:
    """Postgres: a generated tsvector column with a GIN index. SQLite: an FTS5 mirror kept
    in sync by triggers. storage.search queries whichever the dialect has."""
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "ALTER TABLE article ADD COLUMN search_vector tsvector GENERATED ALWAYS AS ("
            "setweight(to_tsvector('english', coalesce(title, '')), 'A') || "
            "setweight(to_tsvector('english', coalesce(summary, '')), 'B') || "
            "setweight(to_tsvector('english', coalesce(body, '')), 'C')) STORED"
        )
        op.execute("CREATE INDEX ix_article_search ON article USING GIN (search_vector)")
        return
    op.execute(
        "CREATE VIRTUAL TABLE article_fts USING fts5("
        "title, summary, body, content='article', content_rowid='id', tokenize='porter unicode61')"
    )
    op.execute(
        "CREATE TRIGGER article_fts_insert AFTER INSERT ON article BEGIN "
        "INSERT INTO article_fts(rowid, title, summary, body) "
        "VALUES (new.id, new.title, new.summary, new.body); END"
    )
    op.execute(
        "CREATE TRIGGER article_fts_delete AFTER DELETE ON article BEGIN "
        "INSERT INTO article_fts(article_fts, rowid, title, summary, body) "
        "VALUES ('delete', old.id, old.title, old.summary, old.body); END"
    )
    op.execute(
        "CREATE TRIGGER article_fts_update AFTER UPDATE ON article BEGIN "
        "INSERT INTO article_fts(article_fts, rowid, title, summary, body) "
        "VALUES ('delete', old.id, old.title, old.summary, old.body); "
        "INSERT INTO article_fts(rowid, title, summary, body) "
        "VALUES (new.id, new.title, new.summary, new.body); END"
    )


def _drop_full_text_search() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_article_search")
        op.execute("ALTER TABLE article DROP COLUMN IF EXISTS search_vector")
        return
    for trigger in ("article_fts_insert", "article_fts_delete", "article_fts_update"):
        op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
    op.execute("DROP TABLE IF EXISTS article_fts")
