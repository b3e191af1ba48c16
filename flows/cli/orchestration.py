"""Orchestration commands: `serve` (one machine: the Prefect deployments and the resolution
timers in one process), `cycle` (one daily cycle, ephemeral Prefect when no server is
configured) and `timers` (the resolution scheduler in the foreground). Mounted into the main
CLI by flows.cli; the flows live in flows.orchestration, the timers in flows.timers.

`--db` reaches the flows and timers through this process's environment (FW_DB_URL), never as
a Prefect parameter. `cycle` prints one line per stage and fails (exit 1, one line) when a
stage failed, a requested source that gave nothing included. Prefect's own console records
lose their tracebacks unless `--debug` is given (they stay complete in the Prefect API)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from flows.cli.common import (
    AsOfOption,
    DbOption,
    RunFailure,
    console,
    debugging,
    load_settings,
    open_database,
    quiet_prefect_tracebacks,
    use_database,
)
from flows.cli.pipeline import check_sources
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
    limit: Annotated[int, typer.Option(min=1, help="At most this many flow runs at once.")] = 2,
    db: DbOption = None,
) -> None:
    """Serve every flow as a deployment from this process (needs PREFECT_API_URL for the UI;
    triggers: `prefect deployment run 'replay-and-train/replay-and-train' -p agent=NAME`)."""
    from prefect import serve

    from flows.orchestration.deployments import build_deployments

    settings = _database(db)
    deployments = build_deployments(cron)
    scheduler = _start_timers(settings) if timers else None
    try:
        serve(*deployments, limit=limit)
    finally:
        if scheduler is not None:
            scheduler.shutdown(wait=False)


@orchestration_app.command("cycle")
def cycle_command(
    as_of: AsOfOption = None,
    source: Annotated[
        list[str] | None,
        typer.Option("--source", help="Question source (repeatable).", callback=check_sources),
    ] = None,
    feed: Annotated[list[str] | None, typer.Option("--feed", help="Feed URL (repeatable).")] = None,
    samples: Annotated[
        int, typer.Option("--samples", "-G", min=1, help="Rollouts per question.")
    ] = 4,
    limit: Annotated[
        int | None, typer.Option(min=1, help="At most this many questions per agent.")
    ] = None,
    min_groups: Annotated[
        int, typer.Option(min=1, help="Train once this many groups complete.")
    ] = 8,
    db: DbOption = None,
) -> None:
    """Run the daily cycle once (harvest → resolve → backfill → train → predict → evaluate)."""
    _database(db)
    from flows.orchestration.pipeline import DAILY_TRAIN, CycleFailed, daily_cycle_flow

    if not debugging():
        quiet_prefect_tracebacks()
    state = daily_cycle_flow(
        as_of=as_of,
        sources=source,
        feeds=feed,
        samples=samples,
        limit=limit,
        train=DAILY_TRAIN.model_copy(update={"min_groups": min_groups}),
        return_state=True,
    )
    stages = state.result(raise_on_failure=False)
    if isinstance(stages, CycleFailed):
        stages = stages.stages
    failed: list[str] = []
    if isinstance(stages, list):
        for stage in stages:
            result = stage.failed if stage.failed else (stage.note or "ok")
            counts = ", ".join(f"{k} {v}" for k, v in stage.counts.items())
            console.print(f"[bold]{escape(stage.stage)}[/bold]: {escape(result)} {counts}")
            if stage.failed:
                failed.append(f"{stage.stage}: {stage.failed}")
    if not state.is_completed():
        raise RunFailure(f"daily cycle failed: {'; '.join(failed) or state.message}")


@orchestration_app.command("timers")
def timers_command(db: DbOption = None) -> None:
    """Run the per-question resolution timers in the foreground (Ctrl-C stops them; the jobs
    stay in the database and missed ones run at the next start)."""
    from flows.timers import make_scheduler, start_timers

    settings = _database(db)
    engine = open_database(settings)
    scheduler = make_scheduler(settings.database_url, blocking=True)
    console.print("resolution timers running (Ctrl-C to stop)")
    try:
        start_timers(scheduler, engine)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        engine.dispose()


def _database(db: str | None) -> Settings:
    """The checked database of an orchestration command: `--db`, else FW_DB_URL, else the
    Prefect Secret block FW_DB_URL_SECRET names (the same lookup as the flows'). It is put
    into this process's environment (FW_DB_URL), where the timer checks read it."""
    settings = load_settings(db)
    if settings.db_url is None and settings.db_url_secret:
        from flows.orchestration.pipeline import pipeline_settings

        db = pipeline_settings().database_url
    return use_database(db)


def _start_timers(settings: Settings) -> Any:
    from flows.timers import make_scheduler, start_timers

    engine = open_database(settings)
    scheduler = make_scheduler(settings.database_url)
    start_timers(scheduler, engine)
    return scheduler
