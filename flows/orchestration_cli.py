"""Orchestration commands: `serve` (one machine: the Prefect deployments and the resolution
timers in one process), `cycle` (one daily cycle, ephemeral Prefect when no server is
configured) and `timers` (the resolution scheduler in the foreground). Mounted into the main
CLI by flows.cli; the flows themselves live in flows.pipeline."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from flows.cli_options import DbOption, console, open_engine
from flows.settings import Settings

orchestration_app = typer.Typer(
    no_args_is_help=True, help="Run the Prefect flows and the resolution timers."
)
DAILY_CRON = "0 6 * * *"
"""The daily cycle's default schedule (UTC), as in prefect.yaml."""


def build_deployments(db_url: str | None, cron: str = DAILY_CRON) -> list[Any]:
    """The deployments `serve` runs: the daily cycle on its cron schedule (UTC); every other
    flow on demand, with its parameters filled in from the UI or `prefect deployment run`."""
    from prefect.schedules import Cron

    from flows.pipeline import FLOWS

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


@orchestration_app.command("serve")
def serve_command(
    cron: Annotated[str, typer.Option(help="Daily cycle schedule (cron, UTC).")] = DAILY_CRON,
    timers: Annotated[
        bool, typer.Option("--timers/--no-timers", help="Run the resolution timers too.")
    ] = True,
    limit: Annotated[int, typer.Option(help="At most this many flow runs at once.")] = 2,
    db: DbOption = None,
) -> None:
    """Serve every flow as a deployment from this process (needs PREFECT_API_URL for the UI;
    triggers: `prefect deployment run 'replay-and-train/replay-and-train' -p agent=NAME`)."""
    from prefect import serve

    scheduler = _start_timers(db) if timers else None
    try:
        serve(*build_deployments(db, cron), limit=limit)
    finally:
        if scheduler is not None:
            scheduler.shutdown(wait=False)


@orchestration_app.command("cycle")
def cycle_command(
    as_of: Annotated[
        str | None, typer.Option("--as-of", help="Date or ISO datetime; default now.")
    ] = None,
    source: Annotated[
        list[str] | None, typer.Option("--source", help="Question source (repeatable).")
    ] = None,
    feed: Annotated[list[str] | None, typer.Option("--feed", help="Feed URL (repeatable).")] = None,
    samples: Annotated[int, typer.Option("--samples", "-G", help="Rollouts per question.")] = 4,
    limit: Annotated[int | None, typer.Option(help="At most this many questions per agent.")] = (
        None
    ),
    min_groups: Annotated[int, typer.Option(help="Train once this many groups complete.")] = 8,
    db: DbOption = None,
) -> None:
    """Run the daily cycle once (harvest → resolve → backfill → train → predict → evaluate)."""
    from flows.pipeline import daily_cycle_flow

    state = daily_cycle_flow(
        as_of=as_of,
        db_url=db,
        sources=source,
        feeds=feed,
        samples=samples,
        limit=limit,
        min_groups=min_groups,
        return_state=True,
    )
    stages = state.result(raise_on_failure=False)
    if isinstance(stages, list):
        for stage in stages:
            result = "failed: " + stage.failed if stage.failed else (stage.note or "ok")
            counts = ", ".join(f"{k} {v}" for k, v in stage.counts.items())
            console.print(f"[bold]{stage.stage}[/bold]: {result} {counts}")
    if not state.is_completed():
        console.print(f"[red]daily cycle failed:[/red] {state.message}")
        raise typer.Exit(1)


@orchestration_app.command("timers")
def timers_command(db: DbOption = None) -> None:
    """Run the per-question resolution timers in the foreground (Ctrl-C stops them; the jobs
    stay in the database and missed ones run at the next start)."""
    from flows.timers import make_scheduler, start_timers

    settings = Settings().with_db(db)
    engine = open_engine(db)
    scheduler = make_scheduler(settings.database_url, blocking=True)
    console.print("resolution timers running (Ctrl-C to stop)")
    try:
        start_timers(scheduler, engine, settings.database_url)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        engine.dispose()


def _start_timers(db: str | None) -> Any:
    from flows.timers import make_scheduler, start_timers

    settings = Settings().with_db(db)
    engine = open_engine(db)
    scheduler = make_scheduler(settings.database_url)
    start_timers(scheduler, engine, settings.database_url)
    return scheduler
