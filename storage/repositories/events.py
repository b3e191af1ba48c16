"""Pipeline events: what went wrong (or was skipped) in a stage run, recorded and counted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from futureworld.domain import utc_now
from storage.tables import PipelineEventRow


@dataclass(frozen=True, kw_only=True)
class PipelineEvent:
    run_key: str
    stage: str
    kind: str
    detail: str = ""
    source: str = ""
    level: str = "error"


def record_events(session: Session, events: Sequence[PipelineEvent]) -> None:
    now = utc_now()
    session.add_all(
        PipelineEventRow(
            run_key=e.run_key,
            stage=e.stage,
            source=e.source,
            level=e.level,
            kind=e.kind,
            detail=e.detail,
            created_at=now,
        )
        for e in events
    )


def event_counts(session: Session, run_key: str) -> Counter[tuple[str, str, str]]:
    """(stage, source, kind) → count for one run."""
    rows = session.execute(
        select(PipelineEventRow.stage, PipelineEventRow.source, PipelineEventRow.kind).where(
            PipelineEventRow.run_key == run_key
        )
    ).all()
    return Counter((stage, source, kind) for stage, source, kind in rows)
