"""The research demo's report: per-round search and evidence rates on the research panel, the
Brier gap to the informed floor it closes, its header line and its report section and plots.
The demo's other metrics and the learning claim are report.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flows.demo.research_panel import LiveResearch, ResearchPath, ResearchRound
from futureworld.plots import plot_metric_by_round
from futureworld.scoring import brier

if TYPE_CHECKING:
    from flows.demo.config import DemoConfig

NAN = float("nan")


@dataclass(frozen=True)
class ResearchRoundMetrics:
    round: int
    policy_version: int
    search_rate: float
    evidence_rate: float
    first_turn_tool_rate: float
    turns_per_rollout: float
    tokens_per_rollout: float
    parse_rate: float
    brier: float
    informed_brier: float
    """The informed floor on the same (parsed) questions: the posterior given all evidence."""
    uninformed_brier: float
    """The uninformed floor: the prior mean."""
    found_brier: float
    """Brier of the answered rollouts that found their question's evidence (NaN: none)."""
    missed_brier: float
    """... that searched or opened and saw none of it."""
    unsearched_brier: float
    """... that made no tool call."""
    found_reading: float
    """Correlation of the found rollouts' answers with the posterior (ResearchRound.found_reading):
    near 0, the policy finds its evidence and does not read it."""
    tool_errors: int
    """Rollouts a failed tool call ended (ResearchRound.tool_errors): 0 in a sound round."""
    gap_closed: float
    """(Brier of round 0 − this round's) / (Brier of round 0 − round 0's informed floor):
    the share of the warm start's distance to the informed floor that RL has closed."""
    live_rollouts: int = 0
    """The round's own stored rollouts (the daily cycle's, on the live questions)."""
    live_search_rate: float | None = None
    live_evidence_rate: float | None = None


@dataclass(frozen=True)
class ResearchSummary:
    rounds: list[ResearchRoundMetrics]
    demonstration_first_turn_tool_rate: float
    """Share of the warm start's demonstrations whose first turn is a search or an open."""
    demonstration_search_rate: float


def research_summary(
    rounds: Sequence[ResearchRound],
    demonstrations: tuple[float, float],
    live: Sequence[LiveResearch] = (),
) -> ResearchSummary:
    """Each research round's rates and floors, the gap to the informed floor closed, and
    what the round's own live rollouts researched."""
    live_of = {r.round: r for r in live}
    rows = []
    start = rounds[0].score
    start_brier = brier(start.p_yes, start.y) if start.p_yes else NAN
    start_gap = start_brier - (brier(start.p_true, start.y) if start.p_yes else NAN)
    for r in rounds:
        s = r.score
        round_brier = brier(s.p_yes, s.y) if s.p_yes else NAN
        rows.append(
            ResearchRoundMetrics(
                round=s.round,
                policy_version=s.policy_version,
                search_rate=r.search_rate,
                evidence_rate=r.evidence_rate,
                first_turn_tool_rate=r.first_turn_tool_rate,
                turns_per_rollout=r.turns_per_rollout,
                tokens_per_rollout=r.tokens_per_rollout,
                parse_rate=s.parse_rate,
                brier=round_brier,
                informed_brier=brier(s.p_true, s.y) if s.p_yes else NAN,
                uninformed_brier=r.uninformed_brier,
                found_brier=r.path_brier(ResearchPath.FOUND),
                missed_brier=r.path_brier(ResearchPath.MISSED),
                unsearched_brier=r.path_brier(ResearchPath.UNSEARCHED),
                found_reading=r.found_reading,
                tool_errors=r.tool_errors,
                gap_closed=(start_brier - round_brier) / start_gap if start_gap > 0 else NAN,
                **_live_rates(live_of.get(s.round)),
            )
        )
    return ResearchSummary(rows, *demonstrations)


def _live_rates(live: LiveResearch | None) -> dict[str, object]:
    if live is None or live.rollouts == 0:
        return {}
    return {
        "live_rollouts": live.rollouts,
        "live_search_rate": live.searched / live.rollouts,
        "live_evidence_rate": live.found_evidence / live.rollouts,
    }


