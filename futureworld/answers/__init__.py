"""Question kinds' answer formats, one unit per kind: the system prompt's task and answer
line, the tag and its stop string, the strict parser, the writer of canonical (taught) and
exact answers, the kind's forecast field, and its uniform and crowd forecasts.

ANSWER_FORMATS is the registry keyed by QuestionKind; prompts, parsing, demonstrations and
baselines read it. Adding a kind is one module here and one line below. Pure: imports only
futureworld.domain.
"""

from __future__ import annotations

from futureworld.answers.base import AnswerFormat, Forecast, ParsedAnswer
from futureworld.answers.binary import BINARY
from futureworld.answers.choice import CHOICE
from futureworld.answers.numeric import NUMERIC
from futureworld.domain import ParseStatus, Question, QuestionKind

__all__ = ["ANSWER_FORMATS", "AnswerFormat", "Forecast", "ParsedAnswer", "parse_final_answer"]


def parse_final_answer(text: str, question: Question) -> ParsedAnswer:
    """The final answer of `text` in the format of the question's kind: the last complete
    tag counts; none at all is MISSING unless a complete tag of another kind's format is
    there (WRONG_FORMAT); an opened but unclosed tag (generation cut off) is MALFORMED."""
    answer = ANSWER_FORMATS[question.kind].parse(text, question)
    if answer.status is ParseStatus.MISSING and any(
        other.find(text) is not None
        for kind, other in ANSWER_FORMATS.items()
        if kind is not question.kind
    ):
        return ParsedAnswer(status=ParseStatus.WRONG_FORMAT)
    return answer


ANSWER_FORMATS: dict[QuestionKind, AnswerFormat] = {
    QuestionKind.BINARY: BINARY,
    QuestionKind.CHOICE: CHOICE,
    QuestionKind.NUMERIC: NUMERIC,
}
