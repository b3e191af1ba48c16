"""Per-round metrics and the report folder of the demo: metrics.json, report.md and plots.

Each round is judged on a fixed held-out panel of world questions (the same questions and
outcomes every round), forecast by the policy version of that round: round-to-round change is
then the policy's, not the luck of that day's questions. The Brier of the world's true
probabilities on the panel is the floor. The round's own live forecasts are scored too, once
their questions resolve (`live_brier`), for reference.

The learning claim compares the last round with round 0 on that panel: Brier and ECE must both
drop, each by more than its 95% paired bootstrap interval (resampling panel questions with all
their samples, in both rounds at once), i.e. the interval of the difference lies below zero.
Pairing is what the design of a fixed panel buys: the outcome noise both rounds share cancels,
so the test sees the policy's change rather than which way the panel's coins fell. Each
round's own (unpaired) Brier interval is reported as well.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from flows.context import PipelineContext
from flows.demo.kind_scores import KIND_PANELS, KindPanelScore
from flows.demo.panel import PanelScore
from flows.demo.research_panel import ResearchPath, ResearchRound
from flows.stages.evaluating import forecast_records
from futureworld.plots import plot_metric_by_round, plot_reliability
from futureworld.scoring import (
    PairedDifference,
    accuracy,
    bootstrap_ci,
    brier,
    expected_calibration_error,
    log_score,
    paired_bootstrap_difference,
)
from storage.engine import session_scope
from storage.repositories.training import train_steps_by_version

NAN = float("nan")


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


PARSE_RATE_SLACK = 0.02
"""The last round may parse this much less often than round 0 and still count as learning."""


@dataclass(frozen=True)
class LearningClaim:
    """Round 0 against the last round on the panel, paired by question."""

    brier: PairedDifference
    ece: PairedDifference
    parse_rates: tuple[float, float]
    """Share of the panel forecasts that parsed, first and last round."""
    forecasts: tuple[int, int]
    """Panel forecasts of the first and the last round, parsed or not: the panel the claim
    compares (the research demo's whole panel, where its rounds between score a head)."""

    @property
    def learned(self) -> bool:
        """Brier and ECE both lower, each beyond its 95% paired bootstrap interval, and not by
        ceasing to answer (scores are over parsed answers only)."""
        answering = self.parse_rates[1] >= self.parse_rates[0] - PARSE_RATE_SLACK
        return answering and self.brier.ci[1] < 0.0 and self.ece.ci[1] < 0.0

    def summary(self) -> str:
        def line(name: str, d: PairedDifference) -> str:
            return (
                f"{name} {d.before:.4f} → {d.after:.4f} (Δ {d.difference:+.4f}, 95% CI "
                f"[{d.ci[0]:+.4f}, {d.ci[1]:+.4f}])"
            )

        verdict = "learned" if self.learned else "no clear improvement"
        return f"{line('Brier', self.brier)}; {line('ECE', self.ece)}: {verdict}"


def learning_claim(panels: Sequence[PanelScore], n_resamples: int = 1000) -> LearningClaim | None:
    """The claim of the first against the last panel; None when either has no forecast."""
    first, last = panels[0], panels[-1]
    if not first.p_yes or not last.p_yes:
        return None
    before, after = first.rows(), last.rows()
    return LearningClaim(
        brier=paired_bootstrap_difference(before, after, brier, n_resamples=n_resamples),
        ece=paired_bootstrap_difference(
            before, after, expected_calibration_error, n_resamples=n_resamples
        ),
        parse_rates=(first.parse_rate, last.parse_rate),
        forecasts=(len(before) + first.unparsed, len(after) + last.unparsed),
    )


def round_metrics(
    ctx: PipelineContext,
    agent: str,
    panels: Sequence[PanelScore],
    *,
    round_of: Callable[[datetime], int],
) -> list[RoundMetrics]:
    learner = ctx.agent(agent)
    with session_scope(ctx.engine) as session:
        staleness = train_steps_by_version(session, learner.id)
    live: dict[int, list[tuple[float, float]]] = {}
    for record in forecast_records(ctx, [agent]):
        if record.as_of is not None:
            live.setdefault(round_of(record.as_of), []).append((record.p_yes, record.y))
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
                parse_rate=panel.parse_rate,
                live_brier=brier(*zip(*mine, strict=True)) if mine else None,
                live_n=len(mine),
                staleness=staleness.get(panel.policy_version),
            )
        )
    return result


