"""What went wrong in one stage run, item by item: readable lines for the report, and the same
as pipeline events in the store (counted per source and kind in the cycle summary). Harvest
and resolve record every item-level problem through one collector."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine

from storage.engine import session_scope
from storage.repositories.events import PipelineEvent, record_events


@dataclass
class Problems:
    """What went wrong in one stage run: readable lines for the report, and the same as
    pipeline events in the store (counted per source and kind in the cycle summary)."""

    run_key: str
    stage: str
    lines: list[str] = field(default_factory=list)
    events: list[PipelineEvent] = field(default_factory=list)

    def add(self, source: str, kind: str, detail: str, *, level: str = "error") -> None:
        self.lines.append(f"{source}: {detail}")
        self.events.append(
            PipelineEvent(
                run_key=self.run_key,
                stage=self.stage,
                source=source,
                kind=kind,
                detail=detail,
                level=level,
            )
        )

    def save(self, engine: Engine) -> None:
        with session_scope(engine) as session:
            record_events(session, self.events)
