"""The backtest's report folder: metrics.json, report.md and the Brier-by-round plot, each
naming its reference and fallback and counting what was paired with which and what was left out
(the backtest itself is flows.stages.backtesting)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from futureworld.plots import plot_metric_by_round

if TYPE_CHECKING:
    from flows.stages.backtesting import BacktestOptions, BacktestRound, Coverage


def write_backtest_report(
    out_dir: Path, options: BacktestOptions, rounds: list[BacktestRound], coverage: Coverage
) -> Path:
    """metrics.json, report.md and the Brier-by-round plot, in the demo's report format; each
    names its reference and fallback and counts what was paired with which and what was left
    out."""
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
        "coverage": asdict(coverage),
        "rounds": [
            {**asdict(r), "clock": r.clock.isoformat(), "difference_ci": r.difference_ci}
            for r in rounds
        ],
    }
    (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    scored = [r for r in rounds if r.brier is not None]
    series = {
        options.agent: [(r.round, r.brier) for r in scored],
        reference: [(r.round, r.reference_brier) for r in scored],
    }
    plot_metric_by_round(
        series, out_dir / "brier_by_round.png", metric="Brier", title="Brier by round (paired)"
    )
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
        "the difference.",
        "",
        f"Reference: {reference}. A question it has no forecast of (a dataset question has no "
        f"crowd probability) {stand_in}; the reference column is the Brier of the paired "
        "forecasts, both kinds together.",
        "",
        f"Coverage: of {c.resolved} questions resolved by the last clock, "
        f"{c.against_reference + c.against_fallback} were scored ({c.against_reference} "
        f"against {reference}, {c.against_fallback} against {fallback or '—'}); left out: "
        f"{c.not_forecast} never forecast in this run, {c.not_binary} not binary, "
        f"{c.no_reference} without a reference forecast, {c.no_answer} without a parsed "
        "answer.",
        "",
        f"| round | clock | version | forecasts | trained to | n | vs {reference} | "
        f"vs {fallback or 'fallback'} | Brier | reference | difference | 95% CI | "
        "unresolved | not binary | no reference | no answer | unparsed rollouts |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rounds:
        ci = (
            "—"
            if r.difference_ci is None
            else f"[{r.difference_ci[0]:+.4f}, {r.difference_ci[1]:+.4f}]"
        )
        out = r.left_out
        lines.append(
            f"| {r.round} | {r.clock.date()} | {r.policy_version} | {r.forecasts} | "
            f"{'—' if r.trained_to is None else r.trained_to} | {r.n} | "
            f"{r.against_reference} | {r.against_fallback} | {_f(r.brier)} | "
            f"{_f(r.reference_brier)} | {_f(r.difference, signed=True)} | {ci} | "
            f"{out.unresolved} | {out.not_binary} | {out.no_reference} | {out.no_answer} | "
            f"{out.unparsed_rollouts} |"
        )
    lines += ["", "![Brier by round](brier_by_round.png)", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
    return out_dir


def _f(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.4f}" if signed else f"{value:.4f}"