def research_header(config: DemoConfig) -> str:
    """The research demo report's opening lines."""
    c = config
    return (
        f"# FutureWorld research demo\n\nseed {c.seed}; {c.rounds} rounds on a research world "
        f"(no question states its cue; its evidence articles do); {c.questions_per_day} "
        f"questions/day, G = {c.samples}, up to {c.research_max_turns} turns "
        f"(search, open, answer); estimator {c.estimator}. Each round's policy researches and "
        f"forecasts the same held-out research panel of {c.research_panel_questions} "
        "questions over its world's articles as of each question's cut-off; the floors are "
        "the informed posterior (all evidence read) and the uninformed prior."
        + (
            ""
            if (head := c.research_panel_head()) is None
            else f" The rounds between the first and the last are scored on the panel's first "
            f"{head} questions; every round's row and curve below is of those {head}, and the "
            f"claim compares round 0 and round {c.rounds - 1} on all "
            f"{c.research_panel_questions}."
        )
    )


def research_report(summary: ResearchSummary, out_dir: Path) -> tuple[str, dict[str, object]]:
    """The research section of report.md, its metrics.json entry and its two plots."""
    rows = summary.rounds
    plot_metric_by_round(
        {
            "searched": [(m.round, m.search_rate) for m in rows],
            "found evidence": [(m.round, m.evidence_rate) for m in rows],
            "first turn a tool call": [(m.round, m.first_turn_tool_rate) for m in rows],
            "parsed": [(m.round, m.parse_rate) for m in rows],
        },
        out_dir / "research_by_round.png",
        metric="share of panel rollouts",
        title="Research by round",
    )
    plot_metric_by_round(
        {
            "forecaster (panel)": [(m.round, m.brier) for m in rows],
            "informed floor (same questions)": [(m.round, m.informed_brier) for m in rows],
            "uninformed floor (same questions)": [(m.round, m.uninformed_brier) for m in rows],
        },
        out_dir / "research_brier_by_round.png",
        metric="Brier",
        title="Research panel Brier and the floors on the questions it answered",
    )
    lines = [
        "## Research",
        "",
        "Rates are shares of the round's research-panel rollouts; the live columns are the "
        "round's own daily-cycle rollouts (searching the demo's store of harvested articles), "
        "evidence matched to the world's by guid.",
        "",
        f"Warm-start demonstrations: first turn a tool call "
        f"{summary.demonstration_first_turn_tool_rate:.2f}, searched "
        f"{summary.demonstration_search_rate:.2f}.",
        "",
        "| round | version | searched | found evidence | first turn tool | turns | tokens | "
        "parsed | Brier | informed floor | uninformed floor | gap closed | Brier found / "
        "missed / no search | found: reads (corr.) | live searched | live found evidence (n) |",
        "|---" * 16 + "|",
    ]
    for m in rows:
        live = (
            "— | —"
            if m.live_search_rate is None
            else f"{m.live_search_rate:.2f} | {m.live_evidence_rate:.2f} ({m.live_rollouts})"
        )
        lines.append(
            f"| {m.round} | {m.policy_version} | {m.search_rate:.2f} | {m.evidence_rate:.2f} | "
            f"{m.first_turn_tool_rate:.2f} | {m.turns_per_rollout:.2f} | "
            f"{m.tokens_per_rollout:.1f} | {m.parse_rate:.2f} | {m.brier:.4f} | "
            f"{m.informed_brier:.4f} | {m.uninformed_brier:.4f} | {m.gap_closed:+.2f} | "
            f"{m.found_brier:.3f} / {m.missed_brier:.3f} / {m.unsearched_brier:.3f} | "
            f"{m.found_reading:+.2f} | {live} |"
        )
    lines += [
        "",
        "| research | Brier and floors | ECE |",
        "|---|---|---|",
        "| ![Research by round](research_by_round.png) | "
        "![Research Brier](research_brier_by_round.png) | ![ECE by round](ece_by_round.png) |",
    ]
    data = {
        "demonstrations": {
            "first_turn_tool_rate": summary.demonstration_first_turn_tool_rate,
            "search_rate": summary.demonstration_search_rate,
        },
        "rounds": [vars(m) for m in rows],
    }
    return "\n".join(lines), data
