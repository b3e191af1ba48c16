"""The deployments `futureworld orchestrate serve` runs: the daily cycle on its cron
schedule (UTC); every other flow on demand, with its parameters filled in from the UI or
`prefect deployment run`. prefect.yaml describes the same deployments for a work pool.

No deployment carries the database URL: the process serving them (or the worker running
them) has it in its environment (FW_DB_URL) or names a Prefect Secret block holding it
(FW_DB_URL_SECRET); see flows.orchestration.pipeline."""

from __future__ import annotations

from typing import Any

from prefect.schedules import Cron

from flows.orchestration.pipeline import FLOWS
from flows.settings import DAILY_CRON


def build_deployments(cron: str = DAILY_CRON) -> list[Any]:
    deployments = []
    for name, flow in FLOWS.items():
        schedule = Cron(cron, timezone="UTC") if name == "daily-cycle" else None
        deployments.append(
            flow.to_deployment(
                name=name,
                schedule=schedule,
                tags=["futureworld"],
                description=flow.description,
            )
        )
    return deployments
