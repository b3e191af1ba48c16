"""What every question kind's answer format provides (AnswerFormat), the answer it parses
(ParsedAnswer), and the decimal grammar the formats share. Each kind's module fills the
format in; futureworld.answers holds one of each. No I/O, no tokenizer, no model.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from decimal import Decimal
from typing import ClassVar

from futureworld.domain import ParseStatus, Question, QuestionKind

Forecast = float | tuple[float, ...]
"""P(yes) (binary), a probability per option (choice) or the values at QUANTILE_LEVELS
(numeric)."""

_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
ENTRY_SPLIT = re.compile(r"[,;\n]")
"""Entries of a choice or quantile answer are separated by commas, semicolons or newlines."""


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


def parse_probability(content: str) -> tuple[float | None, ParseStatus]:
    """A probability: a plain decimal ("0.73", "1", "0", "0.", ".5", "+0.5") in [0, 1].

    Scientific notation ("1e-1"), percentages ("73%"), fractions and words are MALFORMED; a
    number outside [0, 1] ("1.2", "-0.1") is OUT_OF_RANGE. p = 0 and p = 1 are valid."""
    content = content.strip()
    if not _DECIMAL.fullmatch(content):
        return None, ParseStatus.MALFORMED
    value = float(content) + 0.0  # "-0" is 0.0, not -0.0
    if not 0.0 <= value <= 1.0:
        return None, ParseStatus.OUT_OF_RANGE
    return value, ParseStatus.OK


def plain_decimal(value: float) -> str:
    """The shortest decimal that reads back as `value`, without an exponent (parse_probability
    takes none): 1e-05 is "0.00001"."""
    return format(Decimal(repr(float(value))), "f")


class AnswerFormat(ABC):
    """One question kind's answer: what the system prompt says about it, its tag, how a reply
    is parsed, and how a forecast is written.

    `parse` is strict: the last complete tag counts; no tag is MISSING and an opened but
    unclosed one MALFORMED. Telling a tag of another kind's format (WRONG_FORMAT) needs every
    format, so futureworld.answers.parse_final_answer does it.
    """

    kind: ClassVar[QuestionKind]
    task: ClassVar[str]
    """The system prompt's task sentence."""
    instruction: ClassVar[str]
    """The system prompt's line on the final answer, holding `example`."""
    example: ClassVar[str]
    """The answer the system prompt shows; it parses as OK."""
    field: ClassVar[str]
    """The Trajectory / ParsedAnswer field that holds the kind's forecast."""
    patterns: ClassVar[tuple[str, ...]]
    """The complete answer tag(s) as regexes; the content is the group "answer" (or "boxed")."""
    open_tags: ClassVar[tuple[str, ...]]
    """An answer that opens one of these and never closes it was cut off: MALFORMED."""
    closing_tag: ClassVar[str]
    """Generation stops at it (with the tools' closing tags)."""
    belief_prefix: ClassVar[str | None] = None
    """Appended to a copy of the context to elicit the agent's belief (a P(yes)) after a tool
    turn; None for kinds whose answer is not one probability (no beliefs are elicited)."""

    def __init__(self) -> None:
        self._answer = re.compile("|".join(self.patterns), re.DOTALL)

    def find(self, text: str) -> str | None:
        """The content of the last complete answer tag in `text`, or None."""
        matches = list(self._answer.finditer(text))
        if not matches:
            return None
        last = matches[-1]
        return last.group(last.lastgroup or 0)

    def unanswered(self, text: str) -> ParseStatus:
        """The status of a reply without a complete tag: MALFORMED if one was opened."""
        opened = any(tag in text for tag in self.open_tags)
        return ParseStatus.MALFORMED if opened else ParseStatus.MISSING

    def parse(self, text: str, question: Question) -> ParsedAnswer:
        """The last complete answer of this format in `text`, under its grammar."""
        content = self.find(text)
        if content is None:
            return ParsedAnswer(status=self.unanswered(text))
        return self.parse_content(content, question)

    def forecast_of(self, fields: object) -> Forecast | None:
        """The kind's forecast held in its field by an answer, a trajectory or anything with
        that field; None if it holds none."""
        value = getattr(fields, self.field)
        return None if value is None or value == () else value

    def question_lines(self, question: Question) -> list[str]:
        """What the question message adds for this kind (the options, the range)."""
        return []

    @abstractmethod
    def parse_content(self, content: str, question: Question) -> ParsedAnswer:
        """A complete tag's content → the answer, or the status saying what is wrong."""

    @abstractmethod
    def write(self, forecast: Forecast, question: Question, *, exact: bool = False) -> str:
        """The forecast as an answer: the canonical text the agent is taught (the kind's
        module states its precision), or with `exact` the text that parses back to the
        forecast itself: parse(write(x, exact=True)) == answer(x)."""

    @abstractmethod
    def answer(self, forecast: Forecast, question: Question) -> ParsedAnswer:
        """The OK answer holding `forecast` (choice probabilities normalised as parse does)."""

    @abstractmethod
    def uniform(self, question: Question) -> Forecast:
        """The forecast of no knowledge: even odds over the kind's answer space."""

    @abstractmethod
    def crowd(self, question: Question) -> Forecast | None:
        """The crowd's forecast the question carries from its source, if any."""
