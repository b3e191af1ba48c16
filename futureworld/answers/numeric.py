"""The numeric answer: `<quantiles>5%: 10, 25%: 14, 50%: 17, 75%: 21, 95%: 30</quantiles>`.

Exactly the levels of QUANTILE_LEVELS (any order, each once), values plain decimals with an
optional exponent ("1.5e6"), or YYYY-MM-DD dates on a time-axis question (read as midnight
UTC, stored as POSIX seconds). Values must not decrease with the level (equal values are a
point mass) and must lie within the range's closed bounds (> 0 on a log scale).

The canonical text writes values as the prompt shows numbers (format_numeric_value): exact
below 1e16, 15 significant digits above, and the UTC day on a time axis. The exact text
writes every value's repr (POSIX seconds on a time axis).
"""

from __future__ import annotations

import itertools
import math
import re
from datetime import UTC, datetime

from futureworld.answers.base import ENTRY_SPLIT, AnswerFormat, Forecast, ParsedAnswer
from futureworld.domain import QUANTILE_LEVELS, NumericSpec, ParseStatus, Question, QuestionKind

_REAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_LEVEL_ENTRY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*%\s*:\s*(\S+)\s*")


def format_numeric_value(value: float, spec: NumericSpec) -> str:
    """A value as the prompt shows it and the answer may write it: a date on a time axis,
    else the shortest decimal that round-trips (no exponent below 1e16)."""
    if spec.time_axis:
        # The day the value falls in, floored before datetime sees it: fromtimestamp rounds
        # to the microsecond, so 0.2 µs before midnight would be written as the next day.
        return f"{datetime.fromtimestamp(value - value % 86_400, UTC):%Y-%m-%d}"
    return f"{value:.15g}" if abs(value) >= 1e16 else repr(float(value)).removesuffix(".0")


def uniform_quantiles(question: Question) -> tuple[float, ...]:
    """The quantiles at QUANTILE_LEVELS of the uniform distribution over the numeric range
    (on ln x for a log scale): lower + τ·(upper − lower)."""
    spec = question.numeric_spec
    if spec.log_scale:
        lo, hi = math.log(spec.lower), math.log(spec.upper)
        return tuple(math.exp(lo + t * (hi - lo)) for t in QUANTILE_LEVELS)
    return tuple(spec.lower + t * (spec.upper - spec.lower) for t in QUANTILE_LEVELS)


def _parse_value(text: str, time_axis: bool) -> float | None:
    if time_axis and _DATE.fullmatch(text):
        try:
            return datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
        except ValueError:
            return None
    if not _REAL.fullmatch(text):
        return None
    value = float(text) + 0.0
    return value if math.isfinite(value) else None


def parse_quantiles(content: str, question: Question) -> ParsedAnswer:
    """A numeric tag's content → values at QUANTILE_LEVELS (module docstring)."""
    spec = question.numeric_spec
    entries = [e for e in ENTRY_SPLIT.split(content) if e.strip()]
    by_level: dict[float, float] = {}
    for entry in entries:
        match = _LEVEL_ENTRY.fullmatch(entry)
        value = None if match is None else _parse_value(match.group(2), spec.time_axis)
        if match is None or value is None:
            return ParsedAnswer(status=ParseStatus.MALFORMED)
        level = round(float(match.group(1)) / 100.0, 6)
        if level in by_level:
            return ParsedAnswer(status=ParseStatus.DUPLICATE)
        by_level[level] = value
    if sorted(by_level) != sorted(QUANTILE_LEVELS):
        return ParsedAnswer(status=ParseStatus.WRONG_LEVELS)
    quantiles = tuple(by_level[level] for level in QUANTILE_LEVELS)
    if any(b < a for a, b in itertools.pairwise(quantiles)):
        return ParsedAnswer(status=ParseStatus.NOT_MONOTONE)
    if not all(spec.admits(q) for q in quantiles):
        return ParsedAnswer(status=ParseStatus.OUT_OF_RANGE)
    return ParsedAnswer(status=ParseStatus.OK, quantiles=quantiles)


class NumericFormat(AnswerFormat):
    kind = QuestionKind.NUMERIC
    task = "Estimate the quantity the question asks for."
    example = "<quantiles>5%: 10, 25%: 14, 50%: 17, 75%: 21, 95%: 30</quantiles>"
    instruction = (
        "- <quantiles>5%: v, 25%: v, 50%: v, 75%: v, 95%: v</quantiles> gives your final answer: "
        "for each level, the value the outcome has that chance of not exceeding, never decreasing "
        f"and within the question's range (for example {example}; for a date, write "
        "YYYY-MM-DD). This ends the research."
    )
    field = "quantiles"
    patterns = (r"<quantiles>(?P<answer>.*?)</quantiles>",)
    open_tags = ("<quantiles>",)
    closing_tag = "</quantiles>"

    def question_lines(self, question: Question) -> list[str]:
        spec = question.numeric_spec
        low, high = format_numeric_value(spec.lower, spec), format_numeric_value(spec.upper, spec)
        unit = f" {spec.unit}" if spec.unit else ""
        bounds = [
            f"the outcome can be {side} {value}"
            for open_, side, value in (
                (spec.open_lower, "below", low),
                (spec.open_upper, "above", high),
            )
            if open_
        ]
        text = f"Range: {low} to {high}{unit}"
        if spec.log_scale:
            text += " (log scale)"
        if bounds:
            text += "; " + " and ".join(bounds)
        levels = ", ".join(f"{round(level * 100)}%" for level in QUANTILE_LEVELS)
        return [text, f"Answer with the quantiles {levels}."]

    def parse_content(self, content: str, question: Question) -> ParsedAnswer:
        return parse_quantiles(content, question)

    def write(self, forecast: Forecast, question: Question, *, exact: bool = False) -> str:
        assert isinstance(forecast, tuple), f"a numeric forecast is a tuple, got {forecast}"
        if len(forecast) != len(QUANTILE_LEVELS):
            raise ValueError(f"need {len(QUANTILE_LEVELS)} quantiles, got {len(forecast)}")
        spec = question.numeric_spec

        def written(value: float) -> str:
            return repr(float(value)) if exact else format_numeric_value(value, spec)

        entries = ", ".join(
            f"{round(level * 100)}%: {written(value)}"
            for level, value in zip(QUANTILE_LEVELS, forecast, strict=True)
        )
        return f"<quantiles>{entries}</quantiles>"

    def answer(self, forecast: Forecast, question: Question) -> ParsedAnswer:
        assert isinstance(forecast, tuple), f"a numeric forecast is a tuple, got {forecast}"
        return ParsedAnswer(status=ParseStatus.OK, quantiles=tuple(forecast))

    def uniform(self, question: Question) -> tuple[float, ...]:
        return uniform_quantiles(question)

    def crowd(self, question: Question) -> tuple[float, ...] | None:
        return question.crowd_forecast


NUMERIC = NumericFormat()
