"""The deployments `futureworld orchestrate serve` runs: the daily cycle on its cron
schedule (UTC); every other flow on demand, with its parameters filled in from the UI or
`prefect deployment run`. prefect.yaml describes the same deployments for a work pool."""

from __future__ import annotations

from typing import Any

from prefect.schedules import Cron

from flows.orchestration.pipeline import FLOWS
from flows.settings import DAILY_CRON


def build_deployments(db_url: str | None, cron: str = DAILY_CRON) -> list[Any]:
    params = {"db_url": db_url} if db_url else {}
    deployments = []
    for name, flow in FLOWS.items():
        schedule = Cron(cron, timezone="UTC") if name == "daily-cycle" else None
        deployments.append(
            flow.to_deployment(
                name=name,
                schedule=schedule,
                parameters=params,
                tags=["futureworld"],
                description=flow.description,
            )
        )
    return deployments
