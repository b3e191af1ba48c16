"""Reading the model's text: the final probability and the action a turn ends with.

Pure string functions. Accepted numbers are plain decimals: "0.73", "1", "0", "0.", ".5",
"+0.5". Scientific notation ("1e-1"), percentages ("73%"), fractions and words are
MALFORMED; a number outside [0, 1] ("1.2", "-0.1") is OUT_OF_RANGE. p = 0 and p = 1 are valid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from futureworld.domain import ParseStatus

_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_ANSWER = re.compile(r"<probability>(.*?)</probability>|\\boxed\{([^{}]*)\}", re.DOTALL)
_ACTION = re.compile(
    r"<search>(?P<search>.*?)</search>"
    r"|<open>(?P<open>.*?)</open>"
    r"|<probability>(?P<answer>.*?)</probability>"
    r"|\\boxed\{(?P<boxed>[^{}]*)\}",
    re.DOTALL,
)


class ActionKind(StrEnum):
    SEARCH = "search"
    """`<search>query</search>`: full-text search of the corpus as of the cut-off."""
    OPEN = "open"
    """`<open>id</open>`: read one article."""
    ANSWER = "answer"
    """`<probability>p</probability>` or `\\boxed{p}`: the final answer."""
    NONE = "none"
    """No complete action tag."""


@dataclass(frozen=True, kw_only=True)
class Action:
    kind: ActionKind
    argument: str = ""
    """The tag's content, stripped: the query, the article id or the probability text."""


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
    """The last complete answer tag in `text`; MISSING if there is none.

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


def parse_action(text: str) -> Action:
    """The first complete action in `text` (generation stops at its closing tag)."""
    match = _ACTION.search(text)
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
"""A turn's generation ends at the first of these: the loop then acts on it."""
