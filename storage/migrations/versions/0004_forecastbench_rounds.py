"""ForecastBench questions are one per round: every imported question's external_id starts
with its round's forecast due date ("2025-10-26/K8qazyZJ3tXyuLlzkkyk",
"2025-10-26/DAAA@2025-11-02"), so the same market posed in a later round is a question of
its own with that round's cut-off (futureworld.sources.forecastbench). Questions imported
before this rule are renamed from their stored `extra["forecast_due_date"]`; the downgrade
strips the prefix again.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-09 09:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import storage.types

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_question = sa.table(
    "question",
    sa.column("id", sa.Integer()),
    sa.column("source", sa.String()),
    sa.column("external_id", sa.String()),
    sa.column("extra", storage.types.JSONType),
)


def _imported() -> list[tuple[int, str, str]]:
    """(id, external_id, due date) of every imported ForecastBench question."""
    rows = op.get_bind().execute(
        sa.select(_question.c.id, _question.c.external_id, _question.c.extra).where(
            _question.c.source.like("forecastbench:%")
        )
    )
    return [
        (question_id, external_id, str((extra or {}).get("forecast_due_date", "")))
        for question_id, external_id, extra in rows
    ]


def _rename(renames: list[tuple[int, str]]) -> None:
    connection = op.get_bind()
    for question_id, external_id in renames:
        connection.execute(
            sa.update(_question)
            .where(_question.c.id == question_id)
            .values(external_id=external_id)
        )


def upgrade() -> None:
    _rename(
        [
            (question_id, f"{due}/{external_id}")
            for question_id, external_id, due in _imported()
            if due and not external_id.startswith(f"{due}/")
        ]
    )


def downgrade() -> None:
    _rename(
        [
            (question_id, external_id.removeprefix(f"{due}/"))
            for question_id, external_id, due in _imported()
            if due and external_id.startswith(f"{due}/")
        ]
    )
