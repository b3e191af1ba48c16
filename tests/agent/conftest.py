"""The tiny model, built once per test module from a config (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest

from futureworld.policy.local import LocalBackend
from futureworld.policy.tiny import init_tiny_model


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="module")
def tiny_backend(tiny_model_dir: Path) -> LocalBackend:
    return LocalBackend.from_pretrained(tiny_model_dir)
