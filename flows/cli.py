"""The `futureworld` command line. Every command takes `--db URL` (default: FW_DB_URL, else
the SQLite file in FW_DATA_DIR) and applies pending migrations before it starts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

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

console = Console()
DbOption = Annotated[
    str | None, typer.Option("--db", help="Database URL (sqlite:///…, postgresql://…).")
]


def _engine(db: str | None):
    from storage.engine import make_engine, upgrade_database

    settings = Settings().with_db(db)
    engine = make_engine(settings.database_url)
    upgrade_database(engine)
    return engine


@db_app.command("upgrade")
def db_upgrade(db: DbOption = None) -> None:
    """Apply all migrations (Postgres or SQLite)."""
    from storage.engine import current_revision

    engine = _engine(db)
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

    engine = _engine(db)
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
        str | None, typer.Option(help="Model name on the server (default: --model).")
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
    engine = _engine(db)
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

    engine = _engine(db)
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
        _engine(db),
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
        _engine(db),
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
    engine = _engine(db)
    now = utc_now()
    if manual is not None:
        if verdict is None:
            raise typer.BadParameter("--manual needs --verdict yes|no|annul")
        outcome = resolve_manually(engine, manual, verdict, now=now)
        console.print("unchanged" if outcome is None else f"revision {outcome.revision} recorded")
        return
    report = resolve(engine, settings, now=now, run_key=now.date().isoformat())
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

    report = backfill_rewards(_engine(db))
    console.print(
        f"scored {report.rollouts_scored} rollouts: {report.rewards_inserted} rewards written, "
        f"{report.rewards_voided} voided by annulments"
    )


@app.command("train")
def train_command(
    agent: Annotated[str, typer.Option("--agent", help="Agent name.")],
    estimator: Annotated[
        str, typer.Option(help="dr_grpo | grpo | rloo | forecast_info_gain | siop | sft")
    ] = "dr_grpo",
    max_groups: Annotated[int | None, typer.Option(help="Replay at most this many groups.")] = None,
    lora: Annotated[bool, typer.Option("--lora", help="Train a LoRA adapter.")] = False,
    reuse: Annotated[
        bool, typer.Option("--reuse", help="Also replay groups this lineage trained on before.")
    ] = False,
    learning_rate: Annotated[float | None, typer.Option(help="AdamW learning rate.")] = None,
    ppo_epochs: Annotated[int | None, typer.Option(help="Passes over the replayed data.")] = None,
    sft: Annotated[bool, typer.Option("--sft", help="Supervised fine-tuning.")] = False,
    from_jsonl: Annotated[
        Path | None,
        typer.Option("--from-jsonl", help='SFT data: {"prompt": …, "completion": …} per line.'),
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Continue from this checkpoint's state.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Replay completed groups into a staleness-corrected update; register the new version."""
    from flows.stages.training import replay_and_train, supervised_finetune

    settings = Settings().with_db(db)
    engine = _engine(db)
    overrides = {
        k: v
        for k, v in {"learning_rate": learning_rate, "ppo_epochs": ppo_epochs}.items()
        if v is not None
    }
    if sft:
        if from_jsonl is None:
            raise typer.BadParameter("--sft needs --from-jsonl FILE")
        from flows.runtime import sft_trajectories_from_jsonl

        trajectories = sft_trajectories_from_jsonl(engine, settings, agent, from_jsonl)
        report = supervised_finetune(
            engine, settings, agent, trajectories, lora=lora, config_overrides=overrides
        )
    else:
        report = replay_and_train(
            engine,
            settings,
            agent,
            estimator=estimator,
            max_groups=max_groups,
            lora=lora,
            reuse=reuse,
            config_overrides=overrides,
            resume_from=resume,
        )
    if report is None:
        console.print("nothing to train on: no completed, unconsumed group with 2+ scored rollouts")
        return
    last = report.steps[-1] if report.steps else {}
    console.print(
        f"{report.agent}: v{report.from_version} → v{report.to_version} on {report.rollouts} "
        f"rollouts ({report.groups} groups, {report.groups_skipped} skipped, "
        f"{report.remaining_groups} left); {len(report.steps)} steps, "
        f"last loss {last.get('loss', float('nan')):.4f}; checkpoint {report.checkpoint_path}"
    )


