"""ForecastBench question sets and resolution sets: parse them (outcomes are decided in
forecastbench_outcomes).

Pure parsing of the upstream JSON files (no I/O, no HTTP); storing is the caller's job.
Data: ForecastBench (Karger, Bastani, Chen, Jacobs, Halawi, Zhang, Tetlock, "ForecastBench: A
Dynamic Benchmark of AI Forecasting Capabilities", ICLR 2025, arXiv:2409.19839), from
github.com/forecastingresearch/forecastbench-datasets, © Forecasting Research Institute,
licensed CC BY-SA 4.0: anything redistributed that is derived from it carries that license.

Decisions:
- Question.source is "forecastbench:<upstream source>" (e.g. "forecastbench:manifold"), so an
  imported question never collides with the same market harvested live by its own adapter
  (different cut-off, different crowd probability). `extra` keeps the upstream source and id.
- One question per round: the same market question posed in several rounds (question sets
  of different forecast due dates) is a separate question in each, with that round's
  cut-off (freeze time) and crowd value, as ForecastBench scores it per round. So every
  external_id starts with the round: f"{due date}/{upstream id}". Market questions
  (manifold, metaculus, polymarket, infer) map to one binary question each; dataset
  questions (acled, dbnomics, fred, wikipedia, yfinance) map to one binary question per
  resolution date, f"{due date}/{id}@{resolution date}". Migration 0004 renames questions
  imported before this rule. Binary only: ForecastBench's question sets have no choice or
  numeric questions.
- Combination questions (id is a list) are skipped and counted as "combination".
- A market question of the set with no row in its resolution set is annulled: upstream drops
  questions that resolved N/A, were cancelled, or resolved before the due date (nullified).
  A market row with resolved = true but a value other than 0/1 is annulled too.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from typing import Any

from futureworld.domain import Question, QuestionKind

SOURCE_PREFIX = "forecastbench:"
MARKET_SOURCES = frozenset({"manifold", "metaculus", "polymarket", "infer"})
DATASET_SOURCES = frozenset({"acled", "dbnomics", "fred", "wikipedia", "yfinance"})
NOT_AVAILABLE = "N/A"
_QUESTION_FIELDS = (
    "id",
    "source",
    "question",
    "resolution_criteria",
    "background",
    "market_info_close_datetime",
    "url",
    "freeze_datetime",
    "freeze_datetime_value",
    "source_intro",
    "resolution_dates",
)
_RESOLUTION_FIELDS = ("id", "source", "resolution_date", "resolved_to", "resolved")


class ForecastBenchFormatError(ValueError):
    """A file not in the ForecastBench format; the message names the file, record and field."""


def question_source(upstream_source: str) -> str:
    """Question.source of an imported question: "forecastbench:<upstream source>"."""
    return f"{SOURCE_PREFIX}{upstream_source}"


def round_external_id(due: date, upstream_id: str, resolution_date: date | None = None) -> str:
    """Question.external_id of an imported question: its round, its upstream id and, for a
    dataset question, the resolution date."""
    suffix = "" if resolution_date is None else f"@{resolution_date.isoformat()}"
    return f"{due.isoformat()}/{upstream_id}{suffix}"


@dataclass(frozen=True, kw_only=True)
class QuestionSetImport:
    forecast_due_date: date
    """The set's forecast due date; dataset questions compare against the value on this day."""
    question_set_name: str
    """Upstream file name, e.g. "2025-10-26-llm.json"."""
    questions: list[Question]
    """One per market question, one per (dataset question, resolution date); file order."""
    skipped: Counter[str] = field(default_factory=Counter)
    """Upstream questions not imported, by reason ("combination")."""


@dataclass(frozen=True, kw_only=True)
class ResolutionRow:
    source: str
    """Upstream source as written in the file (manifold, fred …), without our prefix."""
    external_id: str
    """Upstream question id (without the @date suffix of dataset questions)."""
    resolution_date: date
    value: float | None
    """resolved_to: 0/1 when resolved, else a market probability; None where upstream has NaN."""
    resolved: bool


@dataclass(frozen=True, kw_only=True)
class ResolutionSetImport:
    question_set_name: str
    forecast_due_date: date
    rows: list[ResolutionRow]
    skipped: Counter[str] = field(default_factory=Counter)
    """Rows not imported, by reason ("combination", "duplicate")."""


