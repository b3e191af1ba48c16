"""Orchestration commands: `serve` (one machine: the Prefect deployments and the resolution
timers in one process), `cycle` (one daily cycle, ephemeral Prefect when no server is
configured) and `timers` (the resolution scheduler in the foreground). Mounted into the main
CLI by flows.cli; the flows live in flows.orchestration, the timers in flows.timers."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from flows.cli.common import AsOfOption, DbOption, console
from flows.context import open_engine
from flows.settings import DAILY_CRON, Settings

orchestration_app = typer.Typer(
    no_args_is_help=True, help="Run the Prefect flows and the resolution timers."
)


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

    from flows.orchestration.deployments import build_deployments

    scheduler = _start_timers(db) if timers else None
    try:
        serve(*build_deployments(db, cron), limit=limit)
    finally:
        if scheduler is not None:
            scheduler.shutdown(wait=False)


@orchestration_app.command("cycle")
def cycle_command(
    as_of: AsOfOption = None,
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
    from flows.orchestration.pipeline import DAILY_TRAIN, daily_cycle_flow

    state = daily_cycle_flow(
        as_of=as_of,
        db_url=db,
        sources=source,
        feeds=feed,
        samples=samples,
        limit=limit,
        train=DAILY_TRAIN.model_copy(update={"min_groups": min_groups}),
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
    engine = open_engine(settings)
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
    engine = open_engine(settings)
    scheduler = make_scheduler(settings.database_url)
    start_timers(scheduler, engine, settings.database_url)
    return scheduler
