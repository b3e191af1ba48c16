"""`futureworld train`, `evaluate` and `demo`: the commands that update and judge policies."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.cli_options import DbOption, console, open_engine
from flows.settings import Settings


def register_learning_commands(app: typer.Typer) -> None:
    app.command("train")(train_command)
    app.command("evaluate")(evaluate_command)
    app.command("demo")(demo_command)


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
    fresh_optimizer: Annotated[
        bool,
        typer.Option(
            "--fresh-optimizer",
            help="Start a new AdamW instead of continuing the newest RL version's moments.",
        ),
    ] = False,
    db: DbOption = None,
) -> None:
    """Replay completed groups into a staleness-corrected update; register the new version."""
    from flows.stages.training import replay_and_train, supervised_finetune

    settings = Settings().with_db(db)
    engine = open_engine(db)
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
            fresh_optimizer=fresh_optimizer,
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


def evaluate_command(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write rows as JSON.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Reliability diagram PNG.")] = None,
    agent: Annotated[list[str] | None, typer.Option("--agent", help="Only these agents.")] = None,
    db: DbOption = None,
) -> None:
    """Score every agent and policy version, per source and overall."""
    from flows.stages.scoring import forecast_records
    from futureworld.evaluation import plot_reliability, reliability_groups, score_forecasts

    records = forecast_records(open_engine(db), agent)
    rows = score_forecasts(records)
    console.print(score_table(rows))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"rows": [r.as_dict() for r in rows]}, indent=2))
        console.print(f"wrote {json_path}")
    if plot is not None:
        plot_reliability(reliability_groups(records), plot)
        console.print(f"wrote {plot}")


def demo_command(
    rounds: Annotated[int, typer.Option(help="Simulated days of the daily cycle.")] = 30,
    questions_per_day: Annotated[int, typer.Option(help="New questions per day.")] = 40,
    samples: Annotated[int, typer.Option("--samples", "-G", help="Rollouts per question.")] = 8,
    panel: Annotated[int, typer.Option(help="Held-out panel questions scored each round.")] = 2000,
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
    verdict = "no forecasts to compare" if result.claim is None else result.claim.summary()
    console.print(
        f"Round 0 → last round, paired over the panel: {verdict}. Report: {result.report}"
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
