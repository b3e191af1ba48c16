"""Reading the model's text: the action a turn ends with.

A turn's action is the first complete tag of `<search>query</search>`, `<open>id</open>` or
the final answer in the format of the question's kind; a turn stops at the first closing tag
(action_stop_strings). Each kind's answer grammar, and reading the final answer, live in
futureworld.answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

# The rollout loop and engine read the final answer through this module.
from futureworld.answers import ANSWER_FORMATS, ParsedAnswer, parse_final_answer
from futureworld.answers.binary import parse_answer
from futureworld.domain import QuestionKind

__all__ = [
    "ACTION_STOP_STRINGS",
    "Action",
    "ActionKind",
    "ParsedAnswer",
    "action_stop_strings",
    "parse_action",
    "parse_answer",
    "parse_final_answer",
]

_TOOL_TAGS = (r"<search>(?P<search>.*?)</search>", r"<open>(?P<open>.*?)</open>")
_TOOL_STOP_STRINGS = ("</search>", "</open>")
_ACTIONS: dict[QuestionKind, re.Pattern[str]] = {
    kind: re.compile("|".join((*_TOOL_TAGS, *answers.patterns)), re.DOTALL)
    for kind, answers in ANSWER_FORMATS.items()
}


class ActionKind(StrEnum):
    SEARCH = "search"
    """`<search>query</search>`: full-text search of the corpus as of the cut-off."""
    OPEN = "open"
    """`<open>id</open>`: read one article."""
    ANSWER = "answer"
    """The final answer in the question kind's format (futureworld.answers)."""
    NONE = "none"
    """No complete action tag."""


@dataclass(frozen=True, kw_only=True)
class Action:
    kind: ActionKind
    argument: str = ""
    """The tag's content, stripped: the query, the article id or the answer text."""


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


def action_stop_strings(kind: QuestionKind) -> tuple[str, ...]:
    """The stop strings of a turn on a question of `kind`: the tools' and its answer's."""
    return (*_TOOL_STOP_STRINGS, ANSWER_FORMATS[kind].closing_tag)


ACTION_STOP_STRINGS: tuple[str, ...] = action_stop_strings(QuestionKind.BINARY)
"""A binary question's turn ends at the first of these: the loop then acts on it."""
