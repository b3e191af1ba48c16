"""Outside forecast files: a ForecastBench submission, or a CSV or JSONL of (source, question
id, probability, forecast time) rows, read into forecasts of stored questions. Parsing and
matching only (no database): the caller hands in the stored questions; storing is the caller's
job (flows.stages.external_forecasts).

Decisions:
- Strict: every bad row is refused with its line number and what is wrong (missing field,
  probability not a number in [0, 1], unparseable time, duplicate, unknown question, a question
  that is not binary, a forecast made once its outcome was known) and the other rows load. A
  file that cannot be read at all (not UTF-8, not JSON, a CSV header without a required
  column, a ForecastBench file without its required keys) raises ForecastFileError.
- ForecastBench (the format `futureworld.sources.forecastbench_export` writes and their
  leaderboard accepts): the top level needs organization, model, question_set and forecasts,
  the keys both their resolver and their submission validator require. The round is
  forecast_due_date, else the date that starts the question_set name ("2025-10-26-llm.json");
  each entry {id, source, forecast, resolution_date} is the question the ForecastBench
  importer stored as ("forecastbench:<source>", "<due>/<id>" or "<due>/<id>@<resolution
  date>"); resolution_date is null exactly for market questions. The forecast time is
  forecast_date, else the due date. Combination questions (a list id) are refused, as the
  importer never stores them. A row's line is the line its entry's `{` is on.
- CSV (a header row) and JSONL (one object a line) rows have the fields source, question_id
  (the stored external id), probability and forecast_at; other fields are ignored.
- Times: ISO 8601 with a time zone, or a date alone, taken as 00:00 UTC of that day (how the
  pipeline forecasts a ForecastBench round as of its due date). A time without a zone is
  refused: it is ambiguous by hours.
- One forecast per question a file: a second row of the same question is a duplicate, refused
  and pointing at the first. Binary questions only: a forecast is one P(yes).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from enum import StrEnum
from typing import Any

from futureworld.domain import Question, QuestionKind
from futureworld.sources.forecastbench import (
    DATASET_SOURCES,
    MARKET_SOURCES,
    question_source,
    round_external_id,
)
from futureworld.sources.tabular import Row, csv_rows, jsonl_rows

ROW_FIELDS = ("source", "question_id", "probability", "forecast_at")
"""The fields of a CSV or JSONL row, all required."""
FORECAST_KINDS = frozenset({QuestionKind.BINARY})
"""The question kinds a row's forecast (one probability) can be of."""
FORECASTBENCH_KEYS = ("organization", "model", "question_set", "forecasts")
"""Top-level keys a ForecastBench file must have (required by their resolver and validator)."""
FORECASTBENCH_ENTRY_KEYS = ("id", "source", "forecast", "resolution_date")

QuestionKey = tuple[str, str]
"""(Question.source, Question.external_id)."""


class ForecastFormat(StrEnum):
    FORECASTBENCH = "forecastbench"
    """A ForecastBench submission: one JSON object with a `forecasts` list."""
    CSV = "csv"
    """A header row, then one forecast a row."""
    JSONL = "jsonl"
    """One JSON object a line; blank lines skipped."""


class ForecastFileError(ValueError):
    """The file as a whole cannot be read: no row of it can load."""


@dataclass(frozen=True, order=True)
class RowError:
    line: int
    problem: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.problem}"


@dataclass(frozen=True, kw_only=True)
class ForecastRow:
    """One well-formed row: a P(yes) of the question keyed (source, external_id) at a time."""

    line: int
    source: str
    external_id: str
    p_yes: float
    forecast_at: datetime

    @property
    def key(self) -> QuestionKey:
        return (self.source, self.external_id)


@dataclass(frozen=True, kw_only=True)
class ForecastFile:
    """What a file holds before it meets the stored questions."""

    file_format: ForecastFormat
    rows: list[ForecastRow]
    errors: list[RowError] = field(default_factory=list)
    organization: str | None = None
    """ForecastBench only: who submitted it, and the model."""
    model: str | None = None

    @property
    def row_count(self) -> int:
        return len(self.rows) + len(self.errors)


