"""Builds what the stages need at run time — generation backends, corpus, progress bars —
from settings. Nothing here runs at import time."""

from __future__ import annotations

from datetime import datetime

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import Engine

from flows.settings import Settings
from flows.stages.predicting import PredictReport, predict


def predict_with_progress(
    engine: Engine,
    settings: Settings,
    agent_name: str,
    *,
    samples: int,
    as_of: datetime | None,
    limit: int | None,
) -> PredictReport:
    """Run `predict` with a rich progress bar of questions and rollouts per second."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rollouts]} rollouts · {task.fields[rate]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(f"predict {agent_name}", total=limit, rollouts=0, rate="")
        counts = {"rollouts": 0}

        def on_group(n: int) -> None:
            counts["rollouts"] += n
            progress.advance(task)
            elapsed = progress.tasks[task].elapsed or 1e-9
            done = progress.tasks[task].completed
            progress.update(
                task,
                rollouts=counts["rollouts"],
                rate=f"{done / elapsed:.1f} q/s, {counts['rollouts'] / elapsed:.1f} r/s",
            )

        return predict(
            engine,
            agent_name,
            samples=samples,
            as_of=as_of,
            limit=limit,
            worker=settings.worker_id,
            lease_s=settings.claim_lease_s,
            on_group=on_group,
        )
