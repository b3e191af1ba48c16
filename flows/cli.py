"""The `futureworld` command line. Every command takes `--db URL` (default: FW_DB_URL, else
the SQLite file in FW_DATA_DIR) and applies pending migrations before it starts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.cli_learning import register_learning_commands
from flows.cli_options import DbOption, console, open_engine
from flows.orchestration_cli import orchestration_app
from flows.settings import Settings, parse_as_of

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)


@app.callback()
def _quiet_libraries() -> None:
    """Model loading prints its own progress bars; ours are enough."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
import_app = typer.Typer(no_args_is_help=True, help="Import question sets.")
agent_app = typer.Typer(no_args_is_help=True, help="Register and list agents.")
model_app = typer.Typer(no_args_is_help=True, help="Local models.")
app.add_typer(db_app, name="db")
app.add_typer(import_app, name="import")
app.add_typer(agent_app, name="agent")
app.add_typer(model_app, name="model")
app.add_typer(orchestration_app, name="orchestrate", help="Prefect deployments, cycles, timers.")
register_learning_commands(app)


@db_app.command("upgrade")
def db_upgrade(db: DbOption = None) -> None:
    """Apply all migrations (Postgres or SQLite)."""
    from storage.engine import current_revision

    engine = open_engine(db)
    console.print(f"database at revision [bold]{current_revision(engine)}[/bold]")