@dataclass(frozen=True, kw_only=True)
class MatchedForecast:
    question: Question
    row: ForecastRow


@dataclass(frozen=True, kw_only=True)
class MatchedFile:
    forecasts: list[MatchedForecast]
    errors: list[RowError]
    """The file's refused rows and those refused by matching, in line order."""


class _Bad(ValueError):
    pass


def detect_format(name: str, text: str) -> ForecastFormat:
    """The format from the file's name (.json, .jsonl/.ndjson, .csv), else from its content:
    one JSON object holding `forecasts` is ForecastBench, a `{` first is JSONL, else CSV."""
    lowered = name.lower()
    if lowered.endswith(".json"):
        return ForecastFormat.FORECASTBENCH
    if lowered.endswith((".jsonl", ".ndjson")):
        return ForecastFormat.JSONL
    if lowered.endswith(".csv"):
        return ForecastFormat.CSV
    if not text.lstrip().startswith("{"):
        return ForecastFormat.CSV
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return ForecastFormat.JSONL
    is_submission = isinstance(document, dict) and "forecasts" in document
    return ForecastFormat.FORECASTBENCH if is_submission else ForecastFormat.JSONL


def parse_forecast_time(value: Any, name: str = "forecast_at") -> datetime:
    """A forecast time as tz-aware UTC: ISO 8601 with a zone, or a date alone (00:00 UTC)."""
    if not isinstance(value, str) or not value.strip():
        raise _Bad(
            f"{name}: missing" if value in (None, "") else f"{name}: {value!r} is not a time"
        )
    text = value.strip()
    try:
        return datetime.combine(date.fromisoformat(text), time(0, 0), tzinfo=UTC)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise _Bad(f"{name}: {text!r} is not an ISO 8601 time or date") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise _Bad(f"{name}: {text!r} has no time zone")
    return parsed.astimezone(UTC)


def _probability(value: Any, name: str, *, from_text: bool) -> float:
    if from_text and isinstance(value, str):
        if not value.strip():
            raise _Bad(f"{name}: missing")
        try:
            value = float(value)
        except ValueError:
            raise _Bad(f"{name}: {value.strip()!r} is not a number") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Bad(f"{name}: {value!r} is not a number")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise _Bad(f"{name}: {value!r} is outside [0, 1]")
    return float(value)


def _text(row: Mapping[str, Any], name: str) -> str:
    value = row.get(name)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise _Bad(f"{name}: missing")
    if not isinstance(value, str):
        raise _Bad(f"{name}: must be text, got {type(value).__name__}")
    return value.strip()


