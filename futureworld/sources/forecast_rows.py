"""The rows of an outside forecast file, whatever its format: its formats, a well-formed row
(a P(yes) of a question at a time), the file before it meets the stored questions, a refused
row's error, and the field parsers every format shares (forecast_files.py's docstring).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from enum import StrEnum
from typing import Any

QuestionKey = tuple[str, str]
"""(Question.source, Question.external_id)."""


class ForecastFormat(StrEnum):
    FORECASTBENCH = "forecastbench"
    """A ForecastBench submission: one JSON object with a `forecasts` list."""
    CSV = "csv"
    """A header row, then one forecast a row."""
    JSONL = "jsonl"
    """One JSON object a line; blank lines skipped."""


class ForecastFileError(ValueError):
    """The file as a whole cannot be read: no row of it can load."""


@dataclass(frozen=True, order=True)
class RowError:
    line: int
    problem: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.problem}"


@dataclass(frozen=True, kw_only=True)
class ForecastRow:
    """One well-formed row: a P(yes) of the question keyed (source, external_id) at a time."""

    line: int
    source: str
    external_id: str
    p_yes: float
    forecast_at: datetime

    @property
    def key(self) -> QuestionKey:
        return (self.source, self.external_id)


@dataclass(frozen=True, kw_only=True)
class ForecastFile:
    """What a file holds before it meets the stored questions."""

    file_format: ForecastFormat
    rows: list[ForecastRow]
    errors: list[RowError] = field(default_factory=list)
    organization: str | None = None
    """ForecastBench only: who submitted it, and the model."""
    model: str | None = None

    @property
    def row_count(self) -> int:
        return len(self.rows) + len(self.errors)


class BadValue(ValueError):
    """One field of one row that is wrong; the message says which and how."""


def parse_forecast_time(value: Any, name: str = "forecast_at") -> datetime:
    """A forecast time as tz-aware UTC: ISO 8601 with a zone, or a date alone (00:00 UTC)."""
    if not isinstance(value, str) or not value.strip():
        raise BadValue(
            f"{name}: missing" if value in (None, "") else f"{name}: {value!r} is not a time"
        )
    text = value.strip()
    try:
        return datetime.combine(date.fromisoformat(text), time(0, 0), tzinfo=UTC)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadValue(f"{name}: {text!r} is not an ISO 8601 time or date") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise BadValue(f"{name}: {text!r} has no time zone")
    return parsed.astimezone(UTC)


def parse_probability(value: Any, name: str, *, from_text: bool) -> float:
    if from_text and isinstance(value, str):
        if not value.strip():
            raise BadValue(f"{name}: missing")
        try:
            value = float(value)
        except ValueError:
            raise BadValue(f"{name}: {value.strip()!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadValue(f"{name}: {value!r} is not a number")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise BadValue(f"{name}: {value!r} is outside [0, 1]")
    return float(value)


def row_text(row: Mapping[str, Any], name: str) -> str:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise BadValue(f"{name}: missing")
    if not isinstance(value, str):
        raise BadValue(f"{name}: must be text, got {type(value).__name__}")
    return value.strip()
