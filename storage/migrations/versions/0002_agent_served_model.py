"""agent.served_model: the served name on an OpenAI-compatible server is the agent's own field,
no longer a key inside its generation settings

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 15:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
import sqlmodel
from alembic import op

import storage.types

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("agent") as batch:
        batch.add_column(
            sa.Column("served_model", sqlmodel.sql.sqltypes.AutoString(), nullable=True)
        )
    agent = sa.table(
        "agent",
        sa.column("id", sa.Integer()),
        sa.column("generation", storage.types.JSONType),
        sa.column("served_model", sa.String()),
    )
    connection = op.get_bind()
    for agent_id, generation in connection.execute(sa.select(agent.c.id, agent.c.generation)):
        settings = dict(generation or {})
        if "served_model" not in settings:
            continue
        served = settings.pop("served_model")
        connection.execute(
            sa.update(agent)
            .where(agent.c.id == agent_id)
            .values(served_model=served, generation=settings)
        )


def downgrade() -> None:
    with op.batch_alter_table("agent") as batch:
        batch.drop_column("served_model")
