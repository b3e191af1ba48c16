"""Fixtures of the RL tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rl.rl_builders import build_tiny_model


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    return build_tiny_model(tmp_path / "base")
