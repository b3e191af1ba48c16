"""Per-round metrics and the report folder of the demo: metrics.json, report.md and plots.

A round is one simulated day; a forecast belongs to the round of the instant it was made,
and is scored once its question resolves. The Brier of the world's true probabilities on
the same forecasts is the floor no forecaster can beat in expectation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import Engine

from futureworld.domain import OutcomeStatus
from futureworld.evaluation import (
    ForecastRecord,
    plot_metric_by_round,
    plot_reliability,
    score_forecasts,
)
from futureworld.scoring import brier
from storage.engine import session_scope
from storage.repositories.agents import list_agents
from storage.repositories.questions import latest_outcomes, list_questions
from storage.repositories.rollouts import rollouts_for
from storage.repositories.training import train_steps_by_version


@dataclass(frozen=True)
class RoundMetrics:
    round: int
    agent: str
    policy_version: int | None
    n: int
    brier: float
    brier_ci: tuple[float, float]
    ece: float
    accuracy: float
    log_score: float
    true_brier: float
    staleness: float | None
    """Mean staleness (in versions) of the data that trained this round's policy."""


def round_metrics(
    engine: Engine,
    *,
    round_of: Callable[[datetime], int],
    true_probability: Callable[[str], float],
) -> list[RoundMetrics]:
    with session_scope(engine) as session:
        questions = {q.id: q for q in list_questions(session)}
        outcomes = latest_outcomes(session)
        agents = list_agents(session)
        rollouts = {a.name: rollouts_for(session, agent_id=a.id) for a in agents}
        staleness = {a.name: train_steps_by_version(session, a.id) for a in agents}
    records: list[ForecastRecord] = []
    truths: dict[tuple[str, int], list[tuple[float, float]]] = {}
    versions: dict[tuple[str, int], set[int]] = {}
    for agent in agents:
        for t in rollouts[agent.name]:
            outcome = outcomes.get(t.question_id)
            if outcome is None or outcome.status is not OutcomeStatus.RESOLVED:
                continue
            if t.p_yes is None or t.as_of is None:
                continue
            question = questions[t.question_id]
            r = round_of(t.as_of)
            records.append(
                ForecastRecord(
                    agent=agent.name,
                    policy_version=None,
                    source=question.source,
                    domain=question.domain,
                    p_yes=t.p_yes,
                    y=float(outcome.value),
                    round=r,
                )
            )
            truths.setdefault((agent.name, r), []).append(
                (true_probability(question.external_id), float(outcome.value))
            )
            versions.setdefault((agent.name, r), set()).add(t.policy_version)
    rows = score_forecasts(records, by=("agent", "round"), include_overall=False)
    result = []
    for row in rows:
        key = (row.agent, row.round)
        p_true, y = zip(*truths[key], strict=True)
        version = max(versions[key])
        result.append(
            RoundMetrics(
                round=row.round,
                agent=row.agent,
                policy_version=version,
                n=row.n,
                brier=row.brier,
                brier_ci=tuple(row.brier_ci),
                ece=row.ece,
                accuracy=row.accuracy,
                log_score=row.log_score,
                true_brier=brier(p_true, y),
                staleness=staleness[row.agent].get(version),
            )
        )
    return sorted(result, key=lambda m: (m.agent, m.round))


def write_report(
    out_dir: Path,
    metrics: Sequence[RoundMetrics],
    *,
    agent: str,
    reliability: dict[str, tuple[list[float], list[float]]],
    header: str,
) -> Path:
    """metrics.json (the learning agent's rounds), report.md and PNG plots in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    mine = [m for m in metrics if m.agent == agent]
    (out_dir / "metrics.json").write_text(
        json.dumps(
            {
                "agent": agent,
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
                        "staleness": m.staleness,
                    }
                    for m in mine
                ],
                "all_agents": [asdict(m) for m in metrics],
            },
            indent=2,
        )
    )
    for metric in ("brier", "ece"):
        series: dict[str, list[tuple[float, float]]] = {}
        for m in metrics:
            series.setdefault(m.agent, []).append((m.round, getattr(m, metric)))
        if metric == "brier":
            series["true probabilities (floor)"] = [(m.round, m.true_brier) for m in mine]
        plot_metric_by_round(
            series,
            out_dir / f"{metric}_by_round.png",
            metric=metric,
            title=f"{metric.upper()} by round",
        )
    plot_reliability(
        reliability, out_dir / "reliability.png", title="Reliability: first and last round"
    )
    lines = [
        header,
        "",
        "| round | agent | version | n | Brier | 95% CI | ECE | accuracy | "
        "log score | true-p Brier | staleness |",
        "|---" * 11 + "|",
    ]
    for m in metrics:
        stale = "—" if m.staleness is None else f"{m.staleness:.2f}"
        lines.append(
            f"| {m.round} | {m.agent} | {m.policy_version if m.policy_version is not None else '—'}"
            f" | {m.n} | {m.brier:.4f} | [{m.brier_ci[0]:.4f}, {m.brier_ci[1]:.4f}] | "
            f"{m.ece:.4f} | {m.accuracy:.3f} | {m.log_score:.4f} | {m.true_brier:.4f} | {stale} |"
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
