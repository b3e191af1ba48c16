"""Fixtures of the source tests: a scripted loopback server and a fast-retrying client."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from futureworld.sources.http import SourceClient
from tests.sources.loopback_server import FAST, ScriptedServer


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    scripted = ScriptedServer()
    yield scripted
    scripted.close()


@pytest.fixture
def client() -> Iterator[SourceClient]:
    with SourceClient(FAST, seed=0) as fast_client:
        yield fast_client
