"""training_run.summary: the update's health as numbers (flows.tracking_summary.update_summary:
groups, reward mean and spread, the share of groups whose answers are all identical, parse
rate, mean answer length, advantage spread, largest kl_prox), written when the run completes.

Rows written before this revision get an empty summary.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.types

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "training_run",
        sa.Column(
            "summary", storage.types.SafeJSON(), nullable=False, server_default=sa.text("'{}'")
        ),
    )


def downgrade() -> None:
    op.drop_column("training_run", "summary")
