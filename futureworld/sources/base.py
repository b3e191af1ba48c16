"""Shared result types and errors of the platform adapters, and the small parsers they all
need (required fields, times, probabilities). The paging and resolution loops they run are
paging.py's; storing the results (and numbering outcome revisions) is the caller's job.

Errors are isolated per item: whatever one page, listed item or per-id request raises
(any SourceError, a malformed payload, a RecursionError, a bug tripped by one odd payload) is
caught at that item's boundary and becomes one error line naming the item and its URL; the
other items go on. Numbers that are not finite (JSON `Infinity`, `NaN`) make their item
malformed rather than being clamped into range, and a required text or id that is null, empty
or of the wrong type (`required_text`, `required_id`) makes it malformed rather than being
stored as the text "None" or "42".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from futureworld.domain import OutcomeStatus, Question, require_utc
from futureworld.sources.http import SourceError

MALFORMED_ERRORS = (AttributeError, KeyError, TypeError, ValueError, ArithmeticError)
"""What parsing a payload of the wrong shape raises (ArithmeticError: an epoch time of
`Infinity`); caught per item, never per harvest."""


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


class PageError(Exception):
    """A page the source answered but in the wrong shape; the message is the whole error line."""


class ItemError(Exception):
    """One item that failed; the message is the whole error line (it names the item's URL)."""


class FieldError(ValueError):
    """A required field of an item that is missing, null, empty or of the wrong type; the
    message names the field and what was wrong."""


def describe_error(exc: BaseException) -> str:
    """An exception as it appears inside an error line: its own message for the errors whose
    message is a whole line or names its field, else `Type: message` (capped, on one line)."""
    if isinstance(exc, SourceError | PageError | ItemError | FieldError):
        return str(exc)
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


class SkipItem(Exception):
    """A listed item left out of a harvest, counted as `skipped_<reason>`."""

    def __init__(self, reason: str, error: str | None = None) -> None:
        self.reason = reason
        self.error = error
        """The error line to record, for items that are broken rather than merely unwanted."""
        super().__init__(error or reason)


@dataclass(frozen=True, kw_only=True)
class Page:
    """One page of a listing and where the next one starts."""

    items: list[Any]
    """The listed items, as received."""
    next_cursor: Any = None
    """Passed to the next fetch; None (or the cursor of this page again) ends paging."""
    end_error: str | None = None
    """Recorded when paging ends here for want of a usable cursor (not when the limit is hit)."""


def listed_items(page: Any, key: str, *, source: str, url: str) -> list[Any]:
    """`page[key]` of a JSON object page that lists its items there; PageError otherwise."""
    items = page.get(key) if isinstance(page, dict) else None
    if not isinstance(items, list):
        raise PageError(f"{source}: {url}: expected {{'{key}': [...]}}, got {str(page)[:120]}")
    return items


@contextmanager
def malformed_item(label: str) -> Iterator[None]:
    """Turns a parse failure inside the block into SkipItem("malformed", "<label> is malformed")."""
    try:
        yield
    except MALFORMED_ERRORS as exc:
        raise SkipItem("malformed", f"{label} is malformed: {describe_error(exc)}") from exc


def _required(payload: Any, key: str | int, name: str) -> Any:
    try:
        value = payload[key]
    except (KeyError, IndexError, TypeError):
        raise FieldError(f"{name} is missing") from None
    if value is None:
        raise FieldError(f"{name} is null")
    return value


def required_text(payload: Any, key: str | int, *, name: str | None = None) -> str:
    """`payload[key]` (a dict's field or a list's entry) as text, stripped; FieldError naming
    the field (`name`, default the key) when it is missing, null, not a string, or empty or
    only whitespace."""
    name = name or str(key)
    value = _required(payload, key, name)
    if not isinstance(value, str):
        raise FieldError(f"{name} is not text (got {type(value).__name__} {value!r:.60})")
    if not value.strip():
        raise FieldError(f"{name} is empty ({value!r:.20})")
    return value.strip()


def required_id(payload: Any, key: str | int, *, name: str | None = None) -> str:
    """`payload[key]` as an id, as text: a non-empty string or an integer (not a bool);
    FieldError naming the field otherwise."""
    name = name or str(key)
    value = _required(payload, key, name)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise FieldError(
            f"{name} is not a string or an integer (got {type(value).__name__} {value!r:.60})"
        )
    if not str(value).strip():
        raise FieldError(f"{name} is empty ({value!r:.20})")
    return str(value)


def close_skip_reason(
    close_time: Any, parse: Callable[[Any], datetime | None], now: datetime
) -> str | None:
    """The last screen of a listed item, by its close time as received: "malformed" when
    `parse` cannot read it, "closed" when it is not after `now`, None when it may stay."""
    try:
        close_at = parse(close_time)
    except (*MALFORMED_ERRORS, OSError):
        return "malformed"
    if close_at is not None and close_at <= now:
        return "closed"
    return None


def from_ms(value: Any) -> datetime | None:
    """Epoch milliseconds (Manifold) to UTC; None when absent; ValueError when not finite."""
    if value is None or value == "":
        return None
    ms = float(value)
    if not math.isfinite(ms):
        raise ValueError(f"time {value!r} is not a finite number of milliseconds")
    return datetime.fromtimestamp(ms / 1000.0, UTC)


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
    """A crowd probability in [0, 1], or None when missing or not a number.

    Raises ValueError for a number that is not finite (`Infinity`, `-Infinity`, `NaN`, as
    JSON decoders accept them): such a payload is broken, and its item is rejected."""
    if value is None or value == "":
        return None
    try:
        p = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(p):
        raise ValueError(f"probability {value!r} is not a finite number")
    return min(1.0, max(0.0, p))


ARTICLE_TEXT_FIELDS = ("feed", "guid", "link", "title", "summary", "body")


def fields_with_nul(item: Any, names: Iterable[str]) -> list[str]:
    """The names among `names` whose text on `item` holds NUL (U+0000): the item is kept (the
    store writes NUL as U+FFFD) and its source reports which fields held it."""
    return [name for name in names if "\x00" in (getattr(item, name) or "")]
