"""rollout.probabilities: a choice answer's probability of every option (a JSON list, empty for
binary and numeric rollouts), next to its chosen option (`choice`) and confidence (`p_yes`)

The column is added in place (ALTER TABLE … ADD COLUMN with a server default of an empty
list), not by SQLite's batch copy-and-rename, which would drop the backfill-queue trigger on
`rollout`. Existing rollouts were all answered before choice answers were stored, so they get
the empty list.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 16:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.types

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "rollout",
        sa.Column(
            "probabilities",
            storage.types.JSONType,
            nullable=False,
            server_default=sa.text("'[]'"),
        ),
    )


def downgrade() -> None:
    op.drop_column("rollout", "probabilities")
