"""A real `prefect server start` on 127.0.0.1 for the tests that need one outside the in-process
harness (deployments with a worker, the UI in a browser): its own home and SQLite database,
telemetry off, started and health-checked in one place."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

PREFECT = str(Path(sys.executable).with_name("prefect"))
STARTUP_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_prefect_server(
    home: Path, *, ui: bool, extra_env: dict[str, str] | None = None
) -> Iterator[tuple[str, dict[str, str]]]:
    """Start a server with its home in `home`; yields (base URL, the environment its CLI and
    workers need). The server is stopped on exit."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"{base}/api",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "true" if ui else "false",
        "PREFECT_CLI_PROMPT": "false",
        "DO_NOT_TRACK": "1",
        **(extra_env or {}),
    }
    log_path = home / "server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while True:
                try:
                    if httpx.get(f"{base}/api/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert server.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, (
                    f"Prefect server did not start in {STARTUP_TIMEOUT_S} s"
                )
                time.sleep(0.5)
            yield base, env
        finally:
            server.terminate()
            server.wait(30)
