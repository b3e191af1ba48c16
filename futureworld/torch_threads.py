"""How many intra-op threads torch uses in a CPU job. Torch's default is every core of the
machine, whatever else runs on it: with a few jobs or worker processes on two cores the
threads fight for them and a step runs tens of times slower. A job takes the cores this process
may run on (its CPU affinity), shared out among the worker processes that run side by side,
unless the caller names a count (the application's FW_TORCH_THREADS)."""

from __future__ import annotations

import os

import torch


def available_cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS has one (Linux),
    else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def torch_thread_count(*, workers: int = 1, override: int | None = None) -> int:
    """Threads for each of `workers` processes running at once on this process's cores:
    `override` when given, else an equal share of `available_cores()`, at least one each."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if override is not None:
        if override < 1:
            raise ValueError(f"torch threads must be >= 1, got {override}")
        return override
    return max(1, available_cores() // workers)


def set_torch_threads(*, workers: int = 1, override: int | None = None) -> int:
    """Sets this process's torch intra-op threads to `torch_thread_count`; returns the count."""
    threads = torch_thread_count(workers=workers, override=override)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
