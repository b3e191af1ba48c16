"""Prefect's embedded-mode defaults (flows.prefect_defaults) reach the settings Prefect itself
reads, in a fresh process whose environment has none of them, and a user's value wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.prefect_defaults import EPHEMERAL_DEFAULTS, apply_prefect_defaults

ROOT = Path(__file__).resolve().parents[2]
PINNED = (*EPHEMERAL_DEFAULTS, "PREFECT_API_URL", "PREFECT_PROFILE")
READ_SETTINGS = """
import json, os, sys
import {entrance}
from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
from prefect.settings import get_current_settings
settings = get_current_settings()
print(json.dumps({{
    "startup_timeout_s": settings.server.ephemeral.startup_timeout_seconds,
    "server_wait_s": PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value(),
    "analytics": settings.server.analytics_enabled,
    "ephemeral": settings.api.url is None,
    "do_not_track": os.environ.get("DO_NOT_TRACK"),
}}))
"""


def effective_settings(entrance: str, tmp_path: Path, **user: str) -> dict[str, object]:
    """Import `entrance` first in a clean process, as its console script or deployment would,
    then read what Prefect's settings say."""
    env = {k: v for k, v in os.environ.items() if k not in PINNED}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    env.update(user)
    completed = subprocess.run(
        [sys.executable, "-c", READ_SETTINGS.format(entrance=entrance)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("entrance", ["flows.cli", "flows.orchestration.pipeline"])
def test_an_entrance_gives_prefect_a_long_startup_wait_and_no_analytics(
    entrance: str, tmp_path: Path
) -> None:
    settings = effective_settings(entrance, tmp_path)
    assert settings == {
        "startup_timeout_s": 300,
        "server_wait_s": 300,
        "analytics": False,
        "ephemeral": True,
        "do_not_track": "1",
    }


def test_a_user_set_prefect_value_wins_over_the_project_default(tmp_path: Path) -> None:
    settings = effective_settings(
        "flows.cli",
        tmp_path,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="45",
        PREFECT_SERVER_ANALYTICS_ENABLED="true",
        DO_NOT_TRACK="0",
    )
    assert settings["startup_timeout_s"] == 45
    assert settings["server_wait_s"] == 45
    assert settings["analytics"] is True
    assert settings["do_not_track"] == "0"


def test_a_configured_prefect_server_keeps_its_own_settings() -> None:
    environ = {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}
    assert apply_prefect_defaults(environ) == {}
    assert environ == {"PREFECT_API_URL": "http://127.0.0.1:4200/api"}
