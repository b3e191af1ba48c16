"""Outside forecast files: a ForecastBench submission, or a CSV or JSONL of (source, question
id, probability, forecast time) rows, read into forecasts of stored questions. Parsing and
matching only (no database): the caller hands in the stored questions; storing is the caller's
job (flows.stages.external_forecasts). The row types and field parsers are forecast_rows.py's,
the ForecastBench reader forecastbench_submission.py's.

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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from futureworld.domain import Question, QuestionKind
from futureworld.sources.forecast_rows import (
    BadValue,
    ForecastFile,
    ForecastFileError,
    ForecastFormat,
    ForecastRow,
    QuestionKey,
    RowError,
    parse_forecast_time,
    parse_probability,
    row_text,
)
from futureworld.sources.forecastbench_submission import read_submission
from futureworld.sources.tabular import Row, csv_rows, jsonl_rows

ROW_FIELDS = ("source", "question_id", "probability", "forecast_at")
"""The fields of a CSV or JSONL row, all required."""
FORECAST_KINDS = frozenset({QuestionKind.BINARY})
"""The question kinds a row's forecast (one probability) can be of."""


@dataclass(frozen=True, kw_only=True)
class MatchedForecast:
    question: Question
    row: ForecastRow


@dataclass(frozen=True, kw_only=True)
class MatchedFile:
    forecasts: list[MatchedForecast]
    errors: list[RowError]
    """The file's refused rows and those refused by matching, in line order."""


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


def _plain_row(line: int, row: Mapping[str, Any], *, from_text: bool) -> ForecastRow:
    missing = [f for f in ROW_FIELDS if row.get(f) is None or row.get(f) == ""]
    if missing:
        raise BadValue(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return ForecastRow(
        line=line,
        source=row_text(row, "source"),
        external_id=row_text(row, "question_id"),
        p_yes=parse_probability(row["probability"], "probability", from_text=from_text),
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
                raise BadValue(raw)
            rows.append(_plain_row(line, raw, from_text=not jsonl))
        except BadValue as error:
            errors.append(RowError(line, str(error)))
    return ForecastFile(file_format=file_format, rows=rows, errors=errors)


def read_forecast_file(
    text: str, name: str, file_format: ForecastFormat | None = None
) -> ForecastFile:
    """The rows of a forecast file (format from `detect_format` unless given), each refused
    row an error with its line number; a question's second row is a duplicate. Raises
    ForecastFileError only when the file as a whole cannot be read."""
    file_format = file_format or detect_format(name, text)
    if file_format is ForecastFormat.FORECASTBENCH:
        parsed = read_submission(text, name)
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
