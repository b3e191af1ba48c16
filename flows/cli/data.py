"""`futureworld db`, `import`, `agent` and `model`: the schema, question sets, agents and
local models."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flows.cli.common import DbOption, UserError, cli_context, console
from flows.cli.history import RoundOption
from flows.cli.progress import Reporter, progress_report
from futureworld.domain import Agent, BackendKind, GenerationSettings

db_app = typer.Typer(no_args_is_help=True, help="Database schema.")
import_app = typer.Typer(
    no_args_is_help=True, help="Import question sets, news archives and outside forecasts."
)
agent_app = typer.Typer(no_args_is_help=True, help="Register and list agents.")
model_app = typer.Typer(no_args_is_help=True, help="Local models.")


@db_app.command("upgrade")
def db_upgrade(db: DbOption = None) -> None:
    """Apply all migrations (Postgres or SQLite)."""
    from storage.engine import current_revision

    with cli_context(db) as ctx:
        console.print(f"database at revision [bold]{current_revision(ctx.engine)}[/bold]")


def _reporting(progress: Reporter) -> Callable[[int, int], None]:
    """An import's on_progress (done, total) keeping `progress` at done of total."""
    return lambda done, total: progress.update(completed=done, total=total)


@import_app.command("forecastbench")
def import_forecastbench(
    question_set: Annotated[
        Path,
        typer.Argument(
            help="ForecastBench question set JSON, or a folder of question and resolution sets.",
            exists=True,
            readable=True,
        ),
    ],
    resolutions: Annotated[
        Path | None,
        typer.Option(
            "--resolutions",
            help="Matching resolution set JSON (with a single question set).",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ] = None,
    round_: RoundOption = None,
    db: DbOption = None,
) -> None:
    """Import a ForecastBench question set, or every round in a folder (data: CC BY-SA 4.0,
    Forecasting Research Institute). --round checks that the files are of that round; with a
    folder it imports that round only."""
    from flows.cli.history import round_date
    from flows.stages.importing import import_forecastbench as run_import
    from flows.stages.importing import import_forecastbench_folder
    from futureworld.sources.forecastbench import ForecastBenchFormatError

    if question_set.is_dir() and resolutions is not None:
        raise UserError(
            f"--resolutions with the folder {question_set}: put the resolution sets in the folder"
        )
    with cli_context(db) as ctx:
        try:
            if question_set.is_dir():
                with progress_report(console, f"import {question_set.name}: rounds") as progress:
                    history = import_forecastbench_folder(
                        ctx,
                        question_set,
                        round=round_date(round_),
                        on_progress=_reporting(progress),
                    )
                reports = [(f"round {files.due}: ", r) for files, r in history.rounds]
                errors = history.errors
            else:
                with progress_report(console, f"import {question_set.name}: questions") as progress:
                    report = run_import(
                        ctx,
                        question_set,
                        resolutions,
                        round=round_date(round_),
                        on_progress=_reporting(progress),
                    )
                reports = [("", report)]
                errors = []
        except ForecastBenchFormatError as error:
            raise UserError(f"import failed: {error}") from None
    for label, report in reports:
        console.print(
            f"{label}questions: {report.questions_inserted} new, {report.questions_existing} "
            f"already stored; outcomes recorded: {report.outcomes_recorded} "
            f"(annulled {report.annulled}); open: {report.still_open}"
        )
        for reason, count in sorted(report.skipped.items()):
            console.print(f"skipped {count}: {reason}")
    for error in errors:
        console.print(f"[yellow]problem:[/yellow] {escape(error)}", soft_wrap=True)
    if errors and not reports:
        raise UserError(f"import failed: no round imported (first problem: {errors[0]})")


@import_app.command("articles")
def import_articles(
    archive: Annotated[
        Path,
        typer.Argument(
            help="News archive: JSONL or CSV rows of title, body, url, published_at, source.",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    db: DbOption = None,
) -> None:
    """Load a news archive into the corpus (visible at each article's stated publication time);
    bad rows are reported by line and field, the others load; re-importing adds nothing."""
    from flows.stages.importing import import_articles as run_import
    from futureworld.sources.article_archive import ArchiveFormatError

    with cli_context(db) as ctx:
        try:
            with progress_report(console, f"import {archive.name}: articles") as progress:
                report = run_import(ctx, archive, on_progress=_reporting(progress))
        except ArchiveFormatError as error:
            raise UserError(f"import failed: {error}") from None
    console.print(
        f"articles: {report.inserted} new, {report.existing} already stored; "
        f"rows: {report.rows}, refused: {len(report.errors)}"
    )
    for error in report.errors:
        console.print(f"[yellow]problem:[/yellow] {escape(error)}", soft_wrap=True)
    if report.errors and report.rows == len(report.errors):
        raise UserError(f"import failed: no row imported (first problem: {report.errors[0]})")


@import_app.command("forecasts")
def import_forecasts(
    forecast_file: Annotated[
        Path,
        typer.Argument(
            help="An outside forecaster's file: a ForecastBench submission (JSON), or CSV / "
            "JSONL rows of source, question_id, probability, forecast_at.",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    agent: Annotated[
        str | None,
        typer.Option(
            "--agent",
            help="The agent the forecasts go to (default: the file's organization-model, or "
            "its stem).",
        ),
    ] = None,
    file_format: Annotated[
        str,
        typer.Option(
            "--format", help="auto (from the name, else the content), forecastbench, csv, jsonl."
        ),
    ] = "auto",
    db: DbOption = None,
) -> None:
    """Import someone else's forecasts as a read-only agent, scored by evaluate beside every
    other agent; bad rows are reported by line, the others load; re-importing changes nothing,
    and a file that revises stored forecasts registers the agent's next version."""
    from flows.stages.external_forecasts import import_forecasts as run_import
    from futureworld.sources.forecast_rows import ForecastFileError, ForecastFormat

    if file_format != "auto" and file_format not in {f.value for f in ForecastFormat}:
        known = ", ".join(["auto", *(f.value for f in ForecastFormat)])
        raise typer.BadParameter(f"--format {file_format}: choose one of {known}")
    chosen = None if file_format == "auto" else ForecastFormat(file_format)
    with cli_context(db) as ctx:
        try:
            report = run_import(ctx, forecast_file, agent_name=agent, file_format=chosen)
        except (ForecastFileError, ValueError) as error:
            raise UserError(f"import failed: {error}") from None
    bad = len(report.errors)
    if report.policy_version is None:
        for error in report.errors[:IMPORT_PROBLEMS_SHOWN]:
            console.print(f"[yellow]bad row:[/yellow] {escape(str(error))}", soft_wrap=True)
        first = report.errors[0] if report.errors else "the file holds no forecast"
        raise UserError(f"import failed: no forecast loaded ({report.rows} rows; first: {first})")
    console.print(
        f"agent [bold]{escape(report.agent)}[/bold] v{report.policy_version}: "
        f"{report.loaded} loaded, {report.updated} updated, {report.unchanged} unchanged"
        + (f", {report.carried} carried over" if report.carried else "")
        + f"; rows: {report.rows}, bad: {bad}",
        soft_wrap=True,
    )
    for error in report.errors[:IMPORT_PROBLEMS_SHOWN]:
        console.print(f"[yellow]bad row:[/yellow] {escape(str(error))}", soft_wrap=True)
    if bad > IMPORT_PROBLEMS_SHOWN:
        console.print(f"… and {bad - IMPORT_PROBLEMS_SHOWN} more bad rows")


IMPORT_PROBLEMS_SHOWN = 10
"""Bad rows `import forecasts` prints; the count says how many more there are."""


@agent_app.command("add")
def agent_add(
    name: str,
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="Model directory, a Hugging Face model id (ORG/NAME) already in the local Hub "
            "cache, or a baseline: crowd, base-rate, uniform.",
        ),
    ],
    backend: Annotated[BackendKind, typer.Option(help="What answers.")] = BackendKind.LOCAL,
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
    from storage.engine import session_scope
    from storage.repositories.agents import ensure_agent

    if backend is BackendKind.EXTERNAL:
        raise typer.BadParameter(
            "--backend external: outside forecasters are registered by `import forecasts FILE`"
        )
    if backend is BackendKind.OPENAI and not base_url:
        raise typer.BadParameter("--backend openai needs --base-url")
    if backend.generates:
        model = _model_source(model)
    if backend is BackendKind.LOCAL and not (Path(model) / "config.json").is_file():
        raise typer.BadParameter(f"--model {model}: not a model directory (no config.json)")
    try:
        generation = GenerationSettings(
            temperature=temperature,
            max_turns=max_turns,
            max_new_tokens=max_new_tokens,
            max_total_tokens=max_total_tokens,
            elicit_beliefs=elicit_beliefs,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    with cli_context(db) as ctx, session_scope(ctx.engine) as session:
        agent = ensure_agent(
            session,
            Agent(
                name=name,
                base_model=model,
                backend=backend,
                base_url=base_url,
                served_model=served_model,
                generation=generation,
            ),
        )
    console.print(f"agent [bold]{agent.name}[/bold] ({agent.backend}: {agent.base_model})")


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""A Hugging Face Hub model id, ORG/NAME."""


def _model_source(model: str) -> str:
    """`--model` as the agent records it: a path that exists, as given; a Hub id (ORG/NAME)
    its snapshot in the local Hugging Face cache, never downloaded. Agents load their base
    model with local files only, so a Hub id that is not cached is refused here."""
    if Path(model).expanduser().exists() or not HUB_ID.fullmatch(model):
        return model
    from futureworld.policy.loading import cached_model_dir

    snapshot = cached_model_dir(model)
    if snapshot is None:
        raise UserError(
            f"--model {model}: neither a local directory nor in the local Hugging Face cache "
            f"(HF_HUB_CACHE), and agent add never downloads; download it first "
            f"(`hf download {model}`, or `huggingface-cli download {model}` with an older "
            "huggingface_hub) or pass a local model directory"
        )
    return str(snapshot)


@agent_app.command("list")
def agent_list(db: DbOption = None) -> None:
    """List agents with their newest policy version."""
    from storage.engine import session_scope
    from storage.repositories.agents import latest_policy_version, list_agents

    table = Table("agent", "backend", "model", "version")
    with cli_context(db) as ctx, session_scope(ctx.engine) as session:
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
