"""Plausibility of an article's stated publication time: the one rule the feed reader and the
archive importer share.

A stated date before EARLIEST_PLAUSIBLE_AT (1990-01-01 UTC, before any web news) or more than
FUTURE_TOLERANCE (a day) after the article was first seen is implausible: feeds emit 0001-01-01,
1900-01-01 and 9999-12-31 for "unknown". A live article with such a date keeps it as stated,
carries the IMPLAUSIBLE_DATE flag, and is reported as a feed problem; the store makes it
visible from its fetch time (storage.repositories.articles). An archive row with one is refused.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EARLIEST_PLAUSIBLE_AT = datetime(1990, 1, 1, tzinfo=UTC)
"""Stated dates before this are placeholders, not publication times."""
FUTURE_TOLERANCE = timedelta(days=1)
"""How far past the moment it was first seen a stated date may lie (time zones, clock skew)."""
IMPLAUSIBLE_DATE = "implausible_date"
"""The flag of an article whose stated publication time is implausible."""


def implausible_date_reason(published_at: datetime, seen_at: datetime) -> str | None:
    """Why `published_at` cannot be a publication time when first seen at `seen_at`, or None."""
    if published_at < EARLIEST_PLAUSIBLE_AT:
        return f"{published_at.isoformat()} is before {EARLIEST_PLAUSIBLE_AT.date().isoformat()}"
    if published_at > seen_at + FUTURE_TOLERANCE:
        return (
            f"{published_at.isoformat()} is more than a day after it was seen "
            f"({seen_at.isoformat()})"
        )
    return None
