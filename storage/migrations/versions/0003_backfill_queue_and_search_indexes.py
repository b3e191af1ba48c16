"""backfill_queue: what backfill has left to score, kept by triggers, so a run costs what
arrived since the last one and not the whole resolved history; search indexes for a
corpus of millions of articles

A rollout is queued when it is stored (outcome revision 0) and, when an outcome revision is
stored, every rollout of its question is queued at that revision (a queued rollout's revision
is raised, one row per rollout). Triggers fill the queue whatever
writes the rows (COPY, INSERT … ON CONFLICT, the ORM), in the writer's own transaction, so a
queued row is visible exactly when the rollout or outcome it stands for is. Postgres uses
statement-level triggers over transition tables (one INSERT … SELECT per COPY); SQLite uses
row triggers.

The reward table loses its index on rollout_id alone: the unique (rollout_id, reward_fn,
outcome_revision) index serves the same lookups, and every reward written paid for both.

On upgrade the queue is seeded with every existing rollout that has no reward at its
question's current outcome revision (or no outcome yet): backfill writes a rollout's rewards
for a revision in one transaction, so one reward at the current revision means all of them.

Search: article gets a (published_at, id) index in place of the one on published_at alone,
so "the newest matches before the cut-off" is a backward index scan with no sort (what
storage.search ranks on Postgres). On Postgres the search vector's statistics target is
raised to 1000, so the planner knows the frequency of ten thousand lexemes instead of one
thousand and chooses well between that scan (frequent terms) and the GIN bitmap (rare ones).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-08 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_POSTGRES_TRIGGERS = (
    """
    CREATE FUNCTION backfill_queue_rollouts() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO backfill_queue (rollout_id, outcome_revision, question_id)
        SELECT id, 0, question_id FROM inserted_rollouts
        ON CONFLICT DO NOTHING;
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER rollout_backfill_queue AFTER INSERT ON rollout
    REFERENCING NEW TABLE AS inserted_rollouts
    FOR EACH STATEMENT EXECUTE FUNCTION backfill_queue_rollouts()
    """,
    """
    CREATE FUNCTION backfill_queue_outcomes() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO backfill_queue (rollout_id, outcome_revision, question_id)
        SELECT r.id, o.revision, r.question_id
        FROM inserted_outcomes o JOIN rollout r ON r.question_id = o.question_id
        ON CONFLICT (rollout_id) DO UPDATE SET outcome_revision =
            greatest(backfill_queue.outcome_revision, excluded.outcome_revision);
        RETURN NULL;
    END $$
    """,
    """
    CREATE TRIGGER outcome_backfill_queue AFTER INSERT ON outcome
    REFERENCING NEW TABLE AS inserted_outcomes
    FOR EACH STATEMENT EXECUTE FUNCTION backfill_queue_outcomes()
    """,
)

_SQLITE_TRIGGERS = (
    """
    CREATE TRIGGER rollout_backfill_queue AFTER INSERT ON rollout BEGIN
        INSERT OR IGNORE INTO backfill_queue (rollout_id, outcome_revision, question_id)
        VALUES (new.id, 0, new.question_id);
    END
    """,
    """
    CREATE TRIGGER outcome_backfill_queue AFTER INSERT ON outcome BEGIN
        INSERT INTO backfill_queue (rollout_id, outcome_revision, question_id)
        SELECT id, new.revision, question_id FROM rollout WHERE question_id = new.question_id
        ON CONFLICT (rollout_id) DO UPDATE SET outcome_revision =
            max(backfill_queue.outcome_revision, excluded.outcome_revision);
    END
    """,
)

_SEED = """
    INSERT INTO backfill_queue (rollout_id, outcome_revision, question_id)
    SELECT r.id, 0, r.question_id FROM rollout r
    WHERE NOT EXISTS (
        SELECT 1 FROM reward w
        WHERE w.rollout_id = r.id
          AND w.outcome_revision = (
              SELECT max(o.revision) FROM outcome o WHERE o.question_id = r.question_id
          )
    )
"""


def upgrade() -> None:
    op.create_table(
        "backfill_queue",
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("outcome_revision", sa.Integer(), nullable=False),
        sa.Column("question_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["rollout_id"], ["rollout.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("rollout_id"),
    )
    op.create_index("ix_backfill_queue_question_id", "backfill_queue", ["question_id"])
    postgres = op.get_bind().dialect.name == "postgresql"
    for statement in _POSTGRES_TRIGGERS if postgres else _SQLITE_TRIGGERS:
        op.execute(statement)
    if postgres:
        # A queue: every row is deleted soon after it is written. Vacuum it after every
        # 10,000 dead rows, not after 20% of its (small) size, so scans skip no dead tuples.
        op.execute(
            "ALTER TABLE backfill_queue SET (autovacuum_vacuum_scale_factor = 0, "
            "autovacuum_vacuum_threshold = 10000, autovacuum_analyze_scale_factor = 0, "
            "autovacuum_analyze_threshold = 10000)"
        )
    op.execute(_SEED)
    # uq_reward_once (rollout_id, reward_fn, outcome_revision) serves lookups by rollout.
    with op.batch_alter_table("reward") as batch:
        batch.drop_index("ix_reward_rollout_id")
    with op.batch_alter_table("article") as batch:
        batch.create_index("ix_article_published_at_id", ["published_at", "id"], unique=False)
        batch.drop_index("ix_article_published_at")
    if postgres:
        op.execute("ALTER TABLE article ALTER COLUMN search_vector SET STATISTICS 1000")
        op.execute("ANALYZE article")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE article ALTER COLUMN search_vector SET STATISTICS -1")
    with op.batch_alter_table("article") as batch:
        batch.create_index("ix_article_published_at", ["published_at"], unique=False)
        batch.drop_index("ix_article_published_at_id")
    with op.batch_alter_table("reward") as batch:
        batch.create_index("ix_reward_rollout_id", ["rollout_id"], unique=False)
    postgres = op.get_bind().dialect.name == "postgresql"
    op.execute("DROP TRIGGER IF EXISTS rollout_backfill_queue" + (" ON rollout" * postgres))
    op.execute("DROP TRIGGER IF EXISTS outcome_backfill_queue" + (" ON outcome" * postgres))
    if postgres:
        op.execute("DROP FUNCTION IF EXISTS backfill_queue_rollouts()")
        op.execute("DROP FUNCTION IF EXISTS backfill_queue_outcomes()")
    op.drop_index("ix_backfill_queue_question_id", table_name="backfill_queue")
    op.drop_table("backfill_queue")
