"""What the agent is told: the system prompt, the question message, and the framing of
tool observations, all rendered through the tokenizer's own chat template.

One system prompt per question kind, differing only in the task sentence and the answer
format (parsing.py's grammar); the binary prompt and question message are unchanged by the
other kinds. A choice question lists its options under their labels; a numeric question
states its range (dates for a time axis), which bounds are open, the scale and the unit.
"""

from __future__ import annotations

from datetime import UTC, datetime

from transformers import PreTrainedTokenizerBase

from futureworld.domain import (
    QUANTILE_LEVELS,
    NumericSpec,
    Question,
    QuestionKind,
    option_label,
)

SYSTEM_PROMPT = (
    "You are a careful forecaster. Estimate the probability that the question resolves YES.\n"
    "You can research it in a news archive that only holds articles published up to the "
    "as-of date. Each reply takes exactly one action:\n"
    "- <search>keywords</search> searches the archive and shows numbered results with ids;\n"
    "- <open>id</open> shows the full article with that id;\n"
    "- <probability>p</probability> gives your final answer, a decimal p between 0 and 1 "
    "(for example <probability>0.73</probability>). This ends the research."
)

_RESEARCH = (
    "You can research it in a news archive that only holds articles published up to the "
    "as-of date. Each reply takes exactly one action:\n"
    "- <search>keywords</search> searches the archive and shows numbered results with ids;\n"
    "- <open>id</open> shows the full article with that id;\n"
)
CHOICE_SYSTEM_PROMPT = (
    "You are a careful forecaster. Exactly one of the question's options will happen: estimate "
    "the probability of each.\n"
    + _RESEARCH
    + "- <probabilities>A: p, B: p, …</probabilities> gives your final answer, a probability "
    "between 0 and 1 for each option label, summing to 1 (for example "
    "<probabilities>A: 0.2, B: 0.5, C: 0.3</probabilities>). This ends the research."
)
NUMERIC_SYSTEM_PROMPT = (
    "You are a careful forecaster. Estimate the quantity the question asks for.\n"
    + _RESEARCH
    + "- <quantiles>5%: v, 25%: v, 50%: v, 75%: v, 95%: v</quantiles> gives your final answer: "
    "for each level, the value the outcome has that chance of not exceeding, never decreasing "
    "and within the question's range (for example "
    "<quantiles>5%: 10, 25%: 14, 50%: 17, 75%: 21, 95%: 30</quantiles>; for a date, write "
    "YYYY-MM-DD). This ends the research."
)
SYSTEM_PROMPTS: dict[QuestionKind, str] = {
    QuestionKind.BINARY: SYSTEM_PROMPT,
    QuestionKind.CHOICE: CHOICE_SYSTEM_PROMPT,
    QuestionKind.NUMERIC: NUMERIC_SYSTEM_PROMPT,
}

BELIEF_PREFIX = "Current estimate: <probability>"
"""Appended to a copy of the context to elicit the agent's belief after a tool turn. Binary
questions only: the loop elicits no beliefs on other kinds."""


def format_numeric_value(value: float, spec: NumericSpec) -> str:
    """A value as the prompt shows it and the answer may write it: a date on a time axis,
    else the shortest decimal that round-trips (no exponent below 1e16)."""
    if spec.time_axis:
        return f"{datetime.fromtimestamp(value, UTC):%Y-%m-%d}"
    return f"{value:.15g}" if abs(value) >= 1e16 else repr(float(value)).removesuffix(".0")


def _kind_lines(question: Question) -> list[str]:
    """The options (choice) or the range (numeric) the question is answered on."""
    if question.kind is QuestionKind.CHOICE:
        spec = question.choice_spec
        lines = [f"{option_label(i)}: {text}" for i, text in enumerate(spec.options)]
        order = " (ordered)" if spec.ordered else ""
        return [f"Options{order}:\n" + "\n".join(lines)]
    if question.kind is QuestionKind.NUMERIC:
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
    return []


def render_question(question: Question, *, as_of: datetime, brief: bool = False) -> str:
    """The user message: title, background, resolution criteria, the options or the range
    of a non-binary question, as-of and resolve-by dates.

    `brief` leaves out background and resolution criteria (short prompts for tiny models).
    """
    parts = [f"Question: {question.title}"]
    if question.background and not brief:
        parts.append(f"Background: {question.background}")
    if question.resolution_criteria and not brief:
        parts.append(f"Resolution criteria: {question.resolution_criteria}")
    parts.extend(_kind_lines(question))
    parts.append(f"As of: {as_of:%Y-%m-%d %H:%M} UTC")
    if question.resolve_by is not None:
        parts.append(f"Resolves by: {question.resolve_by:%Y-%m-%d}")
    return "\n\n".join(parts)


def encode_chat(tokenizer: PreTrainedTokenizerBase, user_message: str) -> list[int]:
    """One user message in the chat template, ending with the assistant header."""
    messages = [{"role": "user", "content": user_message}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase, question: Question, *, as_of: datetime, brief: bool = False
) -> list[int]:
    """The prompt's token ids, ending with the assistant header (generation prompt); the
    system prompt is the question kind's."""
    messages = [
        {"role": "system", "content": SYSTEM_PROMPTS[question.kind]},
        {"role": "user", "content": render_question(question, as_of=as_of, brief=brief)},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


_ASSISTANT_MARK = "\x00ASSISTANT\x00"
_OBSERVATION_MARK = "\x00OBSERVATION\x00"


def observation_frame(tokenizer: PreTrainedTokenizerBase, role: str = "user") -> tuple[str, str]:
    """(before, after): the chat-template text around an observation.

    `before` closes the assistant turn that ended in an action tag and opens the `role`
    message; `after` closes it and opens the next assistant turn. Derived from the
    template itself, so the same code frames observations for any chat model.
    """
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": _ASSISTANT_MARK},
        {"role": role, "content": _OBSERVATION_MARK},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    if _ASSISTANT_MARK not in text or _OBSERVATION_MARK not in text:
        raise ValueError(f"the chat template drops assistant or {role!r} message content")
    between = text.split(_ASSISTANT_MARK, 1)[1]
    before, after = between.split(_OBSERVATION_MARK, 1)
    return before, after
