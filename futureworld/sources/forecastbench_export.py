"""ForecastBench's submission format: write an agent's forecasts of one question set as a
forecast file, and score such a file against a resolution set from the two files alone.

The format was checked against ForecastBench's own code (github.com/forecastingresearch/
forecastbench), not written from memory:
- `src/resolve_forecasts/main.py` (commit 0b7143c2): the resolver reads a forecast file only
  when it has every key of `required_forecast_file_keys` = organization, model,
  question_set, forecast_date, forecasts.
- `src/external-submissions/functions/common/validation.py` (commit 04e6117e): the
  submission validator requires organization, model, model_organization, question_set and a
  non-empty forecasts list (strings, a list); each forecast needs id, source, forecast (a
  number in [0, 1]) and resolution_date, which is null for market questions and one of the
  question's resolution_dates for dataset questions; question_set must equal the question
  set's own `question_set` value; below 95% coverage of market or of dataset questions a file
  is valid but not on the leaderboard. Their filename rule is `{due date}.{organization}.{N}.json`.
- A newer validator of theirs also requires forecast_due_date, so the file carries it too.
So a file written here has organization, model, model_organization, question_set,
forecast_due_date, forecast_date (both the round's due date) and forecasts, each forecast
{id, source, forecast, resolution_date, reasoning}. Binary only, as ForecastBench is.

Decisions: one forecast per question: the mean P(yes) of the chosen policy version's parsed
rollouts of it (a group of G samples is one forecast). Questions without a parsed forecast are
left out, not imputed: ForecastBench imputes them itself (the market value for markets, 0.5
for datasets), and `score_forecast_file` reports how many it would impute but scores only
what the file holds, as `evaluate` does. Combination questions are never written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date
from typing import Any

from futureworld.sources.forecastbench import (
    DATASET_SOURCES,
    MARKET_SOURCES,
    ForecastBenchFormatError,
    parse_resolution_set,
)

REQUIRED_FILE_KEYS = (
    "organization",
    "model",
    "model_organization",
    "question_set",
    "forecast_due_date",
    "forecast_date",
    "forecasts",
)
"""The union of the top-level keys ForecastBench's resolver and validators require."""
REQUIRED_FORECAST_KEYS = ("id", "source", "forecast", "resolution_date")

ForecastKey = tuple[str, str, date | None]
"""(upstream source, upstream id, resolution date or None for a market question)."""


@dataclass(frozen=True, kw_only=True)
class Submission:
    organization: str
    model: str
    model_organization: str


def forecast_file(
    question_set: Mapping[str, Any], forecasts: Mapping[ForecastKey, float], who: Submission
) -> dict[str, Any]:
    """The forecast file of `question_set` (the parsed upstream JSON document): one entry per
    question (and per resolution date of a dataset question) that `forecasts` has, in the
    question set's order."""
    entries: list[dict[str, Any]] = []
    for record in question_set["questions"]:
        if isinstance(record.get("id"), list):
            continue  # combination questions are not forecast
        source, upstream_id = record["source"], record["id"]
        if source in MARKET_SOURCES:
            keys: list[ForecastKey] = [(source, upstream_id, None)]
        elif source in DATASET_SOURCES:
            keys = [
                (source, upstream_id, date.fromisoformat(d[:10]))
                for d in record["resolution_dates"]
            ]
        else:
            raise ForecastBenchFormatError(f"question {upstream_id!r}: unknown source {source!r}")
        for key in keys:
            p = forecasts.get(key)
            if p is None:
                continue
            if not (0.0 <= p <= 1.0):
                raise ValueError(f"forecast of {source}/{upstream_id} is outside [0, 1]: {p}")
            entries.append(
                {
                    "id": upstream_id,
                    "source": source,
                    "forecast": float(p),
                    "resolution_date": None if key[2] is None else key[2].isoformat(),
                    "reasoning": "",
                }
            )
    if not entries:
        raise ValueError(
            f"no forecasts of question set {question_set['question_set']!r}: nothing to submit"
        )
    due = str(question_set["forecast_due_date"])
    return {
        "organization": who.organization,
        "model": who.model,
        "model_organization": who.model_organization,
        "question_set": question_set["question_set"],
        "forecast_due_date": due,
        "forecast_date": due,
        "forecasts": entries,
    }


