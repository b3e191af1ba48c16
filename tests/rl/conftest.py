"""Fixtures of the RL tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.rl.rl_builders import build_tiny_model


@pytest.fixture(autouse=True)
def single_torch_thread() -> Iterator[None]:
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core machine the
    threads' spin-waiting makes them ~10x slower; the previous setting is restored."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    return build_tiny_model(tmp_path / "base")
