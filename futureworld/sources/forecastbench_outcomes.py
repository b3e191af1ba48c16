"""Outcomes of imported ForecastBench questions, decided from their set's resolution rows.

The rules (see futureworld.sources.forecastbench for the format and the attribution): a
market row resolved to 0/1 is an outcome; a market question with no row is annulled
(upstream drops N/A, cancelled and nullified questions), as is one resolved to another value;
a dataset question resolves per horizon; everything else stays open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from futureworld.domain import OutcomeStatus, Question
from futureworld.sources.forecastbench import (
    DATASET_SOURCES,
    MARKET_SOURCES,
    ForecastBenchFormatError,
    ResolutionRow,
    midnight_utc,
)


@dataclass(frozen=True, kw_only=True)
class ResolutionMatch:
    """The outcome decided for one imported question."""

    source: str
    """Question.source ("forecastbench:<upstream>")."""
    external_id: str
    """Question.external_id."""
    status: OutcomeStatus
    value: float | None
    """1.0 or 0.0 when resolved; None when annulled."""
    resolved_at: datetime
    """Resolution date at UTC midnight; for annulments, the latest date in the resolution set."""
    raw: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """The upstream resolution row, plus a "reason" for annulments."""


def _row_dict(row: ResolutionRow) -> dict[str, Any]:
    return {
        "source": row.source,
        "id": row.external_id,
        "resolution_date": row.resolution_date.isoformat(),
        "resolved_to": row.value,
        "resolved": row.resolved,
    }


def match_resolutions(
    questions: Sequence[Question], rows: Sequence[ResolutionRow]
) -> list[ResolutionMatch]:
    """Decide outcomes for imported questions from the rows of their set's resolution set.

    `questions` come from `parse_question_set` (their `extra` names the upstream id and, for
    dataset questions, the resolution date) and `rows` from the resolution set of the same
    question set. Questions still open are absent from the result. Because a missing market
    row means annulled, refuses row lists in which no market question of `questions` appears.
    """
    market_rows: dict[tuple[str, str], ResolutionRow] = {}
    dataset_rows: dict[tuple[str, str, date], ResolutionRow] = {}
    for row in rows:
        if row.source in MARKET_SOURCES:
            # the latest row of a market wins, should a set ever list one twice
            previous = market_rows.get((row.source, row.external_id))
            if previous is None or previous.resolution_date <= row.resolution_date:
                market_rows[(row.source, row.external_id)] = row
        else:
            dataset_rows[(row.source, row.external_id, row.resolution_date)] = row
    as_of = midnight_utc(max((row.resolution_date for row in rows), default=date.min))

    markets = [q for q in questions if q.extra.get("upstream_source") in MARKET_SOURCES]
    if markets and not any(
        (q.extra["upstream_source"], q.extra["upstream_id"]) in market_rows for q in markets
    ):
        raise ValueError(
            f"none of the {len(markets)} market questions has a row in the resolution set: it "
            "is probably the resolution set of another question set; refusing to annul them all"
        )

    matches: list[ResolutionMatch] = []
    for question in questions:
        upstream = question.extra.get("upstream_source")
        upstream_id = question.extra.get("upstream_id")
        if upstream in MARKET_SOURCES:
            row = market_rows.get((upstream, upstream_id))
            if row is None:
                matches.append(
                    _annulled(question, as_of, {"reason": "no row in the resolution set"})
                )
            elif row.resolved and row.value in (0.0, 1.0):
                matches.append(_resolved(question, row))
            elif row.resolved:
                raw = {**_row_dict(row), "reason": "resolved to a value other than 0 or 1"}
                matches.append(_annulled(question, midnight_utc(row.resolution_date), raw))
        elif upstream in DATASET_SOURCES:
            day = date.fromisoformat(question.extra["resolution_date"])
            row = dataset_rows.get((upstream, upstream_id, day))
            if row is not None and row.resolved and row.value is not None:
                if row.value not in (0.0, 1.0):
                    raise ForecastBenchFormatError(
                        f"resolution of {upstream}/{upstream_id} on {day}: a dataset question "
                        f"resolves to 0 or 1, got {row.value}"
                    )
                matches.append(_resolved(question, row))
        else:
            raise ValueError(
                f"question {question.source}/{question.external_id} was not imported from "
                "ForecastBench (its extra has no upstream_source)"
            )
    return matches


def _resolved(question: Question, row: ResolutionRow) -> ResolutionMatch:
    return ResolutionMatch(
        source=question.source,
        external_id=question.external_id,
        status=OutcomeStatus.RESOLVED,
        value=row.value,
        resolved_at=midnight_utc(row.resolution_date),
        raw=_row_dict(row),
    )


def _annulled(question: Question, at: datetime, raw: dict[str, Any]) -> ResolutionMatch:
    return ResolutionMatch(
        source=question.source,
        external_id=question.external_id,
        status=OutcomeStatus.ANNULLED,
        value=None,
        resolved_at=at,
        raw=raw,
    )