def check_forecast_file(document: Any, filename: str) -> list[dict[str, Any]]:
    """The forecasts of a forecast file, after ForecastBench's structural checks; a
    ForecastBenchFormatError names the first problem."""
    if not isinstance(document, dict):
        raise ForecastBenchFormatError(f"{filename}: top level must be an object")
    for key in REQUIRED_FILE_KEYS:
        if key not in document:
            raise ForecastBenchFormatError(f"{filename}: missing required key {key!r}")
    forecasts = document["forecasts"]
    if not isinstance(forecasts, list) or not forecasts:
        raise ForecastBenchFormatError(f"{filename}: 'forecasts' must be a non-empty list")
    for index, entry in enumerate(forecasts):
        where = f"{filename}: forecasts[{index}]"
        if not isinstance(entry, dict):
            raise ForecastBenchFormatError(f"{where}: must be an object")
        missing = [k for k in REQUIRED_FORECAST_KEYS if k not in entry]
        if missing:
            raise ForecastBenchFormatError(f"{where}: missing fields {missing}")
        p = entry["forecast"]
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
            raise ForecastBenchFormatError(f"{where}: forecast must be a number in [0, 1]")
        market = entry["source"] in MARKET_SOURCES
        if market != (entry["resolution_date"] is None):
            raise ForecastBenchFormatError(
                f"{where}: resolution_date must be null exactly for market questions"
            )
    return forecasts


@dataclass(frozen=True, kw_only=True)
class FileScore:
    """A forecast file scored against a resolution set, by the file's forecasts alone."""

    n: int
    brier: float
    """Mean (forecast − resolved_to)² over the file's forecasts of resolved questions."""
    n_market: int
    brier_market: float | None
    n_dataset: int
    brier_dataset: float | None
    by_source: dict[str, tuple[int, float]]
    """Upstream source → (n, Brier)."""


def score_forecast_file(forecast_text: str, resolution_text: str, filename: str) -> FileScore:
    """Score a forecast file against its round's resolution set: market forecasts against
    rows resolved to 0/1, dataset forecasts against the row of their resolution date."""
    try:
        document = json.loads(forecast_text)
    except json.JSONDecodeError as error:
        raise ForecastBenchFormatError(f"{filename}: invalid JSON: {error.msg}") from None
    forecasts = check_forecast_file(document, filename)
    resolutions = parse_resolution_set(resolution_text, "resolution set")
    if resolutions.question_set_name != document["question_set"]:
        raise ForecastBenchFormatError(
            f"{filename}: forecasts of {document['question_set']!r}, resolution set of "
            f"{resolutions.question_set_name!r}"
        )
    market: dict[tuple[str, str], float] = {}
    dataset: dict[tuple[str, str, str], float] = {}
    for row in resolutions.rows:
        if not row.resolved or row.value is None:
            continue
        if row.source in MARKET_SOURCES and row.value in (0.0, 1.0):
            market[(row.source, row.external_id)] = row.value
        elif row.source in DATASET_SOURCES:
            dataset[(row.source, row.external_id, row.resolution_date.isoformat())] = row.value
    errors: dict[str, list[float]] = {}
    for entry in forecasts:
        source = entry["source"]
        if entry["resolution_date"] is None:
            y = market.get((source, entry["id"]))
        else:
            y = dataset.get((source, entry["id"], entry["resolution_date"]))
        if y is not None:
            errors.setdefault(source, []).append((float(entry["forecast"]) - y) ** 2)

    def mean(values: list[float]) -> float | None:
        return math.fsum(values) / len(values) if values else None

    markets = [e for s, v in errors.items() if s in MARKET_SOURCES for e in v]
    datasets = [e for s, v in errors.items() if s in DATASET_SOURCES for e in v]
    every = markets + datasets
    if not every:
        raise ValueError(f"{filename}: none of its forecasts is of a resolved question")
    return FileScore(
        n=len(every),
        brier=math.fsum(every) / len(every),
        n_market=len(markets),
        brier_market=mean(markets),
        n_dataset=len(datasets),
        brier_dataset=mean(datasets),
        by_source={s: (len(v), math.fsum(v) / len(v)) for s, v in sorted(errors.items())},
    )