@import_app.command("forecastbench")
def import_forecastbench(
    question_set: Annotated[Path, typer.Argument(help="ForecastBench question set JSON.")],
    resolutions: Annotated[
        Path | None, typer.Option("--resolutions", help="Matching resolution set JSON.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Import a ForecastBench question set (data: CC BY-SA 4.0, Forecasting Research Institute)."""
    from flows.stages.importing import import_forecastbench as run_import
    from futureworld.sources.forecastbench import ForecastBenchFormatError

    engine = open_engine(db)
    try:
        report = run_import(engine, question_set, resolutions)
    except ForecastBenchFormatError as error:
        console.print(f"[red]import failed:[/red] {error}")
        raise typer.Exit(2) from None
    console.print(
        f"questions: {report.questions_inserted} new, {report.questions_existing} already stored; "
        f"outcomes recorded: {report.outcomes_recorded} (annulled {report.annulled}); "
        f"open: {report.still_open}"
    )
    for reason, count in sorted(report.skipped.items()):
        console.print(f"skipped {count}: {reason}")


@agent_app.command("add")
def agent_add(
    name: str,
    model: Annotated[
        str,
        typer.Option("--model", help="Model directory, or a baseline: crowd, base-rate, uniform."),
    ],
    backend: Annotated[str, typer.Option(help="local | openai | baseline")] = "local",
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server URL.")] = None,
    served_model: Annotated[
        str | None,
        typer.Option(help="Model name on the server (default: the model directory's name)."),
    ] = None,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    max_turns: Annotated[int, typer.Option(help="Assistant turns per rollout.")] = 4,
    max_new_tokens: Annotated[int, typer.Option(help="Generated tokens per turn.")] = 64,
    max_total_tokens: Annotated[int, typer.Option(help="Prompt + completion limit.")] = 2048,
    elicit_beliefs: Annotated[
        bool, typer.Option(help="Elicit a belief after each tool turn.")
    ] = False,
    db: DbOption = None,
) -> None:
    """Register an agent; its policy version 0 is the base model."""
    from futureworld.domain import Agent
    from storage.engine import session_scope
    from storage.repositories.agents import ensure_agent

    if backend not in ("local", "openai", "baseline"):
        raise typer.BadParameter(f"unknown backend {backend!r}: use local, openai or baseline")
    if backend == "openai" and not base_url:
        raise typer.BadParameter("--backend openai needs --base-url")
    generation: dict[str, object] = {}
    if backend != "baseline":
        from flows.runtime import generation_settings

        generation = {
            "temperature": temperature,
            "max_turns": max_turns,
            "max_new_tokens": max_new_tokens,
            "max_total_tokens": max_total_tokens,
            "elicit_beliefs": elicit_beliefs,
        }
        if served_model:
            generation["served_model"] = served_model
        generation_settings(generation)  # validate before storing
        if backend == "local" and not (Path(model) / "config.json").is_file():
            raise typer.BadParameter(f"--model {model}: not a model directory (no config.json)")
    engine = open_engine(db)
    with session_scope(engine) as session:
        agent = ensure_agent(
            session,
            Agent(
                name=name,
                base_model=model,
                backend=backend,
                base_url=base_url,
                generation=generation,
            ),
        )
    console.print(f"agent [bold]{agent.name}[/bold] ({agent.backend}: {agent.base_model})")


@agent_app.command("list")
def agent_list(db: DbOption = None) -> None:
    """List agents with their newest policy version."""
    from storage.engine import session_scope
    from storage.repositories.agents import latest_policy_version, list_agents

    engine = open_engine(db)
    table = Table("agent", "backend", "model", "version")
    with session_scope(engine) as session:
        for agent in list_agents(session):
            version = latest_policy_version(session, agent.id)
            table.add_row(agent.name, agent.backend, agent.base_model, str(version.version))
    console.print(table)


@model_app.command("init-tiny")
def model_init_tiny(
    out_dir: Annotated[Path, typer.Argument(help="Where to write the model.")],
    seed: Annotated[int, typer.Option(help="Initialisation seed.")] = 0,
    hidden_size: Annotated[int, typer.Option(help="Hidden size.")] = 64,
    layers: Annotated[int, typer.Option(help="Transformer layers.")] = 2,
) -> None:
    """Build a tiny Qwen2-architecture model with a locally trained tokenizer (offline)."""
    from futureworld.policy.tiny import init_tiny_model

    path = init_tiny_model(out_dir, seed=seed, hidden_size=hidden_size, num_layers=layers)
    console.print(f"tiny model written to {path}")


@app.command("predict")
def predict_command(
    agent: Annotated[str, typer.Option("--agent", help="Agent name.")],
    samples: Annotated[int, typer.Option("--samples", "-G", help="Rollouts per question.")] = 1,
    as_of: Annotated[
        str | None, typer.Option("--as-of", help="Forecast instant (date or ISO); default now.")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many questions.")] = None,
    db: DbOption = None,
) -> None:
    """Forecast every open question this agent's current policy has not forecast yet."""
    from flows.runtime import predict_with_progress

    settings = Settings().with_db(db)
    report = predict_with_progress(
        open_engine(db),
        settings,
        agent,
        samples=samples,
        as_of=parse_as_of(as_of) if as_of else None,
        limit=limit,
    )
    console.print(
        f"{report.agent} v{report.policy_version}: {report.questions} questions, "
        f"{report.rollouts} rollouts persisted"
    )


@app.command("harvest")
def harvest_command(
    source: Annotated[
        list[str] | None,
        typer.Option("--source", help="manifold | polymarket | metaculus | kalshi | rss"),
    ] = None,
    feed: Annotated[list[str] | None, typer.Option("--feed", help="Feed URL (repeatable).")] = None,
    generate: Annotated[
        bool, typer.Option(help="Generate questions from newly harvested articles.")
    ] = False,
    db: DbOption = None,
) -> None:
    """Harvest open questions from platforms and articles from RSS/Atom feeds."""
    from flows.stages.harvesting import harvest
    from futureworld.domain import utc_now

    settings = Settings().with_db(db)
    sources = [s for s in (source or []) if s != "rss"]
    feeds = feed if (feed or not source or "rss" in source) else []
    now = utc_now()
    report = harvest(
        open_engine(db),
        settings,
        sources=sources,
        feeds=feeds,
        now=now,
        run_key=now.date().isoformat(),
        generate=generate,
    )
    console.print(
        f"questions: {report.questions_new} new of {report.questions_seen}; "
        f"articles: {report.articles_new} new of {report.articles_seen}"
    )
    for name, counts in sorted(report.per_source.items()):
        console.print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    for error in report.errors:
        console.print(f"[yellow]problem:[/yellow] {error}")


@app.command("resolve")
def resolve_command(
    manual: Annotated[
        int | None, typer.Option("--manual", help="Resolve this question id by hand.")
    ] = None,
    verdict: Annotated[str | None, typer.Option(help="With --manual: yes | no | annul.")] = None,
    db: DbOption = None,
) -> None:
    """Poll the sources of every open question past its close and record outcome revisions."""
    from flows.stages.harvesting import resolve, resolve_manually
    from futureworld.domain import utc_now

    settings = Settings().with_db(db)
    engine = open_engine(db)
    now = utc_now()
    if manual is not None:
        if verdict is None:
            raise typer.BadParameter("--manual needs --verdict yes|no|annul")
        outcome = resolve_manually(engine, manual, verdict, now=now)
        console.print("unchanged" if outcome is None else f"revision {outcome.revision} recorded")
        return
    from flows.runtime import configured_judge

    report = resolve(
        engine,
        settings,
        now=now,
        run_key=now.date().isoformat(),
        judge=configured_judge(settings, engine),
    )
    console.print(
        f"checked {report.checked}: {report.outcomes_recorded} outcomes recorded "
        f"({report.annulled} annulled); {report.needs_manual} need manual resolution"
    )
    for error in report.errors:
        console.print(f"[yellow]problem:[/yellow] {error}")


@app.command("backfill")
def backfill_command(db: DbOption = None) -> None:
    """Score every rollout whose question has a new outcome revision, exactly once."""
    from flows.stages.scoring import backfill_rewards

    report = backfill_rewards(open_engine(db))
    console.print(
        f"scored {report.rollouts_scored} rollouts: {report.rewards_inserted} rewards written, "
        f"{report.rewards_voided} voided by annulments"
    )


def main() -> None:
    app()
