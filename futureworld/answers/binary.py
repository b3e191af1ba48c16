"""The binary answer: `<probability>0.73</probability>` or `\\boxed{0.73}`, a probability as
base.parse_probability reads it. The canonical text has two decimals (what the agent is
taught); the exact one the shortest decimal that reads back as the forecast.
"""

from __future__ import annotations

from futureworld.answers.base import (
    AnswerFormat,
    Forecast,
    ParsedAnswer,
    parse_probability,
    plain_decimal,
)
from futureworld.domain import ParseStatus, Question, QuestionKind

BELIEF_PREFIX = "Current estimate: <probability>"
"""A belief side generation continues the context after a tool turn with this."""


def write_probability(p_yes: float, *, exact: bool = False) -> str:
    """The binary answer for P(yes): two decimals, or with `exact` every digit it needs."""
    text = plain_decimal(p_yes) if exact else f"{p_yes:.2f}"
    return f"<probability>{text}</probability>"


class BinaryFormat(AnswerFormat):
    kind = QuestionKind.BINARY
    task = "Estimate the probability that the question resolves YES."
    example = "<probability>0.73</probability>"
    instruction = (
        "- <probability>p</probability> gives your final answer, a decimal p between 0 and 1 "
        f"(for example {example}). This ends the research."
    )
    field = "p_yes"
    patterns = (
        r"<probability>(?P<answer>.*?)</probability>",
        r"\\boxed\{(?P<boxed>[^{}]*)\}",
    )
    open_tags = ("<probability>", "\\boxed{")
    closing_tag = "</probability>"
    belief_prefix = BELIEF_PREFIX

    def parse_content(self, content: str, question: Question) -> ParsedAnswer:
        p_yes, status = parse_probability(content)
        return ParsedAnswer(status=status, p_yes=p_yes)

    def write(self, forecast: Forecast, question: Question, *, exact: bool = False) -> str:
        assert isinstance(forecast, float | int), f"a binary forecast is P(yes), got {forecast}"
        return write_probability(forecast, exact=exact)

    def answer(self, forecast: Forecast, question: Question) -> ParsedAnswer:
        assert isinstance(forecast, float | int), f"a binary forecast is P(yes), got {forecast}"
        return ParsedAnswer(status=ParseStatus.OK, p_yes=forecast)

    def uniform(self, question: Question) -> float:
        return 0.5

    def crowd(self, question: Question) -> float | None:
        return question.crowd_probability


BINARY = BinaryFormat()


def parse_answer(text: str) -> tuple[float | None, ParseStatus]:
    """The last complete binary answer in `text` as (P(yes), status); MISSING if there is
    none, MALFORMED if one was opened and never closed (generation cut off)."""
    content = BINARY.find(text)
    if content is None:
        return None, BINARY.unanswered(text)
    return parse_probability(content)
