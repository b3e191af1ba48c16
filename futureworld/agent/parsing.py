"""Reading the model's text: the final answer of each question kind and the action a turn
ends with.

Pure string functions. Accepted probabilities are plain decimals: "0.73", "1", "0", "0.",
".5", "+0.5". Scientific notation ("1e-1"), percentages ("73%"), fractions and words are
MALFORMED; a number outside [0, 1] ("1.2", "-0.1") is OUT_OF_RANGE. p = 0 and p = 1 are valid.

Answer formats per kind (the last complete tag of the question's kind counts):
- binary: `<probability>0.73</probability>` or `\\boxed{0.73}`.
- choice: `<probabilities>A: 0.2, B: 0.5, C: 0.3</probabilities>`: option labels (A, B … in
  the question's order, either case) with a probability each, separated by commas, semicolons
  or newlines. An option left out has probability 0. If the sum s lies within
  CHOICE_SUM_TOLERANCE of 1, every probability is divided by s; otherwise BAD_SUM (so is
  s = 0). The answer's `choice` is the most probable option (the lowest label on ties) and
  its `p_yes` that option's probability: the (answer, confidence) pair RLCR scores.
- numeric: `<quantiles>5%: 10, 25%: 14, 50%: 17, 75%: 21, 95%: 30</quantiles>`: exactly the
  levels of QUANTILE_LEVELS (any order, each once), values plain decimals with an optional
  exponent ("1.5e6"), or YYYY-MM-DD dates on a time-axis question (read as midnight UTC,
  stored as POSIX seconds). Values must not decrease with the level (equal values are a point
  mass) and must lie within the range's closed bounds (> 0 on a log scale).
A complete tag of another kind's format is WRONG_FORMAT; no tag at all is MISSING; an opened
but unclosed tag (generation cut off) is MALFORMED.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from futureworld.domain import (
    CHOICE_SUM_TOLERANCE,
    QUANTILE_LEVELS,
    ParseStatus,
    Question,
    QuestionKind,
)

_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_REAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_ANSWER = re.compile(r"<probability>(.*?)</probability>|\\boxed\{([^{}]*)\}", re.DOTALL)
_ANSWER_PATTERNS: dict[QuestionKind, re.Pattern[str]] = {
    QuestionKind.BINARY: _ANSWER,
    QuestionKind.CHOICE: re.compile(r"<probabilities>(.*?)</probabilities>", re.DOTALL),
    QuestionKind.NUMERIC: re.compile(r"<quantiles>(.*?)</quantiles>", re.DOTALL),
}
_ENTRY_SPLIT = re.compile(r"[,;\n]")
_CHOICE_ENTRY = re.compile(r"\s*([A-Za-z])\s*:\s*(\S+)\s*")
_LEVEL_ENTRY = re.compile(r"\s*(\d+(?:\.\d+)?)\s*%\s*:\s*(\S+)\s*")

_ANSWER_TAGS: dict[QuestionKind, tuple[str, ...]] = {
    QuestionKind.BINARY: (
        r"<probability>(?P<answer>.*?)</probability>",
        r"\\boxed\{(?P<boxed>[^{}]*)\}",
    ),
    QuestionKind.CHOICE: (r"<probabilities>(?P<answer>.*?)</probabilities>",),
    QuestionKind.NUMERIC: (r"<quantiles>(?P<answer>.*?)</quantiles>",),
}
_OPEN_TAGS: dict[QuestionKind, tuple[str, ...]] = {
    QuestionKind.BINARY: ("<probability>", "\\boxed{"),
    QuestionKind.CHOICE: ("<probabilities>",),
    QuestionKind.NUMERIC: ("<quantiles>",),
}
_ACTIONS: dict[QuestionKind, re.Pattern[str]] = {
    kind: re.compile(
        "|".join((r"<search>(?P<search>.*?)</search>", r"<open>(?P<open>.*?)</open>", *tags)),
        re.DOTALL,
    )
    for kind, tags in _ANSWER_TAGS.items()
}


class ActionKind(StrEnum):
    SEARCH = "search"
    """`<search>query</search>`: full-text search of the corpus as of the cut-off."""
    OPEN = "open"
    """`<open>id</open>`: read one article."""
    ANSWER = "answer"
    """The final answer in the question kind's format (see the module docstring)."""
    NONE = "none"
    """No complete action tag."""


@dataclass(frozen=True, kw_only=True)
class Action:
    kind: ActionKind
    argument: str = ""
    """The tag's content, stripped: the query, the article id or the answer text."""


@dataclass(frozen=True, kw_only=True)
class ParsedAnswer:
    """A final answer in the Trajectory's fields: binary sets p_yes; choice sets
    probabilities, choice and p_yes (the chosen option's probability); numeric sets quantiles.
    Every field but `status` is empty unless the status is OK."""

    status: ParseStatus
    p_yes: float | None = None
    choice: int | None = None
    probabilities: tuple[float, ...] = ()
    quantiles: tuple[float, ...] = ()


def parse_number(content: str) -> tuple[float | None, ParseStatus]:
    """Parse an answer tag's content under the grammar in the module docstring."""
    content = content.strip()
    if not _DECIMAL.fullmatch(content):
        return None, ParseStatus.MALFORMED
    value = float(content) + 0.0  # "-0" is 0.0, not -0.0
    if not 0.0 <= value <= 1.0:
        return None, ParseStatus.OUT_OF_RANGE
    return value, ParseStatus.OK


