"""What the learning experiments share: their seed and setting arguments, and running several
processes side by side (two demos on the 2 cores, one torch thread each)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


def parse_seeds(text: str) -> list[int]:
    """`0-7` or `0,3,5` as a list of seeds."""
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",")]


def parse_numeric_sets(items: Sequence[str]) -> dict[str, int | float]:
    """`FIELD=VALUE` arguments as numbers (a value with a point is a float)."""
    return {k: float(v) if "." in v else int(v) for k, v in (s.split("=", 1) for s in items)}


@dataclass(frozen=True)
class Job:
    label: str
    command: list[str]
    log: Path | None = None
    """Where its output goes (None: this process's)."""


def run_side_by_side(
    jobs: Sequence[Job], at_once: int, on_done: Callable[[Job, float], None] | None = None
) -> None:
    """Each job in a process of its own, `at_once` at a time, in order; with more than one at
    a time each gets FW_TORCH_THREADS=1 (else each takes every core and all run several times
    slower) and, when it logs to a folder, a PREFECT_HOME of its own there: ephemeral Prefect
    servers started together on one home race on its database's migrations ("duplicate column
    name") and then on its writes. `on_done(job, seconds)` after each that succeeds;
    SystemExit naming those that failed, once all have run."""
    env = {**os.environ, "FW_TORCH_THREADS": "1"} if at_once > 1 else dict(os.environ)
    todo = list(jobs)
    running: list[tuple[Job, subprocess.Popen, float]] = []
    failed = []
    while todo or running:
        while todo and len(running) < at_once:
            job = todo.pop(0)
            output = None if job.log is None else job.log.open("w")
            own = env
            if at_once > 1 and job.log is not None and "PREFECT_API_URL" not in env:
                own = {**env, "PREFECT_HOME": str(job.log.parent / "prefect")}
            process = subprocess.Popen(
                job.command, env=own, stdout=output, stderr=subprocess.STDOUT if output else None
            )
            if output is not None:
                output.close()  # the child holds its own descriptor
            running.append((job, process, time.perf_counter()))
            print(f"{job.label}: started", flush=True)
        time.sleep(2)
        for entry in list(running):
            job, process, started = entry
            if process.poll() is None:
                continue
            running.remove(entry)
            seconds = time.perf_counter() - started
            minutes = seconds / 60
            print(f"{job.label}: exit {process.returncode} after {minutes:.1f} min", flush=True)
            if process.returncode != 0:
                failed.append(f"{job.label} (exit {process.returncode})")
            elif on_done is not None:
                on_done(job, seconds)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")
