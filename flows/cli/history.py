"""`futureworld export forecastbench` and `futureworld backtest`: history in and out — an
agent's forecasts of a ForecastBench round as a submission file, and the daily cycle replayed
over imported history with a simulated clock."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Annotated

import typer

from flows.cli import common
from flows.cli.progress import progress_report

export_app = typer.Typer(no_args_is_help=True, help="Export forecasts.")


def _check_round(value: str | None) -> str | None:
    if value is not None:
        _day(value, "--round")
    return value


RoundOption = Annotated[
    str | None,
    typer.Option(
        "--round",
        help="Only the questions of this ForecastBench round (its forecast due date, YYYY-MM-DD).",
        callback=_check_round,
    ),
]
"""`--round`, shared by import forecastbench, predict, evaluate, export and backtest."""


def round_date(value: str | None) -> date | None:
    """The day a checked `--round` value names."""
    return None if value is None else date.fromisoformat(value)


@export_app.command("forecastbench")
def export_forecastbench_command(
    agent: Annotated[str, typer.Option("--agent", help="Agent name.")],
    question_set: Annotated[
        Path,
        typer.Option(
            "--question-set",
            help="The ForecastBench question set JSON (imported before).",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ],
    out: Annotated[Path, typer.Option("--out", help="Forecast file to write (JSON).")],
    round_: RoundOption = None,
    version: Annotated[
        int | None,
        typer.Option(min=0, help="Policy version (default: the newest that forecast the set)."),
    ] = None,
    organization: Annotated[str, typer.Option(help="Submitting organization.")] = "FutureWorld",
    model: Annotated[str | None, typer.Option(help="Model name (default: AGENT-vVERSION).")] = None,
    model_organization: Annotated[
        str, typer.Option(help="Organization that made the model.")
    ] = "FutureWorld",
    db: common.DbOption = None,
) -> None:
    """Write an agent's forecasts of a ForecastBench question set in ForecastBench's
    submission format (--round: the set must be of that round)."""
    from flows.stages.exporting import export_forecastbench
    from flows.stages.importing import check_round
    from futureworld.sources.forecastbench import ForecastBenchFormatError
    from storage.repositories.questions import UnknownRound

    common.writable_file(out, "--out")
    with common.cli_context(db) as ctx:
        common.require_agent(ctx, agent)
        try:
            check_round(ctx, round_date(round_))
            report = export_forecastbench(
                ctx,
                agent,
                question_set,
                version=version,
                organization=organization,
                model=model,
                model_organization=model_organization,
                round=round_date(round_),
            )
        except UnknownRound as error:
            raise common.UserError(str(error)) from None
        except (ForecastBenchFormatError, ValueError) as error:
            raise common.UserError(f"export failed: {error}") from None
    common.write_output(out, "--out", json.dumps(report.document, indent=2))
    common.console.print(
        f"{report.agent} v{report.policy_version}: {report.forecasts} forecasts of "
        f"{report.questions} questions written to {out}",
        soft_wrap=True,
    )


def _day(value: str, option: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise typer.BadParameter(f"{option} {value!r} is not a date; give YYYY-MM-DD") from None


def _step(value: str) -> int:
    text = value.strip().lower().removesuffix("d")
    if not text.isdigit() or int(text) < 1:
        raise typer.BadParameter(f"--step {value!r}: give whole days, e.g. 1d or 7d")
    return int(text)


def backtest_command(
    agent: Annotated[str, typer.Option("--agent", help="Agent name.")],
    start: Annotated[str, typer.Option("--from", help="First simulated day (YYYY-MM-DD).")],
    end: Annotated[str, typer.Option("--to", help="Last simulated day (YYYY-MM-DD).")],
    step: Annotated[str, typer.Option("--step", help="Days between cycles, e.g. 1d.")] = "1d",
    train_every: Annotated[
        int, typer.Option("--train-every", min=0, help="Train every N cycles (0: never).")
    ] = 1,
    samples: Annotated[
        int, typer.Option("--samples", "-G", min=1, help="Rollouts per question.")
    ] = 1,
    limit: Annotated[
        int | None, typer.Option(min=1, help="At most this many questions per cycle.")
    ] = None,
    reference: Annotated[str, typer.Option(help="Agent each round is paired against.")] = "crowd",
    fallback_reference: Annotated[
        str,
        typer.Option(
            "--fallback-reference",
            help="Agent paired with a question the reference has no forecast of (a dataset "
            "question has no crowd): base-rate (the smoothed base rate of its source), uniform "
            "(0.5), or none (left out, counted).",
        ),
    ] = "base-rate",
    out: Annotated[
        Path | None, typer.Option("--out", help="Report folder (default: reports/backtest-AGENT).")
    ] = None,
    round_: RoundOption = None,
    db: common.DbOption = None,
) -> None:
    """Replay the daily cycle over imported history with a simulated clock: forecast what is
    open, reveal only outcomes resolved by the clock, backfill, train; then score every round
    against the reference on the same questions (--round: only that ForecastBench round's
    questions are forecast and scored)."""
    from flows.stages.backtesting import BacktestOptions, BacktestRound, run_backtest
    from flows.stages.importing import check_round
    from storage.repositories.questions import UnknownRound

    try:
        options = BacktestOptions(
            agent=agent,
            start=_day(start, "--from"),
            end=_day(end, "--to"),
            step_days=_step(step),
            train_every=train_every,
            samples=samples,
            limit=limit,
            reference=reference,
            fallback_reference=None if fallback_reference == "none" else fallback_reference,
            round=round_date(round_),
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    with common.cli_context(db) as ctx:
        common.require_agent(ctx, agent)
        common.require_agent(ctx, reference)
        if options.fallback_reference is not None:
            common.require_agent(ctx, options.fallback_reference)
        folder = out or ctx.reports_dir / f"backtest-{agent}"
        if folder.exists() and not folder.is_dir():
            raise common.UserError(f"--out {folder}: is a file; give a folder")
        try:
            check_round(ctx, options.round)
        except UnknownRound as error:
            raise common.UserError(str(error)) from None
        rounds = len(options.clocks())
        with progress_report(common.console, f"backtest {agent}", rounds) as progress:

            def on_round(r: BacktestRound) -> None:
                trained = "" if r.trained_to is None else f", → v{r.trained_to}"
                progress.update(  # a new description: a log line per round
                    description=f"backtest {agent}: {r.clock.date()} done",
                    advance=1,
                    note=f"v{r.policy_version}, {r.forecasts} rollouts, {r.rewards} rewards"
                    + trained,
                )

            report = run_backtest(ctx, options, out_dir=folder, on_round=on_round)
    for r in report.rounds:
        if r.brier is not None:
            common.console.print(
                f"round {r.round} ({r.clock.date()}): n={r.n} questions ({r.against_reference} "
                f"vs {report.reference}, {r.against_fallback} vs {report.fallback_reference}), "
                f"parse rate {r.parse_rate:.3f} of {r.rollouts} rollouts: Brier {r.brier:.4f} "
                f"vs {r.reference_brier:.4f} (difference {r.difference:+.4f}); per-rollout "
                f"Brier {r.sample_brier:.4f}"
            )
    c = report.coverage
    common.console.print(
        f"scored {c.against_reference + c.against_fallback} of {c.resolved} resolved questions "
        f"(an unparsed rollout counts as 0.5); left out: {c.not_forecast} never forecast, "
        f"{c.not_binary} not binary, {c.no_reference} without a reference forecast"
    )
    common.console.print(f"report: {folder}")


def register_history_commands(app: typer.Typer) -> None:
    app.command("backtest")(backtest_command)
