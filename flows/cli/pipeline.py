"""`futureworld predict`, `harvest`, `resolve`, `backfill` and `provisional`: one stage each,
run now (or as of `--as-of`) on the configured database, with a progress bar where work is long.

`harvest` and `resolve` end with the stage's verdict on the sources asked: a source that gave
nothing fails the command (exit 1, one line); some failed items print "partial" and exit 0."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.markup import escape

from flows.cli.common import (
    AsOfOption,
    DbOption,
    RunFailure,
    UserError,
    cli_context,
    console,
    require_agent,
)
from flows.cli.history import RoundOption, round_date
from flows.cli.progress import progress_report
from flows.stages.problems import SourceStatus, any_failed
from flows.stages.resolving import ManualVerdict, UnknownQuestion
from futureworld.rewards import DEFAULT_REWARD, RewardFn
from futureworld.sources.platforms import SourceName
from futureworld.sources.question_gen import GENERATED_SOURCE

SOURCE_NAMES = (*(s.value for s in SourceName), GENERATED_SOURCE)
"""What `--source` accepts: the platforms and the news feeds (`rss`)."""


def check_sources(values: list[str] | None) -> list[str] | None:
    """The `--source` callback: every name must be a known source."""
    for value in values or ():
        if value not in SOURCE_NAMES:
            raise typer.BadParameter(
                f"unknown source {value!r}; choose from {', '.join(SOURCE_NAMES)}"
            )
    return values


def end_with_verdict(
    stage: str, sources: dict[str, SourceStatus], verdict: str | None, errors: list[str]
) -> None:
    """Fail the command when a requested source gave nothing (the line quotes its first
    problem); say "partial" otherwise."""
    if any_failed(sources):
        failed = [name for name, status in sources.items() if status is SourceStatus.FAILED]
        first = next((e for e in errors if e.split(":", 1)[0] in failed), "")
        raise RunFailure(f"{stage} {verdict}" + (f" (first problem: {first})" if first else ""))
    if verdict:
        console.print(f"{stage} {verdict}", soft_wrap=True)


def register_pipeline_commands(app: typer.Typer) -> None:
    app.command("predict")(predict_command)
    app.command("harvest")(harvest_command)
    app.command("resolve")(resolve_command)
    app.command("backfill")(backfill_command)
    app.command("provisional")(provisional_command)


def predict_command(
    agent: Annotated[str, typer.Option("--agent", help="Agent name.")],
    samples: Annotated[
        int, typer.Option("--samples", "-G", min=1, help="Rollouts per question.")
    ] = 1,
    as_of: AsOfOption = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many questions.")] = None,
    round_: RoundOption = None,
    db: DbOption = None,
) -> None:
    """Forecast every open question this agent's current policy has not forecast yet (--round:
    of that ForecastBench round only)."""
    from flows.stages.importing import check_round
    from flows.stages.predicting import predict
    from storage.repositories.questions import UnknownRound

    with cli_context(db, as_of) as ctx:
        require_agent(ctx, agent)
        try:
            check_round(ctx, round_date(round_))
        except UnknownRound as error:
            raise UserError(str(error)) from None
        with progress_report(console, f"predict {agent}", limit) as progress:
            rollouts = 0

            def on_group(n: int) -> None:
                nonlocal rollouts
                rollouts += n
                elapsed = time.perf_counter() - progress.started
                progress.update(
                    advance=1,
                    note=f"{rollouts} rollouts · {(progress.completed + 1) / elapsed:.1f} q/s, "
                    f"{rollouts / elapsed:.1f} r/s",
                )

            report = predict(
                ctx,
                agent,
                samples=samples,
                limit=limit,
                on_group=on_group,
                on_total=lambda n: progress.update(total=n),
                round=round_date(round_),
            )
    console.print(
        f"{report.agent} v{report.policy_version}: {report.questions} questions, "
        f"{report.rollouts} rollouts persisted"
    )


def harvest_command(
    source: Annotated[
        list[str] | None,
        typer.Option("--source", help=" | ".join(SOURCE_NAMES), callback=check_sources),
    ] = None,
    feed: Annotated[list[str] | None, typer.Option("--feed", help="Feed URL (repeatable).")] = None,
    generate: Annotated[
        bool, typer.Option(help="Generate questions from newly harvested articles.")
    ] = False,
    db: DbOption = None,
) -> None:
    """Harvest open questions from platforms and articles from RSS/Atom feeds (no --source:
    the configured feeds only; `--source rss` adds them to the platforms named)."""
    from flows.stages.harvesting import harvest

    sources = [s for s in (source or []) if s != GENERATED_SOURCE]
    feeds = feed if (feed or not source or GENERATED_SOURCE in source) else []
    with cli_context(db) as ctx:
        report = harvest(ctx, sources=sources, feeds=feeds, generate=generate)
    console.print(
        f"questions: {report.questions_new} new of {report.questions_seen}; "
        f"articles: {report.articles_new} new of {report.articles_seen}"
    )
    for name, counts in sorted(report.per_source.items()):
        console.print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    for error in report.errors:
        console.print(f"[yellow]problem:[/yellow] {escape(error)}", soft_wrap=True)
    end_with_verdict("harvest", report.sources, report.verdict, report.errors)


def resolve_command(
    manual: Annotated[
        int | None, typer.Option("--manual", help="Resolve this question id by hand.")
    ] = None,
    verdict: Annotated[
        ManualVerdict | None, typer.Option(help="With --manual: the outcome.")
    ] = None,
    db: DbOption = None,
) -> None:
    """Poll the sources of every open question past its close and record outcome revisions."""
    from flows.stages.resolving import resolve, resolve_manually

    if manual is not None and verdict is None:
        raise typer.BadParameter("--manual needs --verdict yes|no|annul")
    if verdict is not None and manual is None:
        raise typer.BadParameter("--verdict needs --manual QUESTION_ID")
    with cli_context(db) as ctx:
        if manual is not None and verdict is not None:
            try:
                outcome = resolve_manually(ctx, manual, verdict)
            except UnknownQuestion as error:
                raise UserError(
                    f"--manual {manual}: {error}; give the id of a stored question"
                ) from None
            console.print(
                "unchanged" if outcome is None else f"revision {outcome.revision} recorded"
            )
            return
        report = resolve(ctx)
    console.print(
        f"checked {report.checked}: {report.outcomes_recorded} outcomes recorded "
        f"({report.annulled} annulled); {report.needs_manual} need manual resolution"
    )
    for error in report.errors:
        console.print(f"[yellow]problem:[/yellow] {escape(error)}", soft_wrap=True)
    end_with_verdict("resolve", report.sources, report.verdict, report.errors)


def backfill_command(db: DbOption = None) -> None:
    """Score every rollout whose question has a new outcome revision, exactly once."""
    from flows.stages.backfilling import backfill_rewards

    with cli_context(db) as ctx:
        report = backfill_rewards(ctx)
    console.print(
        f"scored {report.rollouts_scored} rollouts: {report.rewards_inserted} rewards written, "
        f"{report.rewards_voided} voided by annulments"
    )


def provisional_command(
    agent: Annotated[str, typer.Option("--agent", help="Agent name.")],
    reward: Annotated[
        RewardFn, typer.Option("--reward", help="Which reward to stand in for (binary).")
    ] = DEFAULT_REWARD,
    as_of: AsOfOption = None,
    db: DbOption = None,
) -> None:
    """Write the provisional rewards of the agent's unresolved groups (and void those of
    questions resolved since), for `train --estimator provisional_consensus`."""
    from flows.stages.provisional import write_provisional_rewards

    with cli_context(db, as_of) as ctx:
        require_agent(ctx, agent)
        report = write_provisional_rewards(ctx, agent, reward_fn=reward)
    console.print(
        f"{report.agent}: {report.rewards_written} provisional rewards written, "
        f"{report.rewards_voided} voided by revealed outcomes, "
        f"{report.without_consensus} rollouts without a consensus"
    )
    for error in report.errors:
        console.print(escape(error), soft_wrap=True)