def _load(text: str, filename: str, list_key: str) -> tuple[dict[str, Any], list[Any]]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ForecastBenchFormatError(
            f"{filename}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}"
        ) from error
    except RecursionError:
        raise ForecastBenchFormatError(
            f"{filename}: JSON nested too deep to read; not a ForecastBench file"
        ) from None
    if not isinstance(document, dict):
        raise ForecastBenchFormatError(
            f"{filename}: top level must be an object, got {type(document).__name__}"
        )
    for key in ("forecast_due_date", "question_set", list_key):
        if key not in document:
            raise ForecastBenchFormatError(f"{filename}: missing top-level field {key!r}")
    records = document[list_key]
    if not isinstance(records, list):
        raise ForecastBenchFormatError(
            f"{filename}: field {list_key!r} must be a list, got {type(records).__name__}"
        )
    if not isinstance(document["question_set"], str):
        raise ForecastBenchFormatError(f"{filename}: field 'question_set' must be a string")
    return document, records


def _parse_date(value: Any, where: str, name: str) -> date:
    if not isinstance(value, str):
        raise ForecastBenchFormatError(
            f"{where}: field {name!r} must be a date string, got {value!r}"
        )
    try:
        return date.fromisoformat(value[:10])
    except ValueError as error:
        raise ForecastBenchFormatError(
            f"{where}: field {name!r} is not a date: {value!r}"
        ) from error


def _parse_datetime(value: Any, where: str, name: str) -> datetime:
    """ISO 8601 timestamps or bare dates (Polymarket); naive ones are taken as UTC."""
    if not isinstance(value, str):
        raise ForecastBenchFormatError(f"{where}: field {name!r} must be a string, got {value!r}")
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError as error:
        raise ForecastBenchFormatError(
            f"{where}: field {name!r} is not a timestamp: {value!r}"
        ) from error
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def midnight_utc(day: date) -> datetime:
    return datetime.combine(day, time(0, 0), tzinfo=UTC)


def _where(filename: str, list_key: str, index: int, record: Any) -> str:
    record_id = record.get("id") if isinstance(record, dict) else None
    return f"{filename}: {list_key}[{index}] (id {record_id!r})"


def _require_fields(record: Any, fields: Sequence[str], where: str) -> None:
    if not isinstance(record, dict):
        raise ForecastBenchFormatError(f"{where}: record must be an object")
    for name in fields:
        if name not in record:
            raise ForecastBenchFormatError(f"{where}: missing field {name!r}")
    for name in fields:
        if name not in ("id", "resolution_dates", "resolved_to", "resolved") and not isinstance(
            record[name], str
        ):
            raise ForecastBenchFormatError(
                f"{where}: field {name!r} must be a string, got {type(record[name]).__name__}"
            )


def _market_question(
    record: dict[str, Any], where: str, shared: dict[str, Any], due: date
) -> Question:
    raw_value = record["freeze_datetime_value"]
    try:
        crowd = float(raw_value)
    except ValueError as error:
        raise ForecastBenchFormatError(
            f"{where}: field 'freeze_datetime_value' is not a number: {raw_value!r}"
        ) from error
    if not 0.0 <= crowd <= 1.0:  # also rejects NaN
        raise ForecastBenchFormatError(
            f"{where}: field 'freeze_datetime_value' is a market probability outside [0, 1]: "
            f"{raw_value!r}"
        )
    if record["resolution_dates"] != NOT_AVAILABLE:
        raise ForecastBenchFormatError(
            f"{where}: field 'resolution_dates' must be 'N/A' for a market question"
        )
    freeze_at = _parse_datetime(record["freeze_datetime"], where, "freeze_datetime")
    close_raw = record["market_info_close_datetime"]
    close_at = (
        None
        if close_raw == NOT_AVAILABLE
        else _parse_datetime(close_raw, where, "market_info_close_datetime")
    )
    criteria = record["resolution_criteria"]
    market_criteria = record.get("market_info_resolution_criteria", NOT_AVAILABLE)
    if isinstance(market_criteria, str) and market_criteria not in (NOT_AVAILABLE, ""):
        criteria = f"{criteria}\n\n{market_criteria}"
    return Question(
        source=question_source(record["source"]),
        external_id=round_external_id(due, record["id"]),
        title=record["question"],
        created_at=freeze_at,
        info_cutoff_at=freeze_at,
        kind=QuestionKind.BINARY,
        background=record["background"],
        resolution_criteria=criteria,
        url=record["url"],
        close_at=close_at,
        resolve_by=None,
        crowd_probability=crowd,
        extra={**shared, "freeze_datetime_value": raw_value},
    )


