"""The promotion gate's section of the demo's report: every registered version with its parent,
its gate verdict and validation Brier, and the rounds it served. The demo's other metrics are
report.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from futureworld.domain import PolicyVersion

if TYPE_CHECKING:
    from flows.demo.report import RoundMetrics


@dataclass(frozen=True)
class LineageRow:
    version: int
    parent_version: int | None
    status: str
    reason: str
    validation_questions: int
    validation_brier: float | None
    served_in_rounds: tuple[int, ...]
    """The rounds whose panel this version forecast (the served version of those rounds)."""


def lineage_rows(
    versions: Sequence[PolicyVersion], metrics: Sequence[RoundMetrics]
) -> list[LineageRow]:
    """Every registered version with its gate verdict and the rounds it served."""
    served: dict[int, list[int]] = {}
    for m in metrics:
        served.setdefault(m.policy_version, []).append(m.round)
    return [
        LineageRow(
            version=v.version,
            parent_version=v.parent_version,
            status=str(v.status),
            reason=v.status_reason,
            validation_questions=v.validation_questions,
            validation_brier=v.validation_brier,
            served_in_rounds=tuple(served.get(v.version, ())),
        )
        for v in versions
    ]


def lineage_report(
    rows: Sequence[LineageRow], validation_fraction: float
) -> tuple[str, list[dict[str, object]]]:
    """The promotion gate's section of report.md (versions, verdicts, rounds served) and its
    metrics.json entry."""
    rejected = [r for r in rows if r.status == "rejected"]
    lines = [
        "## Versions and the promotion gate",
        "",
        f"The gate holds out {validation_fraction:.0%} of the live questions from every update "
        "and judges each candidate on them against its parent (0% = no gate); the panel is "
        f"separate. {len(rejected)} of {len(rows)} versions rejected.",
        "",
        "| version | parent | status | rounds served | validation n | validation Brier | verdict |",
        "|---" * 7 + "|",
    ]
    for r in rows:
        served = ", ".join(str(n) for n in r.served_in_rounds) or "—"
        val = "—" if r.validation_brier is None else f"{r.validation_brier:.4f}"
        parent = "—" if r.parent_version is None else str(r.parent_version)
        reason = r.reason.replace("|", "/") or "—"
        lines.append(
            f"| {r.version} | {parent} | {r.status} | {served} | {r.validation_questions} | "
            f"{val} | {reason} |"
        )
    return "\n".join(lines), [vars(r) for r in rows]