def parse_answer(text: str) -> tuple[float | None, ParseStatus]:
    """The last complete binary answer tag in `text`; MISSING if there is none.

    An opened but unclosed `<probability>` (generation cut off) is MALFORMED, not MISSING.
    """
    matches = list(_ANSWER.finditer(text))
    if not matches:
        if "<probability>" in text or "\\boxed{" in text:
            return None, ParseStatus.MALFORMED
        return None, ParseStatus.MISSING
    last = matches[-1]
    content = last.group(1) if last.group(1) is not None else last.group(2)
    return parse_number(content)


def parse_choice_probabilities(content: str, n_options: int) -> ParsedAnswer:
    """A choice tag's content → normalised probabilities over `n_options` (module docstring)."""
    entries = [e for e in _ENTRY_SPLIT.split(content) if e.strip()]
    if not entries:
        return ParsedAnswer(status=ParseStatus.MALFORMED)
    raw = [0.0] * n_options
    seen: set[int] = set()
    for entry in entries:
        match = _CHOICE_ENTRY.fullmatch(entry)
        if match is None:
            return ParsedAnswer(status=ParseStatus.MALFORMED)
        index = ord(match.group(1).upper()) - ord("A")
        value, status = parse_number(match.group(2))
        if status is not ParseStatus.OK:
            return ParsedAnswer(status=status)
        if index >= n_options:
            return ParsedAnswer(status=ParseStatus.UNKNOWN_OPTION)
        if index in seen:
            return ParsedAnswer(status=ParseStatus.DUPLICATE)
        seen.add(index)
        raw[index] = value
    total = math.fsum(raw)
    if total == 0.0 or abs(total - 1.0) > CHOICE_SUM_TOLERANCE:
        return ParsedAnswer(status=ParseStatus.BAD_SUM)
    probabilities = tuple(p / total for p in raw)
    choice = max(range(n_options), key=lambda i: (probabilities[i], -i))
    return ParsedAnswer(
        status=ParseStatus.OK,
        p_yes=probabilities[choice],
        choice=choice,
        probabilities=probabilities,
    )


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
    entries = [e for e in _ENTRY_SPLIT.split(content) if e.strip()]
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


def _last_content(text: str, kind: QuestionKind) -> str | None:
    """The content of the last complete answer tag of `kind` in `text`, or None."""
    matches = list(_ANSWER_PATTERNS[kind].finditer(text))
    if not matches:
        return None
    last = matches[-1]
    return last.group(1) if last.group(1) is not None else last.group(2)


def _missing_or_other(text: str, kind: QuestionKind) -> ParsedAnswer:
    if any(tag in text for tag in _OPEN_TAGS[kind]):
        return ParsedAnswer(status=ParseStatus.MALFORMED)
    for other in QuestionKind:
        if other is not kind and _last_content(text, other) is not None:
            return ParsedAnswer(status=ParseStatus.WRONG_FORMAT)
    return ParsedAnswer(status=ParseStatus.MISSING)


def _binary_answer(text: str, _question: Question) -> ParsedAnswer:
    p_yes, status = parse_answer(text)
    if status is ParseStatus.MISSING:
        return _missing_or_other(text, QuestionKind.BINARY)
    return ParsedAnswer(status=status, p_yes=p_yes)


def _choice_answer(text: str, question: Question) -> ParsedAnswer:
    content = _last_content(text, QuestionKind.CHOICE)
    if content is None:
        return _missing_or_other(text, QuestionKind.CHOICE)
    return parse_choice_probabilities(content, len(question.choice_spec.options))


def _numeric_answer(text: str, question: Question) -> ParsedAnswer:
    content = _last_content(text, QuestionKind.NUMERIC)
    if content is None:
        return _missing_or_other(text, QuestionKind.NUMERIC)
    return parse_quantiles(content, question)


ANSWER_PARSERS: dict[QuestionKind, Callable[[str, Question], ParsedAnswer]] = {
    QuestionKind.BINARY: _binary_answer,
    QuestionKind.CHOICE: _choice_answer,
    QuestionKind.NUMERIC: _numeric_answer,
}


def parse_final_answer(text: str, question: Question) -> ParsedAnswer:
    """The final answer of `text` in the format of the question's kind (module docstring)."""
    return ANSWER_PARSERS[question.kind](text, question)


def parse_action(text: str, kind: QuestionKind = QuestionKind.BINARY) -> Action:
    """The first complete action in `text` (generation stops at its closing tag); only the
    answer format of the question's `kind` counts as an answer."""
    match = _ACTIONS[kind].search(text)
    if match is None:
        return Action(kind=ActionKind.NONE)
    name = match.lastgroup
    argument = (match.group(name) or "").strip()
    if name == "search":
        return Action(kind=ActionKind.SEARCH, argument=argument)
    if name == "open":
        return Action(kind=ActionKind.OPEN, argument=argument)
    return Action(kind=ActionKind.ANSWER, argument=argument)


ACTION_STOP_STRINGS: tuple[str, ...] = ("</search>", "</open>", "</probability>")
"""A binary question's turn ends at the first of these: the loop then acts on it."""


def action_stop_strings(kind: QuestionKind) -> tuple[str, ...]:
    """The stop strings of a turn on a question of `kind`: the tools' and its answer's."""
    closing = {
        QuestionKind.BINARY: "</probability>",
        QuestionKind.CHOICE: "</probabilities>",
        QuestionKind.NUMERIC: "</quantiles>",
    }
    return ("</search>", "</open>", closing[kind])
