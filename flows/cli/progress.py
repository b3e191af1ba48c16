"""Progress of long CLI work that tells the truth in a terminal and in a log alike.

In a terminal: a rich bar with done/total, the percentage, elapsed time and an ETA (from the
rate so far), and whatever fields the caller keeps up to date. Not in a terminal (a log, CI, a
pipe): a line at the first update, whenever the step changes and when the work ends, and a
heartbeat line at least every `heartbeat_s` (FW_HEARTBEAT_S, else 30 s) from a background
thread, so a long step with no updates (a warm start's thousand optimiser steps) still shows it
is alive and how far it is. Work that fails before its first update or heartbeat prints
nothing, and failed work no closing line: a refused command's output is its one error line.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

HEARTBEAT_S = 30.0
"""The longest silence of a non-terminal progress report, unless FW_HEARTBEAT_S says."""


def heartbeat_interval_s() -> float:
    """FW_HEARTBEAT_S (seconds, > 0) if set, else `HEARTBEAT_S`."""
    value = os.environ.get("FW_HEARTBEAT_S")
    if value is None:
        return HEARTBEAT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"FW_HEARTBEAT_S must be a positive number of seconds, got {value!r}")
    return seconds


class Reporter:
    """What the work calls as it goes: `update(description=…, completed=…, total=…,
    advance=…, note=…)`; every argument is optional and keeps its last value."""

    def __init__(self, description: str, total: float | None) -> None:
        self.description = description
        self.total = total
        self.completed = 0.0
        self.note = ""
        self.started = time.perf_counter()
        self._lock = threading.Lock()

    def update(
        self,
        *,
        description: str | None = None,
        completed: float | None = None,
        total: float | None = None,
        advance: float = 0.0,
        note: str | None = None,
    ) -> None:
        with self._lock:
            self.description = self.description if description is None else description
            self.total = self.total if total is None else total
            self.completed = (self.completed if completed is None else completed) + advance
            self.note = self.note if note is None else note

    def line(self) -> str:
        """`[elapsed] description done/total (pct) ETA …, note`, as the heartbeat prints it."""
        with self._lock:
            elapsed = time.perf_counter() - self.started
            text = f"[{elapsed:7.1f}s] {self.description}"
            if self.total:
                share = min(self.completed / self.total, 1.0)
                text += f" {self.completed:g}/{self.total:g} ({share:.0%})"
                if 0 < self.completed < self.total:
                    eta = elapsed * (self.total - self.completed) / self.completed
                    text += f" ETA {_clock(eta)}"
            elif self.completed:
                text += f" {self.completed:g} done"
            return text + (f", {self.note}" if self.note else "")


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class _TerminalReporter(Reporter):
    def __init__(self, description: str, total: float | None, progress: Progress) -> None:
        super().__init__(description, total)
        self._progress = progress
        self._task = progress.add_task(description, total=total, note="")

    def update(self, **changes: Any) -> None:
        super().update(**changes)
        self._progress.update(
            self._task,
            description=self.description,
            completed=self.completed,
            total=self.total,
            note=self.note,
        )


class _LogReporter(Reporter):
    def __init__(self, description: str, total: float | None, console: Console) -> None:
        super().__init__(description, total)
        self._console = console
        self._said = ""

    def say(self) -> None:
        self._said = self.description
        self._console.print(self.line(), soft_wrap=True, markup=False, highlight=False)

    def update(self, **changes: Any) -> None:
        before = self.description
        super().update(**changes)
        if self.description != before or not self._said:  # the first update, or a new step
            self.say()


@contextmanager
def progress_report(
    console: Console,
    description: str,
    total: float | None = None,
    *,
    heartbeat_s: float | None = None,
) -> Iterator[Reporter]:
    """A progress report of long work on `console` (see the module docstring); `heartbeat_s`
    None: `heartbeat_interval_s()`."""
    interval_s = heartbeat_interval_s() if heartbeat_s is None else heartbeat_s
    if console.is_terminal:
        columns = (
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}"),
        )
        with Progress(*columns, console=console) as progress:
            yield _TerminalReporter(description, total, progress)
        return
    reporter = _LogReporter(description, total, console)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval_s):
            reporter.say()

    thread = threading.Thread(target=beat, name="progress-heartbeat", daemon=True)
    thread.start()
    try:
        yield reporter
    finally:
        stop.set()
        thread.join()
    reporter.say()
