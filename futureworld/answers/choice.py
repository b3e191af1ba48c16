"""The choice answer: `<probabilities>A: 0.2, B: 0.5, C: 0.3</probabilities>`.

Option labels (A, B … in the question's order, either case) with a probability each
(base.parse_probability), separated by commas, semicolons or newlines. An option left out has
probability 0. If the sum s lies within CHOICE_SUM_TOLERANCE of 1, every probability is
divided by s; otherwise BAD_SUM (so is s = 0). The answer's `choice` is the most probable
option (the lowest label on ties) and its `p_yes` that option's probability: the
(answer, confidence) pair RLCR scores. The canonical text gives every option two decimals.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from futureworld.answers.base import (
    ENTRY_SPLIT,
    AnswerFormat,
    Forecast,
    ParsedAnswer,
    parse_probability,
    plain_decimal,
)
from futureworld.domain import (
    CHOICE_SUM_TOLERANCE,
    ParseStatus,
    Question,
    QuestionKind,
    option_label,
)

_ENTRY = re.compile(r"\s*([A-Za-z])\s*:\s*(\S+)\s*")


def _normalised(raw: Sequence[float]) -> ParsedAnswer:
    """Probabilities divided by their sum, the most probable option and its probability."""
    total = math.fsum(raw)
    probabilities = tuple(p / total for p in raw)
    choice = max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))
    return ParsedAnswer(
        status=ParseStatus.OK,
        p_yes=probabilities[choice],
        choice=choice,
        probabilities=probabilities,
    )


def parse_choice_probabilities(content: str, n_options: int) -> ParsedAnswer:
    """A choice tag's content → normalised probabilities over `n_options` (module docstring)."""
    entries = [e for e in ENTRY_SPLIT.split(content) if e.strip()]
    if not entries:
        return ParsedAnswer(status=ParseStatus.MALFORMED)
    raw = [0.0] * n_options
    seen: set[int] = set()
    for entry in entries:
        match = _ENTRY.fullmatch(entry)
        if match is None:
            return ParsedAnswer(status=ParseStatus.MALFORMED)
        index = ord(match.group(1).upper()) - ord("A")
        value, status = parse_probability(match.group(2))
        if status is not ParseStatus.OK or value is None:
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
    return _normalised(raw)


class ChoiceFormat(AnswerFormat):
    kind = QuestionKind.CHOICE
    task = "Exactly one of the question's options will happen: estimate the probability of each."
    example = "<probabilities>A: 0.2, B: 0.5, C: 0.3</probabilities>"
    instruction = (
        "- <probabilities>A: p, B: p, …</probabilities> gives your final answer, a probability "
        "between 0 and 1 for each option label, summing to 1 (for example "
        f"{example}). This ends the research."
    )
    field = "probabilities"
    patterns = (r"<probabilities>(?P<answer>.*?)</probabilities>",)
    open_tags = ("<probabilities>",)
    closing_tag = "</probabilities>"

    def question_lines(self, question: Question) -> list[str]:
        spec = question.choice_spec
        lines = [f"{option_label(i)}: {text}" for i, text in enumerate(spec.options)]
        order = " (ordered)" if spec.ordered else ""
        return [f"Options{order}:\n" + "\n".join(lines)]

    def parse_content(self, content: str, question: Question) -> ParsedAnswer:
        return parse_choice_probabilities(content, len(question.choice_spec.options))

    def write(self, forecast: Forecast, question: Question, *, exact: bool = False) -> str:
        assert isinstance(forecast, tuple), f"a choice forecast is a tuple, got {forecast}"
        entries = ", ".join(
            f"{option_label(i)}: {plain_decimal(p) if exact else f'{p:.2f}'}"
            for i, p in enumerate(forecast)
        )
        return f"<probabilities>{entries}</probabilities>"

    def answer(self, forecast: Forecast, question: Question) -> ParsedAnswer:
        assert isinstance(forecast, tuple), f"a choice forecast is a tuple, got {forecast}"
        return _normalised(forecast)

    def uniform(self, question: Question) -> tuple[float, ...]:
        k = len(question.choice_spec.options)
        return (1.0 / k,) * k

    def crowd(self, question: Question) -> tuple[float, ...] | None:
        return question.crowd_forecast


CHOICE = ChoiceFormat()