def _dataset_questions(
    record: dict[str, Any], where: str, shared: dict[str, Any], due: date
) -> list[Question]:
    dates = record["resolution_dates"]
    if not isinstance(dates, list) or not dates:
        raise ForecastBenchFormatError(
            f"{where}: field 'resolution_dates' must be a non-empty list of dates for a dataset "
            f"question, got {dates!r}"
        )
    freeze_at = _parse_datetime(record["freeze_datetime"], where, "freeze_datetime")
    questions = []
    for raw_date in dates:
        day = _parse_date(raw_date, where, "resolution_dates")

        def fill(text: str, day: date = day) -> str:
            return text.replace("{forecast_due_date}", due.isoformat()).replace(
                "{resolution_date}", day.isoformat()
            )

        questions.append(
            Question(
                source=question_source(record["source"]),
                external_id=round_external_id(due, record["id"], day),
                title=fill(record["question"]),
                created_at=freeze_at,
                info_cutoff_at=freeze_at,
                kind=QuestionKind.BINARY,
                background=fill(record["background"]),
                resolution_criteria=fill(record["resolution_criteria"]),
                url=record["url"],
                close_at=None,
                resolve_by=midnight_utc(day),
                crowd_probability=None,
                extra={
                    **shared,
                    "resolution_date": day.isoformat(),
                    "freeze_datetime_value": record["freeze_datetime_value"],
                },
            )
        )
    return questions


def parse_question_set(text: str, filename: str) -> QuestionSetImport:
    """Parse a question set file (`{forecast_due_date, question_set, questions: [...]}`)."""
    document, records = _load(text, filename, "questions")
    due = _parse_date(document["forecast_due_date"], filename, "forecast_due_date")
    set_name = document["question_set"]
    questions: list[Question] = []
    skipped: Counter[str] = Counter()
    for index, record in enumerate(records):
        where = _where(filename, "questions", index, record)
        if isinstance(record, dict) and isinstance(record.get("id"), list):
            skipped["combination"] += 1
            continue
        _require_fields(record, _QUESTION_FIELDS, where)
        source = record["source"]
        shared = {
            "question_set": set_name,
            "forecast_due_date": due.isoformat(),
            "upstream_source": source,
            "upstream_id": record["id"],
            "source_intro": record["source_intro"],
            "freeze_datetime_value_explanation": record.get(
                "freeze_datetime_value_explanation", ""
            ),
            "market_info_open_datetime": record.get("market_info_open_datetime", NOT_AVAILABLE),
        }
        if source in MARKET_SOURCES:
            questions.append(_market_question(record, where, shared, due))
        elif source in DATASET_SOURCES:
            questions.extend(_dataset_questions(record, where, shared, due))
        else:
            raise ForecastBenchFormatError(f"{where}: field 'source' is unknown: {source!r}")
    return QuestionSetImport(
        forecast_due_date=due, question_set_name=set_name, questions=questions, skipped=skipped
    )


def parse_resolution_set(text: str, filename: str) -> ResolutionSetImport:
    """Parse a resolution set file (`{forecast_due_date, question_set, resolutions: [...]}`)."""
    document, records = _load(text, filename, "resolutions")
    due = _parse_date(document["forecast_due_date"], filename, "forecast_due_date")
    rows: list[ResolutionRow] = []
    seen: dict[tuple[str, str, date], ResolutionRow] = {}
    skipped: Counter[str] = Counter()
    for index, record in enumerate(records):
        where = _where(filename, "resolutions", index, record)
        if isinstance(record, dict) and isinstance(record.get("id"), list):
            skipped["combination"] += 1
            continue
        _require_fields(record, _RESOLUTION_FIELDS, where)
        source = record["source"]
        if source not in MARKET_SOURCES and source not in DATASET_SOURCES:
            raise ForecastBenchFormatError(f"{where}: field 'source' is unknown: {source!r}")
        if not isinstance(record["id"], str):
            raise ForecastBenchFormatError(f"{where}: field 'id' must be a string")
        if not isinstance(record["resolved"], bool):
            raise ForecastBenchFormatError(
                f"{where}: field 'resolved' must be true or false, got {record['resolved']!r}"
            )
        value = record["resolved_to"]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ForecastBenchFormatError(
                f"{where}: field 'resolved_to' must be a number, got {value!r}"
            )
        value = None if math.isnan(value) else float(value)
        if value is not None and not 0.0 <= value <= 1.0:
            raise ForecastBenchFormatError(
                f"{where}: field 'resolved_to' is outside [0, 1]: {value!r}"
            )
        row = ResolutionRow(
            source=source,
            external_id=record["id"],
            resolution_date=_parse_date(record["resolution_date"], where, "resolution_date"),
            value=value,
            resolved=record["resolved"],
        )
        key = (row.source, row.external_id, row.resolution_date)
        if key in seen:
            if seen[key] != row:
                raise ForecastBenchFormatError(
                    f"{where}: conflicting duplicate row for {row.source}/{row.external_id} "
                    f"on {row.resolution_date}"
                )
            skipped["duplicate"] += 1
            continue
        seen[key] = row
        rows.append(row)
    return ResolutionSetImport(
        question_set_name=document["question_set"],
        forecast_due_date=due,
        rows=rows,
        skipped=skipped,
    )
