"""`futureworld demo`: the whole loop on the simulated world (flows.demo), with its progress
(flows.cli.progress: a bar with an ETA on a terminal; otherwise a line per step and a heartbeat
at least every 30 s, FW_HEARTBEAT_S) and the per-round table; `--resume` continues a killed
demo (flows.demo.resume)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.cli.common import UserError, console
from flows.cli.progress import progress_report
from flows.demo.config import DemoConfig
from flows.tracking import ReportTo
from futureworld.rl.config import Estimator

DEFAULTS = DemoConfig()
"""The defaults every option takes (one place: DemoConfig's)."""


def demo_command(
    rounds: Annotated[
        int, typer.Option(help="Simulated days of the daily cycle.")
    ] = DEFAULTS.rounds,
    questions_per_day: Annotated[
        int, typer.Option(help="New questions per day.")
    ] = DEFAULTS.questions_per_day,
    samples: Annotated[
        int, typer.Option("--samples", "-G", help="Rollouts per question.")
    ] = DEFAULTS.samples,
    panel: Annotated[
        int, typer.Option(help="Held-out panel questions scored each round.")
    ] = DEFAULTS.panel_questions,
    seed: Annotated[int, typer.Option(help="World and model seed.")] = DEFAULTS.seed,
    out: Annotated[Path, typer.Option("--out", help="Report folder.")] = DEFAULTS.out_dir,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue the demo killed or failed in --out after its warm start (same "
            "options): finished rounds are kept, the results equal an uninterrupted run's.",
        ),
    ] = False,
    sft_days: Annotated[
        int, typer.Option(min=1, help="Days of reference forecasts the warm start learns.")
    ] = DEFAULTS.sft_days,
    sft_epochs: Annotated[
        int, typer.Option(min=1, help="Epochs of the warm start (research off).")
    ] = DEFAULTS.sft_epochs,
    kinds: Annotated[
        str,
        typer.Option(
            "--kinds",
            help="Question kinds the world poses, comma-separated: binary (always), choice, "
            "numeric.",
        ),
    ] = ",".join(k.value for k in DEFAULTS.kinds),
    kind_questions_per_day: Annotated[
        int, typer.Option(help="Choice and numeric questions per day, of each kind asked.")
    ] = DEFAULTS.kind_questions_per_day,
    kind_panel: Annotated[
        int, typer.Option(help="Held-out panel questions per choice or numeric kind.")
    ] = DEFAULTS.kind_panel_questions,
    research: Annotated[
        bool,
        typer.Option(
            "--research/--no-research",
            help="Run on the research world (the default): questions state no cue, the agent "
            "searches and opens articles over several turns, warm-started on a reference "
            "researcher. --no-research: one turn on a world whose questions state their cue.",
        ),
    ] = DEFAULTS.research,
    research_panel: Annotated[
        int,
        typer.Option(
            help="Held-out research-panel questions: round 0 and the last round, which the "
            "claim compares, are scored on all of them."
        ),
    ] = DEFAULTS.research_panel_questions,
    research_round_panel: Annotated[
        int,
        typer.Option(
            min=0,
            help="The research panel's first questions the rounds between are scored on, "
            "and every round's row and curve (0: every round on the whole panel).",
        ),
    ] = DEFAULTS.research_round_panel_questions or 0,
    research_sharpening: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="The reference researcher's answers' log-odds are this multiple of the "
            "posterior of what it read (1 = calibrated; research on).",
        ),
    ] = DEFAULTS.research_sharpening,
    validation_fraction: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.99,
            help="Share of live questions the promotion gate holds out of every update; 0 = "
            "no gate.",
        ),
    ] = DEFAULTS.validation_fraction,
    report_to: Annotated[
        ReportTo | None,
        typer.Option(
            "--report-to",
            help="Experiment tracker for every update and each round's panel scores (default "
            "FW_REPORT_TO, else none).",
        ),
    ] = None,
    estimator: Annotated[
        Estimator,
        typer.Option(
            help="How rewards become advantages in every RL update; on the research world "
            "forecast_info_gain and siop also elicit a belief after each tool turn.",
        ),
    ] = DEFAULTS.estimator,
    kl_coef: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="k3 KL penalty of every update to the warm start (or the --kl-trail "
            "version); 0 = off.",
        ),
    ] = DEFAULTS.rl_kl_coef,
    kl_trail: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Anchor the KL penalty to the version K promotions before each update's "
            "base, never older than the warm start.",
        ),
    ] = DEFAULTS.rl_kl_trail,
    draw_groups: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Each update trains on at most this many groups drawn from those waiting "
            "(the rest wait); 0 = all of them.",
        ),
    ] = DEFAULTS.rl_draw_groups,
    rejection_backoff: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="After a rejected update, the next from the same parent trains at the "
            "learning rate x B^k, k its rejected versions; 0 = off.",
        ),
    ] = DEFAULTS.rl_rejection_backoff or 0.0,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A training setting of every RL update, name=value (repeatable; any "
            "TrainConfig field, as `train --set`).",
        ),
    ] = None,
) -> None:
    """The whole delayed-reward loop on the simulated world, offline: it learns in minutes."""
    # The progress bar tells the story; per-task flow logs stay in the Prefect UI/database.
    # Offline by design: Prefect's usage telemetry would only fail to connect.
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")

    from flows.demo.resume import ResumeRefused
    from flows.demo.run import run_demo
    from flows.stages.train_options import TrainConfigError
    from futureworld.domain import QuestionKind

    try:
        kind_list = tuple(QuestionKind(k.strip()) for k in kinds.split(",") if k.strip())
        config = DemoConfig(
            out_dir=out,
            resume=resume,
            sft_days=sft_days,
            sft_epochs=sft_epochs,
            rounds=rounds,
            questions_per_day=questions_per_day,
            samples=samples,
            panel_questions=panel,
            seed=seed,
            kinds=kind_list,
            kind_questions_per_day=kind_questions_per_day,
            kind_panel_questions=kind_panel,
            research=research,
            research_panel_questions=research_panel,
            research_round_panel_questions=research_round_panel or None,
            research_sharpening=research_sharpening,
            validation_fraction=validation_fraction,
            report_to=report_to,
            estimator=estimator,
            rl_kl_coef=kl_coef,
            rl_kl_trail=kl_trail,
            rl_draw_groups=draw_groups or None,
            rl_rejection_backoff=rejection_backoff or None,
            train_set=tuple(set_ or ()),
        )
    except TrainConfigError as error:
        raise typer.BadParameter(str(error), param_hint="--set") from None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--kinds") from None
    # done/total, percentage and ETA in a terminal; in a log a line per step and a heartbeat
    # at least every 30 s, the warm start's long silence included (flows.cli.progress)
    with progress_report(console, "demo", rounds + 3) as progress:

        def on_progress(step: str, done: int, total: int) -> None:
            progress.update(description=step, completed=done, total=total)

        try:
            result = run_demo(config, on_progress)
        except ResumeRefused as error:
            raise UserError(str(error)) from None
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
    for kind, scores in result.kind_scores.items():
        choice = kind is QuestionKind.CHOICE
        kind_table = Table(
            "round",
            "version",
            "n",
            "multiclass Brier" if choice else "CRPS",
            "top-label ECE" if choice else "90% coverage",
            "truth (floor)",
            "parsed",
            title=f"{kind} questions: the round's policy on their held-out panel",
        )
        for s in scores:
            kind_table.add_row(
                str(s.round),
                str(s.policy_version),
                str(len(s.score)),
                f"{s.mean_score:.4f}",
                f"{s.calibration:.4f}",
                f"{s.true_score:.4f}",
                f"{s.parse_rate:.2f}",
            )
        console.print(kind_table)
        claim = result.kind_claims.get(kind)
        summary = "no forecasts to compare" if claim is None else claim.summary()
        console.print(f"Round 0 → last round, paired over the {kind} panel: {summary}.")
    if result.research is not None:
        research_table = Table(
            "round",
            "version",
            "searched",
            "evidence",
            "turns",
            "tokens",
            "parsed",
            "Brier",
            "informed",
            "uninformed",
            "gap closed",
            title="Research: the round's policy on the research panel",
        )
        for r in result.research.rounds:
            research_table.add_row(
                str(r.round),
                str(r.policy_version),
                f"{r.search_rate:.2f}",
                f"{r.evidence_rate:.2f}",
                f"{r.turns_per_rollout:.2f}",
                f"{r.tokens_per_rollout:.1f}",
                f"{r.parse_rate:.2f}",
                f"{r.brier:.4f}",
                f"{r.informed_brier:.4f}",
                f"{r.uninformed_brier:.4f}",
                f"{r.gap_closed:+.2f}",
            )
        console.print(research_table)
        console.print(
            "Warm-start demonstrations: first turn a tool call "
            f"{result.research.demonstration_first_turn_tool_rate:.2f}."
        )
        failed = {r.round: r.tool_errors for r in result.research.rounds if r.tool_errors}
        if failed:
            console.print(
                f"[red]Tool calls failed on the research panel (round: rollouts ended): {failed}; "
                "those rounds measure the corpus, not the policy.[/red]"
            )
    rejected = [v for v in result.lineage if v.status == "rejected"]
    console.print(
        f"Versions: {len(result.lineage)}, {len(rejected)} rejected by the promotion gate"
        + "".join(f"; v{v.version}: {v.reason}" for v in rejected)
    )
    verdict = "no forecasts to compare" if result.claim is None else result.claim.summary()
    console.print(
        f"Round 0 → last round, paired over the panel: {verdict}. Report: {result.report}"
    )
