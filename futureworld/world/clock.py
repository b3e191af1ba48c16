"""The simulated clock: a settable, advanceable, thread-safe tz-aware UTC "now".

The world server and the pipeline read the same clock, so moving it moves what the world
has published and resolved. Time never goes backwards unless set explicitly.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from futureworld.domain import require_utc


class SimClock:
    """`clock.now()` (or `clock()`) is the simulated instant; `set` and `advance` move it."""

    def __init__(self, start_at: datetime) -> None:
        self._now = require_utc(start_at, "start_at")
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def __call__(self) -> datetime:
        return self.now()

    def set(self, at: datetime) -> datetime:
        """Jump to `at` (either direction); returns the new now."""
        at = require_utc(at, "at")
        with self._lock:
            self._now = at
            return at

    def advance(
        self, delta: timedelta | None = None, *, days: float = 0.0, hours: float = 0.0
    ) -> datetime:
        """Move forward by `delta` plus `days` and `hours`; a negative total is an error."""
        step = (delta or timedelta()) + timedelta(days=days, hours=hours)
        if step < timedelta():
            raise ValueError(f"the clock only advances forward; got a step of {step}")
        with self._lock:
            self._now = self._now + step
            return self._now

    def __repr__(self) -> str:
        return f"SimClock({self.now().isoformat()})"
