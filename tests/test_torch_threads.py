"""Torch's thread count of a CPU job (futureworld.torch_threads): the cores this process may
use, shared out among the workers running side by side, unless a count is named."""

from __future__ import annotations

import os

import pytest
import torch

from futureworld.torch_threads import available_cores, set_torch_threads, torch_thread_count


def test_available_cores_are_the_process_affinity() -> None:
    assert available_cores() == len(os.sched_getaffinity(0))


def test_workers_side_by_side_share_the_cores_at_least_one_thread_each() -> None:
    cores = available_cores()
    assert torch_thread_count() == cores
    assert torch_thread_count(workers=2) == max(1, cores // 2)
    assert torch_thread_count(workers=cores + 1) == 1


def test_a_named_thread_count_wins_over_the_share() -> None:
    assert torch_thread_count(workers=4, override=3) == 3
    with pytest.raises(ValueError, match="torch threads must be >= 1"):
        torch_thread_count(override=0)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        torch_thread_count(workers=0)


def test_set_torch_threads_reaches_torch() -> None:
    previous = torch.get_num_threads()
    try:
        assert set_torch_threads(override=1) == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
