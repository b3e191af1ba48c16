"""policy_version.status (candidate | promoted | rejected) and status_reason, and the promotion
gate's validation record: questions scored, Brier, parse rate and its forecasts of the held-out
questions (question id → each rollout's P(yes)).

Every version registered before this revision was served as soon as it was registered, so it
becomes promoted with an empty reason and no validation record. The columns are added in place
(ALTER TABLE … ADD COLUMN with server defaults), never by SQLite's batch copy, which would
drop the triggers on the tables it copies.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.types

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    "status",
    "status_reason",
    "validation_questions",
    "validation_brier",
    "validation_parse_rate",
    "validation_forecasts",
)


def upgrade() -> None:
    op.add_column(
        "policy_version",
        sa.Column("status", sa.String(), nullable=False, server_default=sa.text("'promoted'")),
    )
    op.add_column(
        "policy_version",
        sa.Column("status_reason", sa.Text(), nullable=False, server_default=sa.text("''")),
    )
    op.add_column(
        "policy_version",
        sa.Column(
            "validation_questions", sa.Integer(), nullable=False, server_default=sa.text("0")
        ),
    )
    op.add_column("policy_version", sa.Column("validation_brier", sa.Float(), nullable=True))
    op.add_column("policy_version", sa.Column("validation_parse_rate", sa.Float(), nullable=True))
    op.add_column(
        "policy_version",
        sa.Column(
            "validation_forecasts",
            storage.types.JSONType,
            nullable=False,
            server_default=sa.text("'{}'"),
        ),
    )


def downgrade() -> None:
    for column in reversed(_COLUMNS):
        op.drop_column("policy_version", column)
