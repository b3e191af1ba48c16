"""Prefect's settings for the embedded default (ephemeral mode: no PREFECT_API_URL), applied
once when the `flows` package is first imported, so every entrance (the CLI, `python -m flows`,
a flow module loaded as a deployment entrypoint, the demo, the timers) gets them before Prefect
reads its settings. A value the user put in the environment always wins; with a Prefect server
configured nothing is changed (that server's own settings decide)."""

from __future__ import annotations

from collections.abc import MutableMapping

EPHEMERAL_DEFAULTS: dict[str, str] = {
    # Prefect waits 20 s for its ephemeral API server; on a busy 2-core machine its start-up
    # (migrations, app import) takes longer and the run dies before its first task.
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
    # Offline by default: the embedded server and the SDK would only try to reach Prefect's
    # telemetry endpoint (the SDK asks the server's analytics setting in ephemeral mode).
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}
"""The environment variables set in ephemeral mode, unless already set."""


def apply_prefect_defaults(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Set `EPHEMERAL_DEFAULTS` in `environ` when no Prefect API URL is configured there,
    leaving every variable already set alone. Returns what was set. Prefect reads its
    settings when it is first imported, so this runs before that (flows/__init__.py)."""
    if environ.get("PREFECT_API_URL", "").strip():
        return {}
    applied = {name: value for name, value in EPHEMERAL_DEFAULTS.items() if name not in environ}
    environ.update(applied)
    return applied
