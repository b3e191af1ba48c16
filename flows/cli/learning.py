"""`futureworld train` and `evaluate`: the commands that update and judge policies."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flows.cli.common import (
    AsOfOption,
    DbOption,
    UserError,
    cli_context,
    console,
    require_agent,
    writable_file,
    write_output,
)
from flows.cli.history import RoundOption, round_date
from flows.cli.progress import Reporter, progress_report
from flows.stages.serving import ServeReport
from flows.stages.training import TrainOptions, TrainProgress
from flows.tracking import ReportTo
from futureworld.domain import VersionStatus
from futureworld.evaluation_kinds import (
    CHOICE_COLUMNS,
    NUMERIC_COLUMNS,
    ChoiceScoreRow,
    NumericScoreRow,
)
from futureworld.rewards import RewardFn
from futureworld.rl.config import Estimator, TrainConfig


def register_learning_commands(app: typer.Typer) -> None:
    app.command("train")(train_command)
    app.command("serve")(serve_command)
    app.command("evaluate")(evaluate_command)


def _check_positive(value: float | None) -> float | None:
    if value is not None and not value > 0:  # NaN too
        raise typer.BadParameter(f"must be a number > 0, got {value}")
    return value


def train_command(
    agent: Annotated[str, typer.Option("--agent", help="Agent name.")],
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="A training setting, name=value (repeatable): any TrainConfig field, e.g. "
            "--set clip_high=0.3 --set m2po_tau=0.04 (flows/stages/train_options.py).",
        ),
    ] = None,
    config_file: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="A TOML file of training settings (TrainConfig field = value); --set wins.",
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ] = None,
    estimator: Annotated[
        Estimator | None, typer.Option(help="Short for --set estimator=E.")
    ] = None,
    reward: Annotated[
        RewardFn | None, typer.Option("--reward", help="Short for --set reward_fn=R.")
    ] = None,
    learning_rate: Annotated[
        float | None,
        typer.Option(help="Short for --set learning_rate=X (> 0).", callback=_check_positive),
    ] = None,
    kl_coef: Annotated[float | None, typer.Option(help="Short for --set kl_coef=C.")] = None,
    kl_reference: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Registered version the KL penalty anchors to: 0 (the base model, the "
            "default) or a later full model, e.g. the supervised warm start; with "
            "--kl-trail, the oldest version the trailing anchor may reach.",
        ),
    ] = TrainOptions.model_fields["kl_reference"].default,
    kl_trail: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Anchor the KL penalty to the promoted version K promotions before the "
            "update's base (rejected versions skipped; the oldest promoted one when the "
            "lineage is shorter), found again at every update; with --kl-reference, never "
            "older than that version.",
        ),
    ] = TrainOptions.model_fields["kl_trail"].default,
    max_groups: Annotated[int | None, typer.Option(help="Replay at most this many groups.")] = None,
    draw_groups: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Train on at most this many of the replayed groups, drawn at random (seeded "
            "by the as-of day and parent version); the rest wait.",
        ),
    ] = None,
    rejection_backoff: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Retry a rejected step shorter: an update whose parent has k rejected "
            "versions trains at the learning rate x B^k.",
        ),
    ] = None,
    lora: Annotated[bool, typer.Option("--lora", help="Train a LoRA adapter.")] = False,
    reuse: Annotated[
        bool, typer.Option("--reuse", help="Also replay groups this lineage trained on before.")
    ] = False,
    sft: Annotated[bool, typer.Option("--sft", help="Supervised fine-tuning.")] = False,
    from_jsonl: Annotated[
        Path | None,
        typer.Option(
            "--from-jsonl",
            help='SFT data: {"prompt": …, "completion": …} per line.',
            exists=True,
            dir_okay=False,
            readable=True,
        ),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            help="Continue from this registered checkpoint (the new version's parent).",
            exists=True,
        ),
    ] = None,
    fresh_optimizer: Annotated[
        bool,
        typer.Option(
            "--fresh-optimizer",
            help="Start a new AdamW instead of continuing the newest RL version's moments.",
        ),
    ] = False,
    nproc: Annotated[
        int,
        typer.Option(
            "--nproc",
            min=1,
            help="Training processes (torchrun + DDP; gloo on CPU, NCCL on GPUs); the update "
            "equals one process's.",
        ),
    ] = TrainOptions.model_fields["nproc"].default,
    report_to: Annotated[
        ReportTo | None,
        typer.Option(
            "--report-to",
            help="Experiment tracker for this update's steps and summary (default "
            "FW_REPORT_TO, else none).",
        ),
    ] = None,
    db: DbOption = None,
) -> None:
    """Replay completed groups into a staleness-corrected update; register the new version,
    which serves once the promotion gate passes it (FW_VALIDATION_FRACTION of the questions
    held out; 0: no gate).
    Every training setting is a TrainConfig field, set by --config FILE.toml and --set
    name=value (defaults: TrainConfig's)."""
    from flows.stages.lineage import LineageError, check_update, kl_anchor
    from flows.stages.train_options import TrainConfigError, config_with_overrides
    from flows.stages.training import (
        replay_and_train,
        sft_trajectories_from_jsonl,
        supervised_finetune,
    )

    if sft and from_jsonl is None:
        raise typer.BadParameter("--sft needs --from-jsonl FILE")
    shorthand = {
        "estimator": Estimator.SFT if sft else estimator,
        "reward_fn": reward,
        "learning_rate": learning_rate,
        "kl_coef": kl_coef,
    }
    sets = [*(set_ or ()), *(f"{k}={v}" for k, v in shorthand.items() if v is not None)]
    try:
        config = config_with_overrides(TrainConfig(), sets=sets, toml=config_file)
    except TrainConfigError as error:
        raise UserError(str(error)) from None
    options = TrainOptions(
        config=config,
        lora=lora,
        kl_reference=kl_reference,
        kl_trail=kl_trail,
        max_groups=max_groups,
        draw_groups=draw_groups,
        rejection_backoff=rejection_backoff,
        reuse=reuse,
        fresh_optimizer=fresh_optimizer,
        nproc=nproc,
        report_to=report_to,
    )
    from flows.stages.serving import serve_current_version

    with cli_context(db) as ctx:
        require_agent(ctx, agent)
        try:
            learner = ctx.agent(agent)
            current = ctx.current_version(learner)
            anchor = kl_anchor(
                ctx, learner, current, kl_reference=kl_reference, kl_trail=kl_trail, lora=lora
            )
            check_update(learner, current, kl_reference=anchor, lora=lora)
            with progress_report(console, f"train {agent}") as progress:
                on_progress = _step_reporter(progress, f"train {agent}")
                if sft:
                    assert from_jsonl is not None
                    trajectories = sft_trajectories_from_jsonl(ctx, agent, from_jsonl)
                    report = supervised_finetune(
                        ctx, agent, trajectories, options, on_progress=on_progress
                    )
                else:
                    report = replay_and_train(
                        ctx, agent, options, resume_from=resume, on_progress=on_progress
                    )
        except LineageError as error:  # a version or checkpoint named by the caller
            raise UserError(str(error)) from None
        if report is not None:  # the next predict samples the new version
            print_serve_report(serve_current_version(ctx, agent))
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
    if report.gate is not None:
        verdict = f"{report.status} by the gate ({report.gate.reason})"
    elif report.status is VersionStatus.CANDIDATE:
        verdict = f"candidate: the gate could not judge it; `futureworld gate --agent {agent}`"
    else:
        verdict = f"{report.status}, not gated"
    console.print(
        f"{report.agent} v{report.to_version}: {verdict}",
        soft_wrap=True,
        markup=False,
        highlight=False,
    )


LOG_LINES_PER_UPDATE = 10
"""Outside a terminal, a train step is worth a line of its own at each tenth of the steps
(the heartbeat covers the silence between)."""


def _step_reporter(progress: Reporter, description: str) -> TrainProgress:
    """An update's on_progress that keeps `progress` at steps done / planned with the step's
    loss; a new description (a log line at once) at each tenth of the steps."""
    shown = -1

    def on_progress(done: int, total: int, metrics: Mapping[str, float]) -> None:
        nonlocal shown
        tenth = LOG_LINES_PER_UPDATE * done // max(total, 1)
        new_line = tenth != shown
        shown = tenth
        progress.update(
            description=f"{description}: step {done}" if new_line else None,
            completed=done,
            total=total,
            note=f"loss {metrics['loss']:.4f}, kl_prox {metrics.get('kl_prox', 0.0):.4f}",
        )

    return on_progress


def serve_command(
    agent: Annotated[str, typer.Option("--agent", help="Agent name.")],
    db: DbOption = None,
) -> None:
    """Make the agent's server sample its newest version: load a LoRA adapter into the
    running vLLM server, or restart the server on a full checkpoint (FW_SERVE_RESTART_COMMAND)
    and wait until it lists the version. Local agents need nothing."""
    from flows.stages.serving import serve_current_version

    with cli_context(db) as ctx:
        require_agent(ctx, agent)
        print_serve_report(serve_current_version(ctx, agent))


def print_serve_report(report: ServeReport) -> None:
    where = f" as {report.served_name}" if report.served_name else ""
    console.print(
        f"{report.agent} v{report.version}: {report.action}{where} "
        f"(served after {report.waited_s:.1f} s)"
    )


def evaluate_command(
    json_path: Annotated[Path | None, typer.Option("--json", help="Write rows as JSON.")] = None,
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Reliability diagram PNG (and, with numeric questions, a PIT histogram next "
            "to it: <stem>.pit.png).",
        ),
    ] = None,
    agent: Annotated[list[str] | None, typer.Option("--agent", help="Only these agents.")] = None,
    round_: RoundOption = None,
    by_horizon: Annotated[
        bool,
        typer.Option(
            "--by-horizon",
            help="Also break the binary table down by horizon (forecast to resolution: ≤7 d, "
            "8–30 d, 31–90 d, 91–180 d, >180 d), every source pooled.",
        ),
    ] = False,
    as_of: AsOfOption = None,
    db: DbOption = None,
) -> None:
    """Score every agent and policy version, per source and overall, as of --as-of (default:
    now; only the forecasts made and outcomes resolved by then), one table per question kind
    (binary, choice, numeric), with ForecastBench's leaderboard on imported ForecastBench
    questions (5% rule, difficulty-adjusted Brier, Brier Index, the difficulty model's reference
    set). --json writes the rows of each kind: "rows" (binary), "choice_rows", "numeric_rows",
    "forecastbench" (leaderboard rows) and "forecastbench_reference_set", with --by-horizon also
    "horizon_rows" (each a binary row with its "horizon"). --round scores only the forecasts of
    that ForecastBench round's questions."""
    from flows.stages.evaluating import baseline_agents, evaluate
    from futureworld.evaluation import (
        reliability_groups,
        score_cell,
    )
    from futureworld.evaluation_kinds import pit_groups
    from futureworld.horizons import score_by_horizon
    from futureworld.leaderboard import leaderboard_rows_text
    from futureworld.plots import plot_pit_histogram, plot_reliability
    from storage.repositories.questions import UnknownRound

    writable_file(json_path, "--json")
    writable_file(plot, "--plot")
    with cli_context(db, as_of) as ctx:
        for name in agent or ():
            require_agent(ctx, name)
        try:
            evaluation = evaluate(ctx, agent, round=round_date(round_))
        except UnknownRound as error:
            raise UserError(str(error)) from None
        baselines = baseline_agents(ctx) if by_horizon else set()
    # the terminal's short headers; the JSON and the artifact keep every column
    columns = {
        "n": "n q", "parse_rate": "parsed", "brier": "Brier", "brier_ci": "95% CI",
        "log_score": "log", "accuracy": "acc", "ece": "ECE",
        "brier_skill_vs_crowd": "skill/crowd", "brier_skill_vs_base_rate": "skill/base",
        "imputed": "imputed", "eligibility": "5% rule",
    }  # fmt: skip
    binary = Table("agent", "ver", "source", *columns.values())
    for row in evaluation.rows:
        binary.add_row(
            row.agent or "all",
            str(row.policy_version),
            row.source or "all",
            *(score_cell(getattr(row, c)) for c in columns),
        )
    console.print(binary)
    horizon_rows = (
        score_by_horizon(evaluation.records, reference_agents=baselines) if by_horizon else []
    )
    if by_horizon:
        by_time = Table("agent", "ver", "horizon", *columns.values(), title="by horizon")
        for label, row in horizon_rows:
            by_time.add_row(
                row.agent or "all",
                str(row.policy_version),
                label,
                *(score_cell(getattr(row, c)) for c in columns),
            )
        console.print(by_time)
    for title, kind_rows in (
        ("choice questions", evaluation.choice_rows),
        ("numeric questions", evaluation.numeric_rows),
    ):
        if kind_rows:
            console.print(kind_score_table(kind_rows, title))
    board = evaluation.forecastbench
    if board is not None and board.rows:
        for line in leaderboard_rows_text(board):
            console.print(line, soft_wrap=True, markup=False, highlight=False)
    if json_path is not None:
        rows = json.dumps(
            {
                "rows": [r.as_dict() for r in evaluation.rows],
                "choice_rows": [r.as_dict() for r in evaluation.choice_rows],
                "numeric_rows": [r.as_dict() for r in evaluation.numeric_rows],
                "forecastbench": [h.as_dict() for h in board.rows] if board else [],
                "forecastbench_reference_set": board.as_dict()["reference_set"] if board else {},
                **(
                    {"horizon_rows": [{"horizon": h, **r.as_dict()} for h, r in horizon_rows]}
                    if by_horizon
                    else {}
                ),
            },
            indent=2,
        )
        write_output(json_path, "--json", rows)
        console.print(f"wrote {json_path}")
    if plot is not None:
        plot_reliability(reliability_groups(evaluation.records), plot)
        console.print(f"wrote {plot}")
        if evaluation.numeric_records:
            pit_path = plot.with_name(f"{plot.stem}.pit.png")
            plot_pit_histogram(pit_groups(evaluation.numeric_records), pit_path)
            console.print(f"wrote {pit_path}")


def kind_score_table(
    rows: Sequence[ChoiceScoreRow] | Sequence[NumericScoreRow], title: str
) -> Table:
    """Choice or numeric score rows as a table: the group, then the kind's metric columns."""
    columns = CHOICE_COLUMNS if isinstance(rows[0], ChoiceScoreRow) else NUMERIC_COLUMNS
    table = Table("agent", "ver", "source", *columns, title=title)
    for row in rows:
        cells = [row.agent or "all", str(row.policy_version), row.source or "all"]
        for column in columns:
            value = getattr(row, column)
            if value is None:
                cells.append("—")
            elif column == "pit_counts":
                cells.append(" ".join(map(str, value)))
            elif isinstance(value, tuple):
                cells.append(f"[{value[0]:.3f}, {value[1]:.3f}]")
            elif isinstance(value, float):
                cells.append(f"{value:.3f}")
            else:
                cells.append(str(value))
        table.add_row(*cells)
    return table