@app.command("evaluate")
def evaluate_command(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write rows as JSON.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Reliability diagram PNG.")] = None,
    agent: Annotated[list[str] | None, typer.Option("--agent", help="Only these agents.")] = None,
    db: DbOption = None,
) -> None:
    """Score every agent and policy version, per source and overall."""
    from flows.stages.scoring import forecast_records
    from futureworld.evaluation import plot_reliability, score_forecasts

    records = forecast_records(_engine(db), agent)
    rows = score_forecasts(records)
    console.print(score_table(rows))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"rows": [r.as_dict() for r in rows]}, indent=2))
        console.print(f"wrote {json_path}")
    if plot is not None:
        groups: dict[str, tuple[list[float], list[float]]] = {}
        for record in records:
            p, y = groups.setdefault(f"{record.agent} v{record.policy_version}", ([], []))
            p.append(record.p_yes)
            y.append(record.y)
        plot_reliability(groups, plot)
        console.print(f"wrote {plot}")


@app.command("demo")
def demo_command(
    rounds: Annotated[int, typer.Option(help="Simulated days of the daily cycle.")] = 16,
    questions_per_day: Annotated[int, typer.Option(help="New questions per day.")] = 40,
    samples: Annotated[int, typer.Option("--samples", "-G", help="Rollouts per question.")] = 8,
    panel: Annotated[int, typer.Option(help="Held-out panel questions scored each round.")] = 100,
    seed: Annotated[int, typer.Option(help="World and model seed.")] = 0,
    out: Annotated[Path, typer.Option("--out", help="Report folder.")] = Path("reports/demo"),
) -> None:
    """The whole delayed-reward loop on the simulated world, offline: it learns in minutes."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # The progress bar tells the story; per-task flow logs stay in the Prefect UI/database.
    # Offline by design: Prefect's usage telemetry would only fail to connect.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")

    from flows.demo import DemoConfig, run_demo

    config = DemoConfig(
        out_dir=out,
        rounds=rounds,
        questions_per_day=questions_per_day,
        samples=samples,
        panel_questions=panel,
        seed=seed,
    )
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("demo", total=rounds + 3)

        def on_progress(step: str, done: int, total: int) -> None:
            progress.update(task, description=step, completed=done, total=total)

        result = run_demo(config, on_progress)
    table = Table(
        "round",
        "version",
        "n",
        "Brier",
        "95% CI",
        "ECE",
        "acc",
        "log",
        "true-p Brier",
        "parsed",
        "live Brier",
        "staleness",
        title="FutureWorld demo: the round's policy on the held-out panel",
    )
    for m in result.rounds:
        table.add_row(
            str(m.round),
            str(m.policy_version),
            str(m.n),
            f"{m.brier:.4f}",
            f"[{m.brier_ci[0]:.3f}, {m.brier_ci[1]:.3f}]",
            f"{m.ece:.4f}",
            f"{m.accuracy:.3f}",
            f"{m.log_score:.4f}",
            f"{m.true_brier:.4f}",
            f"{m.parse_rate:.2f}",
            "—" if m.live_brier is None else f"{m.live_brier:.4f}",
            "—" if m.staleness is None else f"{m.staleness:.2f}",
        )
    console.print(table)
    first, last = result.rounds[0], result.rounds[-1]
    console.print(
        f"Brier {first.brier:.4f} → {last.brier:.4f} (round-0 95% CI "
        f"[{first.brier_ci[0]:.4f}, {first.brier_ci[1]:.4f}]), ECE {first.ece:.4f} → "
        f"{last.ece:.4f}: {'learned' if result.learned else 'no clear improvement'}. "
        f"Report: {result.report}"
    )


def score_table(rows) -> Table:
    table = Table(
        "agent",
        "ver",
        "source",
        "n",
        "Brier",
        "95% CI",
        "log",
        "acc",
        "ECE",
        "BI",
        "skill/crowd",
        "skill/base",
    )
    for r in rows:
        d = r.as_dict()

        def fmt(v: float | None, digits: int = 3) -> str:
            return "—" if v is None else f"{v:.{digits}f}"

        lo, hi = d["brier_ci"]
        table.add_row(
            d["agent"],
            str(d["policy_version"]),
            d["source"] or "all",
            str(d["n"]),
            fmt(d["brier"]),
            f"[{fmt(lo)}, {fmt(hi)}]",
            fmt(d["log_score"]),
            fmt(d["accuracy"]),
            fmt(d["ece"]),
            fmt(d["brier_index"], 1),
            fmt(d["brier_skill_vs_crowd"]),
            fmt(d["brier_skill_vs_base_rate"]),
        )
    return table


def main() -> None:
    app()
