"""What went wrong in one stage run, item by item: readable lines for the report, and the same
as pipeline events in the store (counted per source and kind in the cycle summary). Harvest
and resolve record every item-level problem through one collector, and judge each source they
asked by what came back (SourceStatus): `failed` when nothing came through, `partial` when
some items failed, `ok` otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from sqlalchemy import Engine

from storage.engine import session_scope
from storage.repositories.events import PipelineEvent, record_events


class SourceStatus(StrEnum):
    """How one source of a harvest or resolve run went."""

    OK = "ok"
    """Everything asked for came back."""
    PARTIAL = "partial"
    """Some items (a feed, a page, a market) failed; the rest was stored."""
    FAILED = "failed"
    """Nothing came through: the source is unreachable, unknown or answered only errors."""


def source_verdict(statuses: Mapping[str, SourceStatus]) -> str | None:
    """One line on the sources that did not go well ("failed: nothing came through from …",
    "partial: some items failed in …"); None when every source is ok. A failed source
    outweighs partial ones."""
    failed = sorted(name for name, status in statuses.items() if status is SourceStatus.FAILED)
    partial = sorted(name for name, status in statuses.items() if status is SourceStatus.PARTIAL)
    if failed:
        also = f"; partial: {', '.join(partial)}" if partial else ""
        return f"failed: nothing came through from {', '.join(failed)}{also}"
    if partial:
        return f"partial: some items failed in {', '.join(partial)}"
    return None


def any_failed(statuses: Mapping[str, SourceStatus]) -> bool:
    return any(status is SourceStatus.FAILED for status in statuses.values())


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