def write_report(
    out_dir: Path,
    metrics: Sequence[RoundMetrics],
    ends: Sequence[PanelScore],
    claim: LearningClaim | None,
    *,
    header: str,
    extra_markdown: str = "",
    extra_json: dict[str, object] | None = None,
    sections: dict[str, object] | None = None,
) -> Path:
    """metrics.json, report.md and PNG plots (Brier and ECE by round, reliability diagrams of
    the first and last rounds: `ends`, the panel scores the claim compares) in `out_dir`;
    `extra_markdown` ends the report, `extra_json` goes into metrics.json under "kinds" (the
    choice and numeric panels) and each of `sections` under its own key (the research
    rounds, the version lineage)."""
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
                "claim": None
                if claim is None
                else {
                    "learned": claim.learned,
                    "forecasts": list(claim.forecasts),
                    **{
                        name: {
                            "first": d.before,
                            "last": d.after,
                            "difference": d.difference,
                            "ci": list(d.ci),
                        }
                        for name, d in (("brier", claim.brier), ("ece", claim.ece))
                    },
                },
                **({"kinds": extra_json} if extra_json else {}),
                **(sections or {}),
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
    first, last = ends[0], ends[-1]
    groups = {
        f"round {panel.round}": (list(panel.p_yes), list(panel.y))
        for panel in (first, last)
        if panel.p_yes
    }
    if groups:
        plot_reliability(
            groups, out_dir / "reliability.png", title="Reliability: first and last round"
        )
    verdict = "no round-0 or last-round forecasts to compare" if claim is None else claim.summary()
    lines = [
        header,
        "",
        f"**Round 0 → round {metrics[-1].round}** (paired bootstrap over panel questions): "
        f"{verdict}.",
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
    if extra_markdown:
        lines += [extra_markdown, ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return report


def panel_brier_ece(score: PanelScore) -> tuple[float, float]:
    """A round's panel Brier and ECE over its parsed forecasts; NaN when none parsed."""
    from futureworld.scoring import brier, expected_calibration_error

    if not score.p_yes:
        return float("nan"), float("nan")
    return brier(score.p_yes, score.y), expected_calibration_error(score.p_yes, score.y)


class RoundLog:
    """One line per round, appended and flushed as the round ends."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._started = time.perf_counter()
        path.write_text("")

    def write(
        self,
        score: PanelScore,
        kind_scores: Sequence[KindPanelScore] = (),
        *,
        research: ResearchRound | None = None,
    ) -> None:
        panel_brier, panel_ece = panel_brier_ece(score)
        line = (
            f"{time.perf_counter() - self._started:8.1f}s  round {score.round:>3}  "
            f"version {score.policy_version:>3}  panel Brier {panel_brier:.4f}  "
            f"ECE {panel_ece:.4f}  parsed {score.parse_rate:.2f}"
        )
        for kind_score in kind_scores:
            name = KIND_PANELS[kind_score.kind].log_score_name
            line += (
                f"  {kind_score.kind} {name} {kind_score.mean_score:.4f} "
                f"parsed {kind_score.parse_rate:.2f}"
            )
        if research is not None:
            line += (
                f"  searched {research.search_rate:.2f}  evidence {research.evidence_rate:.2f}  "
                f"turns {research.turns_per_rollout:.2f}  Brier found/missed/none "
                + "/".join(f"{research.path_brier(p):.3f}" for p in ResearchPath)
            )
            if research.tool_errors:
                line += f"  TOOL ERRORS {research.tool_errors} of {research.rollouts} rollouts"
        with self._path.open("a") as log:
            log.write(line + "\n")


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
