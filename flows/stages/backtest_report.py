"""The backtest's report folder: metrics.json, report.md and the Brier-by-day plot, each
naming its reference and fallback, counting n as questions with the parse rate beside every
score, and what was paired with which and what was left out (the backtest itself is
flows.stages.backtesting)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from futureworld.imputation import IMPUTED_P
from futureworld.plots import paired_by_day_figure, save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from flows.stages.backtesting import BacktestOptions, BacktestRound, Coverage


def write_backtest_report(
    out_dir: Path, options: BacktestOptions, rounds: list[BacktestRound], coverage: Coverage
) -> Path:
    """metrics.json, report.md and the Brier-by-day plot (brier_by_round.png), in the demo's
    report format; each names its reference and fallback, counts n as questions with the parse
    rate beside every score, and what was paired with which and what was left out."""
    out_dir.mkdir(parents=True, exist_ok=True)
    reference, fallback = options.reference, options.fallback_reference
    metrics = {
        "agent": options.agent,
        "reference": reference,
        "fallback_reference": fallback,
        "start": options.start.isoformat(),
        "end": options.end.isoformat(),
        "step_days": options.step_days,
        "train_every": options.train_every,
        "samples": options.samples,
        "limit": options.limit,
        "scored_as": "per question: the mean of its G rollouts, an unparsed one counted as "
        f"{IMPUTED_P}; n counts questions; sample_brier is the expected Brier of one rollout",
        "coverage": asdict(coverage),
        "rounds": [
            {**asdict(r), "clock": r.clock.isoformat(), "difference_ci": r.difference_ci}
            for r in rounds
        ],
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    save_png(brier_by_day_figure(options, rounds), out_dir / "brier_by_round.png")
    stand_in = (
        f"is paired with {fallback}'s forecast instead"
        if fallback is not None
        else "is left out (no fallback reference)"
    )
    c = coverage
    lines = [
        f"# Backtest: {options.agent} against {reference}",
        "",
        f"{options.start} to {options.end}, every {options.step_days} day(s); training every "
        f"{options.train_every} cycle(s); G = {options.samples}; limit {options.limit}.",
        "Each round's forecasts are paired with the reference's on the same questions "
        "(outcomes revealed by the last clock); the interval is the 95% paired bootstrap of "
        "the difference, resampling questions.",
        "",
        "n counts questions: the agent's forecast of a question is the mean of its G "
        "rollouts, an unparsed rollout counting as 0.5 (ForecastBench's imputation of a "
        "missing forecast), so an unparsed answer is scored as knowing nothing, never dropped; "
        "the parse rate is that of the n questions' rollouts, and the per-rollout Brier is the "
        "expected Brier of one sample.",
        "",
        f"Reference: {reference}. A question it has no parsed forecast of (a dataset question "
        f"has no crowd probability) {stand_in}; the reference column is the Brier of the "
        "paired forecasts, both kinds together.",
        "",
        f"Coverage: of {c.resolved} questions resolved by the last clock, "
        f"{c.against_reference + c.against_fallback} were scored ({c.against_reference} "
        f"against {reference}, {c.against_fallback} against {fallback or '—'}); left out: "
        f"{c.not_forecast} forecast in no round, {c.not_binary} not binary, "
        f"{c.no_reference} without a reference forecast.",
        "",
        f"| round | clock | version | rollouts written | trained to | n questions | "
        f"vs {reference} | vs {fallback or 'fallback'} | parse rate | Brier | "
        f"per-rollout Brier | {reference} Brier | difference | 95% CI | "
        "left out: unresolved | not binary | no reference |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rounds:
        ci = (
            "—"
            if r.difference_ci is None
            else f"[{r.difference_ci[0]:+.4f}, {r.difference_ci[1]:+.4f}]"
        )
        out = r.left_out
        parse = "—" if r.parse_rate is None else f"{r.parse_rate:.3f} of {r.rollouts}"
        lines.append(
            f"| {r.round} | {r.clock.date()} | {r.policy_version} | {r.forecasts} | "
            f"{'—' if r.trained_to is None else r.trained_to} | {r.n} | "
            f"{r.against_reference} | {r.against_fallback} | {parse} | {_f(r.brier)} | "
            f"{_f(r.sample_brier)} | {_f(r.reference_brier)} | "
            f"{_f(r.difference, signed=True)} | {ci} | "
            f"{out.unresolved} | {out.not_binary} | {out.no_reference} |"
        )
    lines += ["", "![Brier by simulated day](brier_by_round.png)", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return out_dir


def brier_by_day_figure(options: BacktestOptions, rounds: list[BacktestRound]) -> Figure:
    """The agent's Brier per simulated day with the 95% paired bootstrap interval over
    questions (the interval of the difference placed on the reference's Brier: a bar that
    crosses the reference line is no clear difference) and the reference's Brier on the same
    questions as a labelled line; with no scored round, the reason in the frame."""
    fallback = options.fallback_reference
    reference = options.reference + ("" if fallback is None else f" (or {fallback})")
    intervals = [
        None
        if r.difference_ci is None or r.reference_brier is None
        else (r.reference_brier + r.difference_ci[0], r.reference_brier + r.difference_ci[1])
        for r in rounds
    ]
    parsed = [r.parse_rate for r in rounds if r.parse_rate is not None]
    rate = ""
    if parsed:
        low, high = f"{min(parsed):.0%}", f"{max(parsed):.0%}"
        rate = f", parse rate {low}" + ("" if low == high else f"–{high}")
    return paired_by_day_figure(
        [r.clock for r in rounds],
        [r.brier for r in rounds],
        intervals,
        [r.reference_brier for r in rounds],
        label=f"{options.agent} (95% paired CI vs reference)",
        reference_label=f"reference: {reference}, same questions",
        counts=[r.n for r in rounds],
        title=f"Backtest: {options.agent} against {reference} (n = questions{rate})",
        empty=_nothing_scored(rounds),
    )


def _nothing_scored(rounds: list[BacktestRound]) -> str:
    """Why no round has a score, in one line."""
    if not any(r.forecasts for r in rounds):
        return f"no forecasts: the agent forecast no question in {len(rounds)} round(s)"
    unresolved = sum(r.left_out.unresolved for r in rounds)
    not_binary = sum(r.left_out.not_binary for r in rounds)
    no_reference = sum(r.left_out.no_reference for r in rounds)
    last = rounds[-1].clock.date()
    return (
        f"no scored round: of the questions forecast, {unresolved} not resolved by {last},\n"
        f"{not_binary} not binary, {no_reference} without a reference forecast"
    )


def _f(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.4f}" if signed else f"{value:.4f}"
