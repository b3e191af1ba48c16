"""Reading a ForecastBench submission into forecast rows: the top-level object and its keys,
the round (its due date), each entry's stored question id, and the line every entry starts on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import date, datetime
from typing import Any

from futureworld.sources.forecast_rows import (
    BadValue,
    ForecastFile,
    ForecastFileError,
    ForecastFormat,
    ForecastRow,
    RowError,
    parse_forecast_time,
    parse_probability,
)
from futureworld.sources.forecastbench import (
    DATASET_SOURCES,
    MARKET_SOURCES,
    question_source,
    round_external_id,
)

FORECASTBENCH_KEYS = ("organization", "model", "question_set", "forecasts")
"""Top-level keys a ForecastBench file must have (required by their resolver and validator)."""
FORECASTBENCH_ENTRY_KEYS = ("id", "source", "forecast", "resolution_date")


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
        raise BadValue("not a JSON object")
    missing = [k for k in FORECASTBENCH_ENTRY_KEYS if k not in entry]
    if missing:
        raise BadValue(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    upstream_id, source = entry["id"], entry["source"]
    if isinstance(upstream_id, list):
        raise BadValue("id: a combination question (they are not imported)")
    if not isinstance(upstream_id, str) or not upstream_id.strip():
        raise BadValue(f"id: {upstream_id!r} is not a question id")
    if source not in MARKET_SOURCES and source not in DATASET_SOURCES:
        raise BadValue(f"source: {source!r} is not a ForecastBench source")
    p_yes = parse_probability(entry["forecast"], "forecast", from_text=False)
    day = entry["resolution_date"]
    if source in MARKET_SOURCES:
        if day is not None:
            raise BadValue(f"resolution_date: must be null for a {source} (market) question")
        resolution_date = None
    else:
        if not isinstance(day, str):
            raise BadValue(f"resolution_date: a {source} (dataset) question needs its date")
        try:
            resolution_date = date.fromisoformat(day[:10])
        except ValueError:
            raise BadValue(f"resolution_date: {day!r} is not a date") from None
    return ForecastRow(
        line=line,
        source=question_source(source),
        external_id=round_external_id(due, upstream_id, resolution_date),
        p_yes=p_yes,
        forecast_at=at,
    )


def read_submission(text: str, name: str) -> ForecastFile:
    """The rows of a ForecastBench submission (forecast_files.py's docstring)."""
    document, entries = _located_entries(text, name)
    due = _due_date(document, name)
    stated = document.get("forecast_date")
    try:
        at = parse_forecast_time(stated if stated is not None else due.isoformat(), "forecast_date")
    except BadValue as error:
        raise ForecastFileError(f"{name}: {error}") from None
    rows: list[ForecastRow] = []
    errors: list[RowError] = []
    for line, entry in entries:
        try:
            rows.append(_forecastbench_entry(line, entry, due, at))
        except BadValue as error:
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
