"""The demo's claim and report section on its choice and numeric panels: each kind's first
round against its last, paired by panel question (the last round is better only where the 95%
paired bootstrap interval of the difference lies below zero), the per-round table and plot.
The panels themselves are kinds.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flows.demo.kind_scores import KIND_PANELS, KindPanelScore
from futureworld import scoring
from futureworld.domain import QuestionKind
from futureworld.plots import plot_metric_by_round
from futureworld.scoring import PairedDifference, expected_calibration_error


@dataclass(frozen=True)
class KindClaim:
    """A kind's first round against its last on the panel, paired by question."""

    kind: QuestionKind
    score: PairedDifference
    """Mean multiclass Brier (choice) or CRPS (numeric)."""
    calibration: PairedDifference | None
    """Choice: top-label ECE. None for numeric questions (coverage is reported, not claimed)."""
    parse_rates: tuple[float, float]

    @property
    def improved(self) -> bool:
        """The score lower beyond its 95% paired interval, without answering less often."""
        answering = self.parse_rates[1] >= self.parse_rates[0] - 0.02
        return answering and self.score.ci[1] < 0.0

    def summary(self) -> str:
        name = KIND_PANELS[self.kind].score_name
        d = self.score
        parts = [
            f"{self.kind} {name} {d.before:.4f} → {d.after:.4f} (Δ {d.difference:+.4f}, "
            f"95% CI [{d.ci[0]:+.4f}, {d.ci[1]:+.4f}])"
        ]
        if self.calibration is not None:
            c = self.calibration
            parts.append(
                f"top-label ECE {c.before:.4f} → {c.after:.4f} (Δ {c.difference:+.4f}, "
                f"95% CI [{c.ci[0]:+.4f}, {c.ci[1]:+.4f}])"
            )
        verdict = "improved" if self.improved else "no clear improvement"
        return "; ".join(parts) + f": {verdict}"


def kind_claim(scores: Sequence[KindPanelScore], n_resamples: int = 1000) -> KindClaim | None:
    """The claim of a kind's first against its last panel; None when either has no forecast."""
    first, last = scores[0], scores[-1]
    if not first.score or not last.score:
        return None

    def mean(p, _y) -> float:
        return float(np.mean(p))

    calibration = None
    if KIND_PANELS[first.kind].claims_calibration:
        calibration = scoring.paired_bootstrap_difference(
            first.calibration_rows(),
            last.calibration_rows(),
            expected_calibration_error,
            n_resamples=n_resamples,
        )
    return KindClaim(
        kind=first.kind,
        score=scoring.paired_bootstrap_difference(
            first.score_rows(), last.score_rows(), mean, n_resamples=n_resamples
        ),
        calibration=calibration,
        parse_rates=(first.parse_rate, last.parse_rate),
    )


def kind_report(
    scores: dict[QuestionKind, list[KindPanelScore]],
    claims: dict[QuestionKind, KindClaim | None],
    out_dir: Path,
) -> tuple[str, dict[str, Any]]:
    """The report's section on choice and numeric questions (markdown, metrics.json entries)
    and a plot of each kind's panel score by round; empty for a binary-only demo."""
    if not scores:
        return "", {}
    lines = ["## Choice and numeric questions", ""]
    data: dict[str, Any] = {}
    for kind, rounds in scores.items():
        claim = claims.get(kind)
        verdict = (
            "no first- or last-round forecasts to compare" if claim is None else (claim.summary())
        )
        rules = KIND_PANELS[kind]
        name, calibration = rules.table_score_name, rules.calibration_name
        coverage = rules.reports_coverage_50
        # On a research world: the informed and uninformed floors (research_panel.py).
        floors = all(r.informed_score is not None for r in rounds)
        lines += [
            f"**{kind}, round 0 → round {rounds[-1].round}** (paired bootstrap over "
            f"{len({q for r in rounds for q in r.question})} panel questions): {verdict}.",
            "",
            f"| round | version | n | {name} | {calibration} | "
            + ("50% coverage | " if coverage else "")
            + "truth's score (floor) | "
            + ("informed floor | uninformed floor | " if floors else "")
            + "parsed |",
            "|---" * (7 + coverage + 2 * floors) + "|",
        ]
        for r in rounds:
            middle = f"{r.coverage_50:.3f} | " if coverage else ""
            informed = f"{r.informed_score:.4f} | {r.uninformed_score:.4f} | " if floors else ""
            lines.append(
                f"| {r.round} | {r.policy_version} | {len(r.score)} | {r.mean_score:.4f} | "
                f"{r.calibration:.4f} | {middle}{r.true_score:.4f} | {informed}"
                f"{r.parse_rate:.2f} |"
            )
        lines += ["", f"![{kind} by round]({kind}_by_round.png)", ""]
        series = {
            "forecaster (panel)": [(r.round, r.mean_score) for r in rounds],
            "true distribution (floor)": [(r.round, r.true_score) for r in rounds],
        }
        if floors:
            series["all evidence read (informed floor)"] = [
                (r.round, r.informed_score) for r in rounds
            ]
            series["no research (uninformed floor)"] = [
                (r.round, r.uninformed_score) for r in rounds
            ]
        plot_metric_by_round(
            series,
            out_dir / f"{kind}_by_round.png",
            metric=name,
            title=f"{kind} questions: {name} by round (lower is better)",
        )
        data[str(kind)] = {
            "rounds": [
                {
                    "round": r.round,
                    "policy_version": r.policy_version,
                    "n": len(r.score),
                    "score": r.mean_score,
                    "calibration": r.calibration,
                    "coverage_50": r.coverage_50 if coverage else None,
                    "true_score": r.true_score,
                    "informed_score": r.informed_score,
                    "uninformed_score": r.uninformed_score,
                    "parse_rate": r.parse_rate,
                }
                for r in rounds
            ],
            "claim": None if claim is None else _claim_json(claim),
        }
    return "\n".join(lines), data


def _claim_json(claim: KindClaim) -> dict[str, Any]:
    def difference(d: PairedDifference) -> dict[str, Any]:
        return {"first": d.before, "last": d.after, "difference": d.difference, "ci": list(d.ci)}

    return {
        "improved": claim.improved,
        "score": difference(claim.score),
        "calibration": None if claim.calibration is None else difference(claim.calibration),
        "parse_rates": list(claim.parse_rates),
    }
