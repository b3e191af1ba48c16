"""One Prefect test harness for the whole session: flows run against a temporary Prefect
database (PREFECT_HOME and telemetry are pinned in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=None):
        yield
