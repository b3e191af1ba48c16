"""Per-round metrics and the report folder of the demo: metrics.json, report.md and plots.

Each round is judged on a fixed held-out panel of world questions (the same questions and
outcomes every round), forecast by the policy version of that round: round-to-round change is
then the policy's, not the luck of that day's questions. The Brier of the world's true
probabilities on the panel is the floor. The round's own live forecasts are scored too, once
their questions resolve (`live_brier`), for reference.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine

from futureworld.domain import OutcomeStatus
from futureworld.evaluation import plot_metric_by_round, plot_reliability
from futureworld.scoring import (
    accuracy,
    bootstrap_ci,
    brier,
    expected_calibration_error,
    log_score,
)
from storage.engine import session_scope
from storage.repositories.agents import get_agent
from storage.repositories.questions import latest_outcomes
from storage.repositories.rollouts import forecasts_of
from storage.repositories.training import train_steps_by_version

NAN = float("nan")


@dataclass(frozen=True)
class PanelScore:
    """One round's forecasts of the evaluation panel: p, outcome and true p per forecast."""

    round: int
    policy_version: int
    p_yes: tuple[float, ...]
    y: tuple[float, ...]
    p_true: tuple[float, ...]
    unparsed: int


@dataclass(frozen=True)
class RoundMetrics:
    round: int
    policy_version: int
    n: int
    brier: float
    brier_ci: tuple[float, float]
    ece: float
    accuracy: float
    log_score: float
    true_brier: float
    parse_rate: float
    live_brier: float | None
    live_n: int
    staleness: float | None
    """Mean staleness (in versions) of the data that trained this round's policy."""


def round_metrics(
    engine: Engine,
    agent: str,
    panels: Sequence[PanelScore],
    *,
    round_of: Callable[[datetime], int],
) -> list[RoundMetrics]:
    with session_scope(engine) as session:
        agent_id = get_agent(session, agent).id
        outcomes = latest_outcomes(session)
        forecasts = forecasts_of(session, agent_id)
        staleness = train_steps_by_version(session, agent_id)
    live: dict[int, list[tuple[float, float]]] = {}
    for t in forecasts:
        outcome = outcomes.get(t.question_id)
        if t.p_yes is None or t.as_of is None or outcome is None:
            continue
        if outcome.status is OutcomeStatus.RESOLVED:
            live.setdefault(round_of(t.as_of), []).append((t.p_yes, float(outcome.value)))
    result = []
    for panel in panels:
        p, y = list(panel.p_yes), list(panel.y)
        mine = live.get(panel.round, [])
        if not p:  # nothing parseable this round: the row says so instead of inventing scores
            result.append(
                RoundMetrics(
                    round=panel.round,
                    policy_version=panel.policy_version,
                    n=0,
                    brier=NAN,
                    brier_ci=(NAN, NAN),
                    ece=NAN,
                    accuracy=NAN,
                    log_score=NAN,
                    true_brier=NAN,
                    parse_rate=0.0,
                    live_brier=brier(*zip(*mine, strict=True)) if mine else None,
                    live_n=len(mine),
                    staleness=staleness.get(panel.policy_version),
                )
            )
            continue
        pairs = list(zip(p, y, strict=True))
        lo, hi = bootstrap_ci(pairs, lambda rows: brier(rows[:, 0], rows[:, 1]))
        result.append(
            RoundMetrics(
                round=panel.round,
                policy_version=panel.policy_version,
                n=len(p),
                brier=brier(p, y),
                brier_ci=(lo, hi),
                ece=expected_calibration_error(p, y),
                accuracy=accuracy(p, y),
                log_score=log_score(p, y),
                true_brier=brier(list(panel.p_true), y),
                parse_rate=len(p) / (len(p) + panel.unparsed),
                live_brier=brier(*zip(*mine, strict=True)) if mine else None,
                live_n=len(mine),
                staleness=staleness.get(panel.policy_version),
            )
        )
    return result


def write_report(
    out_dir: Path, metrics: Sequence[RoundMetrics], panels: Sequence[PanelScore], *, header: str
) -> Path:
    """metrics.json, report.md and PNG plots (Brier and ECE by round, reliability diagrams of
    the first and last rounds) in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "metrics.json").write_text(
        _json(
            {
                "rounds": [
                    {
                        "round": m.round,
                        "brier": m.brier,
                        "ece": m.ece,
                        "accuracy": m.accuracy,
                        "log_score": m.log_score,
                        "true_brier": m.true_brier,
                        "n": m.n,
                        "brier_ci": list(m.brier_ci),
                        "policy_version": m.policy_version,
                        "parse_rate": m.parse_rate,
                        "live_brier": m.live_brier,
                        "live_n": m.live_n,
                        "staleness": m.staleness,
                    }
                    for m in metrics
                ],
            }
        )
    )
    brier_series = {
        "forecaster (panel)": [(m.round, m.brier) for m in metrics],
        "true probabilities (floor)": [(m.round, m.true_brier) for m in metrics],
        "forecaster (live questions)": [
            (m.round, m.live_brier) for m in metrics if m.live_brier is not None
        ],
    }
    plot_metric_by_round(
        brier_series,
        out_dir / "brier_by_round.png",
        metric="Brier",
        title="Brier by round (lower is better)",
    )
    plot_metric_by_round(
        {"forecaster (panel)": [(m.round, m.ece) for m in metrics]},
        out_dir / "ece_by_round.png",
        metric="ECE",
        title="Expected calibration error by round",
    )
    first, last = panels[0], panels[-1]
    groups = {
        f"round {panel.round}": (list(panel.p_yes), list(panel.y))
        for panel in (first, last)
        if panel.p_yes
    }
    if groups:
        plot_reliability(
            groups, out_dir / "reliability.png", title="Reliability: first and last round"
        )
    lines = [
        header,
        "",
        "| round | version | n | Brier | 95% CI | ECE | accuracy | log score | "
        "true-p Brier | parsed | live Brier (n) | staleness |",
        "|---" * 12 + "|",
    ]
    for m in metrics:
        live = "—" if m.live_brier is None else f"{m.live_brier:.4f} ({m.live_n})"
        stale = "—" if m.staleness is None else f"{m.staleness:.2f}"
        lines.append(
            f"| {m.round} | {m.policy_version} | {m.n} | {m.brier:.4f} | "
            f"[{m.brier_ci[0]:.4f}, {m.brier_ci[1]:.4f}] | {m.ece:.4f} | {m.accuracy:.3f} | "
            f"{m.log_score:.4f} | {m.true_brier:.4f} | {m.parse_rate:.2f} | {live} | {stale} |"
        )
    lines += [
        "",
        "![Brier by round](brier_by_round.png)",
        "![ECE by round](ece_by_round.png)",
        "![Reliability](reliability.png)",
        "",
    ]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return report


def _json(data: object) -> str:
    """JSON with NaN (a round without parseable forecasts) written as null."""

    def clean(value: object) -> object:
        if isinstance(value, float) and value != value:
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(data), indent=2)


def learned(metrics: Sequence[RoundMetrics]) -> bool:
    """The demo's claim: the last round beats round 0's Brier beyond its bootstrap interval,
    and its ECE is lower."""
    first, last = metrics[0], metrics[-1]
    return last.brier < first.brier_ci[0] and last.ece < first.ece