def _plain_row(line: int, row: Mapping[str, Any], *, from_text: bool) -> ForecastRow:
    missing = [f for f in ROW_FIELDS if row.get(f) is None or row.get(f) == ""]
    if missing:
        raise _Bad(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return ForecastRow(
        line=line,
        source=_text(row, "source"),
        external_id=_text(row, "question_id"),
        p_yes=_probability(row["probability"], "probability", from_text=from_text),
        forecast_at=parse_forecast_time(row["forecast_at"]),
    )


def _csv_rows(text: str, name: str) -> list[Row]:
    rows, missing = csv_rows(text, ROW_FIELDS)
    if missing:
        raise ForecastFileError(f"{name}: the CSV header lacks {', '.join(missing)}")
    return rows


def _plain_file(text: str, name: str, file_format: ForecastFormat) -> ForecastFile:
    jsonl = file_format is ForecastFormat.JSONL
    rows: list[ForecastRow] = []
    errors: list[RowError] = []
    for line, raw in jsonl_rows(text) if jsonl else _csv_rows(text, name):
        try:
            if isinstance(raw, str):
                raise _Bad(raw)
            rows.append(_plain_row(line, raw, from_text=not jsonl))
        except _Bad as error:
            errors.append(RowError(line, str(error)))
    return ForecastFile(file_format=file_format, rows=rows, errors=errors)


def _located_entries(text: str, name: str) -> tuple[dict[str, Any], list[tuple[int, Any]]]:
    """The top-level object and each `forecasts` entry with the line it starts on: the object
    is walked with raw_decode so every entry's offset in the text is known."""
    decoder = json.JSONDecoder()
    whitespace = re.compile(r"\s*")

    def skip(at: int) -> int:
        match = whitespace.match(text, at)
        return match.end() if match else at

    def fail(at: int, what: str) -> ForecastFileError:
        line = text.count("\n", 0, at) + 1
        return ForecastFileError(f"{name}: not a ForecastBench file: {what} at line {line}")

    try:
        at = skip(0)
        if not text.startswith("{", at):
            raise fail(at, "the top level must be a JSON object")
        document: dict[str, Any] = {}
        entries: list[tuple[int, Any]] | None = None
        at = skip(at + 1)
        while not text.startswith("}", at):
            key, at = decoder.raw_decode(text, at)
            at = skip(at)
            if not isinstance(key, str) or not text.startswith(":", at):
                raise fail(at, "expected a key and ':'")
            at = skip(at + 1)
            if key == "forecasts" and text.startswith("[", at):
                entries, at = [], skip(at + 1)
                while not text.startswith("]", at):
                    entry, end = decoder.raw_decode(text, at)
                    entries.append((text.count("\n", 0, at) + 1, entry))
                    at = skip(end)
                    if text.startswith(",", at):
                        at = skip(at + 1)
                    elif not text.startswith("]", at):
                        raise fail(at, "expected ',' or ']' in forecasts")
                document[key] = [entry for _, entry in entries]
                at = skip(at + 1)
            else:
                document[key], at = decoder.raw_decode(text, at)
                at = skip(at)
            if text.startswith(",", at):
                at = skip(at + 1)
            elif not text.startswith("}", at):
                raise fail(at, "expected ',' or '}'")
        if text[at + 1 :].strip():
            raise fail(at + 1, "text after the top-level object")
    except json.JSONDecodeError as error:
        raise ForecastFileError(
            f"{name}: invalid JSON at line {error.lineno} column {error.colno}: {error.msg}"
        ) from None
    except RecursionError:
        raise ForecastFileError(f"{name}: JSON nested too deep to read") from None
    missing = [k for k in FORECASTBENCH_KEYS if k not in document]
    if missing:
        raise ForecastFileError(f"{name}: missing required key(s) {', '.join(missing)}")
    if entries is None:
        raise ForecastFileError(f"{name}: 'forecasts' must be a list")
    return document, entries


def _due_date(document: Mapping[str, Any], name: str) -> date:
    """The round: forecast_due_date, else the date the question_set name starts with."""
    for key in ("forecast_due_date", "question_set"):
        value = document.get(key)
        if isinstance(value, str):
            try:
                return date.fromisoformat(value[:10])
            except ValueError:
                if key == "forecast_due_date":
                    break
    raise ForecastFileError(
        f"{name}: no round: forecast_due_date and the question_set name give no date"
    )


def _forecastbench_entry(line: int, entry: Any, due: date, at: datetime) -> ForecastRow:
    if not isinstance(entry, dict):
        raise _Bad("not a JSON object")
    missing = [k for k in FORECASTBENCH_ENTRY_KEYS if k not in entry]
    if missing:
        raise _Bad(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    upstream_id, source = entry["id"], entry["source"]
    if isinstance(upstream_id, list):
        raise _Bad("id: a combination question (they are not imported)")
    if not isinstance(upstream_id, str) or not upstream_id.strip():
        raise _Bad(f"id: {upstream_id!r} is not a question id")
    if source not in MARKET_SOURCES and source not in DATASET_SOURCES:
        raise _Bad(f"source: {source!r} is not a ForecastBench source")
    p_yes = _probability(entry["forecast"], "forecast", from_text=False)
    day = entry["resolution_date"]
    if source in MARKET_SOURCES:
        if day is not None:
            raise _Bad(f"resolution_date: must be null for a {source} (market) question")
        resolution_date = None
    else:
        if not isinstance(day, str):
            raise _Bad(f"resolution_date: a {source} (dataset) question needs its date")
        try:
            resolution_date = date.fromisoformat(day[:10])
        except ValueError:
            raise _Bad(f"resolution_date: {day!r} is not a date") from None
    return ForecastRow(
        line=line,
        source=question_source(source),
        external_id=round_external_id(due, upstream_id, resolution_date),
        p_yes=p_yes,
        forecast_at=at,
    )


def _forecastbench_file(text: str, name: str) -> ForecastFile:
    document, entries = _located_entries(text, name)
    due = _due_date(document, name)
    stated = document.get("forecast_date")
    try:
        at = parse_forecast_time(stated if stated is not None else due.isoformat(), "forecast_date")
    except _Bad as error:
        raise ForecastFileError(f"{name}: {error}") from None
    rows: list[ForecastRow] = []
    errors: list[RowError] = []
    for line, entry in entries:
        try:
            rows.append(_forecastbench_entry(line, entry, due, at))
        except _Bad as error:
            errors.append(RowError(line, str(error)))

    def text_field(key: str) -> str | None:
        value = document.get(key)
        return value.strip() if isinstance(value, str) and value.strip() else None

    return ForecastFile(
        file_format=ForecastFormat.FORECASTBENCH,
        rows=rows,
        errors=errors,
        organization=text_field("organization"),
        model=text_field("model"),
    )


def read_forecast_file(
    text: str, name: str, file_format: ForecastFormat | None = None
) -> ForecastFile:
    """The rows of a forecast file (format from `detect_format` unless given), each refused
    row an error with its line number; a question's second row is a duplicate. Raises
    ForecastFileError only when the file as a whole cannot be read."""
    file_format = file_format or detect_format(name, text)
    if file_format is ForecastFormat.FORECASTBENCH:
        parsed = _forecastbench_file(text, name)
    else:
        parsed = _plain_file(text, name, file_format)
    first: dict[QuestionKey, int] = {}
    rows: list[ForecastRow] = []
    errors = list(parsed.errors)
    for row in parsed.rows:
        if row.key in first:
            problem = (
                f"duplicate: {row.source}/{row.external_id} is forecast on line {first[row.key]}"
            )
            errors.append(RowError(row.line, problem))
            continue
        first[row.key] = row.line
        rows.append(row)
    return ForecastFile(
        file_format=parsed.file_format,
        rows=rows,
        errors=sorted(errors),
        organization=parsed.organization,
        model=parsed.model,
    )


def match_forecasts(
    parsed: ForecastFile,
    questions: Mapping[QuestionKey, Question],
    revealed_at: Mapping[int, datetime] | None = None,
) -> MatchedFile:
    """Each row with its stored question (keyed by source and external id). Refused: a row of
    no stored question, of a question that is not binary, or made at or after the instant its
    outcome was revealed (`revealed_at`, by question id: a forecast with the answer known is
    not a forecast)."""
    revealed_at = revealed_at or {}
    matched: list[MatchedForecast] = []
    errors = list(parsed.errors)
    for row in parsed.rows:
        question = questions.get(row.key)
        if question is None:
            errors.append(RowError(row.line, f"unknown question {row.source}/{row.external_id}"))
            continue
        if question.kind not in FORECAST_KINDS:
            problem = f"{row.source}/{row.external_id} is a {question.kind} question, not binary"
            errors.append(RowError(row.line, problem))
            continue
        known = revealed_at.get(question.id) if question.id is not None else None
        if known is not None and row.forecast_at >= known:
            problem = (
                f"forecast time {row.forecast_at.isoformat()} is not before the outcome of "
                f"{row.source}/{row.external_id} was revealed ({known.isoformat()})"
            )
            errors.append(RowError(row.line, problem))
            continue
        matched.append(MatchedForecast(question=question, row=row))
    return MatchedFile(forecasts=matched, errors=sorted(errors))


def default_agent_name(parsed: ForecastFile, stem: str) -> str:
    """The agent a file's forecasts go to without --agent: "<organization>-<model>" of a
    ForecastBench file, else the file's stem; whitespace becomes '-'."""
    if parsed.organization and parsed.model:
        name = f"{parsed.organization}-{parsed.model}"
    else:
        name = parsed.model or stem
    return re.sub(r"\s+", "-", name.strip())
