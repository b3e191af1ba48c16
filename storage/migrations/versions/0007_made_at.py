"""reward.made_at and training_run.made_at: the pipeline's instant (the run's as-of: live, the
wall clock; in a backtest or a past-dated run, its simulated time) at which a reward was
written or a training run started, next to the wall-clock created_at / started_at.

Rows written before this revision get NULL: their simulated time was not recorded.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.types

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    for table in ("reward", "training_run"):
        op.add_column(table, sa.Column("made_at", storage.types.UTCDateTime(), nullable=True))


def downgrade() -> None:
    for table in ("reward", "training_run"):
        op.drop_column(table, "made_at")
