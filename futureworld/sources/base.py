"""Shared result types of the platform adapters and the small parsers they all need.

Adapters return these domain-level objects; storing them (and numbering outcome revisions)
is the caller's job.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from futureworld.domain import OutcomeStatus, Question, require_utc


@dataclass(frozen=True, kw_only=True)
class SourceResolution:
    """What a source says about one question's outcome right now."""

    source: str
    """Source name, as in Question.source."""
    external_id: str
    """The source's own id of the question."""
    status: OutcomeStatus
    """resolved, or annulled (cancelled / ambiguous / 50-50)."""
    value: float | None
    """1.0/0.0 for binary (a probability for Manifold MKT); None if annulled."""
    resolved_at: datetime
    """When the source resolved it (tz-aware UTC); fetch time when the source gives none."""
    final: bool = True
    """False while the source may still change it (Kalshi `determined`)."""
    raw: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """The source's payload for the question, as received (never holds our secrets)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "resolved_at", require_utc(self.resolved_at, "resolved_at"))
        if self.status is OutcomeStatus.RESOLVED and self.value is None:
            raise ValueError(f"{self.source}/{self.external_id}: resolved without a value")
        if self.status is OutcomeStatus.ANNULLED and self.value is not None:
            raise ValueError(f"{self.source}/{self.external_id}: annulled but has a value")


@dataclass(frozen=True, kw_only=True)
class HarvestResult:
    """Open questions from one harvest, plus what went wrong and what was skipped."""

    questions: list[Question]
    """Deduplicated by external_id, in the order the source listed them."""
    errors: list[str] = field(default_factory=list)
    """One readable line per failure (a page that failed, an item that could not be parsed)."""
    counts: Counter[str] = field(default_factory=Counter)
    """seen, harvested, pages, skipped_<reason>, …"""


@dataclass(frozen=True, kw_only=True)
class ResolveResult:
    """Current resolutions of the asked ids; ids still open are simply absent."""

    resolutions: list[SourceResolution]
    errors: list[str] = field(default_factory=list)


def from_ms(value: Any) -> datetime | None:
    """Epoch milliseconds (Manifold) to UTC; None when absent."""
    if value is None or value == "":
        return None
    return datetime.fromtimestamp(float(value) / 1000.0, UTC)


def from_iso(value: Any) -> datetime | None:
    """An ISO 8601 string ('Z' accepted) to UTC; a naive one is taken as UTC; None when absent."""
    if value is None or value == "":
        return None
    text = str(value).strip().replace("Z", "+00:00").replace("z", "+00:00")
    if " " in text and "T" not in text:
        text = text.replace(" ", "T", 1)
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def clamp_probability(value: Any) -> float | None:
    """A crowd probability in [0, 1], or None when missing or not a number."""
    if value is None or value == "":
        return None
    try:
        p = float(value)
    except (TypeError, ValueError):
        return None
    if p != p:  # NaN
        return None
    return min(1.0, max(0.0, p))
