"""What the agent is told: the system prompt, the question message, and the framing of
tool observations, all rendered through the tokenizer's own chat template.

One system prompt per question kind, differing only in the task sentence and the answer line
of the kind's format (futureworld.answers), which also adds the question message's lines: a
choice question lists its options under their labels; a numeric question states its range
(dates for a time axis), which bounds are open, the scale and the unit.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from datetime import datetime

from transformers import PreTrainedTokenizerBase

from futureworld.answers import ANSWER_FORMATS

# The belief prompt of binary questions, where the rollout engine reads it (the formats'
# belief_prefix: the loop elicits no beliefs on other kinds).
from futureworld.answers.binary import BELIEF_PREFIX  # noqa: F401
from futureworld.domain import Question, QuestionKind

_RESEARCH = (
    "You can research it in a news archive that only holds articles published up to the "
    "as-of date. Each reply takes exactly one action:\n"
    "- <search>keywords</search> searches the archive and shows numbered results with ids;\n"
    "- <open>id</open> shows the full article with that id;\n"
)
SYSTEM_PROMPTS: dict[QuestionKind, str] = {
    kind: f"You are a careful forecaster. {answers.task}\n{_RESEARCH}{answers.instruction}"
    for kind, answers in ANSWER_FORMATS.items()
}
SYSTEM_PROMPT = SYSTEM_PROMPTS[QuestionKind.BINARY]
"""The binary agents' system prompt (the demo's tokenizer and learning curve read it)."""


ENCODED_TEXTS_KEPT = 8192
"""Texts whose token ids `encode_text` keeps per process, the least recently used dropped
first. A research rollout's prompt and each observation are texts its process has often
tokenized before: the held-out panel forecasts the same questions every round, and the
promotion gate forecasts questions the day's predict did. Kept, a warm round of the demo's
1920-question panel took 0.71-0.81x the time, every rollout token-identical
(benchmarks/panel_token_ids.py; docs/benchmarks.md)."""


class _EncodedTexts:
    """(tokenizer fingerprint, text) → token ids, at most `size` of them (thread-safe: the
    rollout engine tokenizes observations on its tool threads)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._ids: OrderedDict[tuple[str, str], tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> tuple[int, ...] | None:
        with self._lock:
            ids = self._ids.get(key)
            if ids is not None:
                self._ids.move_to_end(key)
            return ids

    def put(self, key: tuple[str, str], ids: tuple[int, ...]) -> None:
        with self._lock:
            self._ids[key] = ids
            self._ids.move_to_end(key)
            self._evict()

    def resize(self, size: int) -> None:
        """Keep at most `size` from now on (0: none), the least recently used dropped now."""
        with self._lock:
            self._size = size
            self._evict()

    def _evict(self) -> None:
        while len(self._ids) > self._size:
            self._ids.popitem(last=False)


_ENCODED = _EncodedTexts(ENCODED_TEXTS_KEPT)
_FINGERPRINTS: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, str | None] = (
    weakref.WeakKeyDictionary()
)
_FINGERPRINTS_LOCK = threading.Lock()
_UNKNOWN = object()


def keep_encoded_texts(size: int) -> None:
    """Keep the ids of at most `size` texts from now on (0: none; ENCODED_TEXTS_KEPT by
    default), the least recently used dropped now: benchmarks/panel_token_ids.py measures
    tokenizing again against keeping them."""
    _ENCODED.resize(size)


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str | None:
    """What decides a fast tokenizer's ids for a text, as a sha256: its class, whether it
    splits special tokens, and its backend's whole definition (model, added tokens,
    normalizer, pre-tokenizer), taken when the tokenizer first encodes through `encode_text`.
    Two loads of one tokenizer (each policy version's checkpoint holds a copy) share it.
    None for a tokenizer without a fast backend: its texts are not kept."""
    with _FINGERPRINTS_LOCK:
        known = _FINGERPRINTS.get(tokenizer, _UNKNOWN)
    if known is not _UNKNOWN:
        return known  # type: ignore[return-value]
    backend = getattr(tokenizer, "backend_tokenizer", None) if tokenizer.is_fast else None
    fingerprint = None
    if backend is not None:
        digest = hashlib.sha256(type(tokenizer).__qualname__.encode())
        digest.update(str(getattr(tokenizer, "split_special_tokens", False)).encode())
        digest.update(backend.to_str().encode())
        fingerprint = digest.hexdigest()
    with _FINGERPRINTS_LOCK:
        _FINGERPRINTS[tokenizer] = fingerprint
    return fingerprint


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`tokenizer.encode(text, add_special_tokens=False)`, the ids kept per (tokenizer
    fingerprint and size, text) for the next time (ENCODED_TEXTS_KEPT). A token added to the
    tokenizer later changes its size, so the ids kept before are not reused."""
    fingerprint = tokenizer_fingerprint(tokenizer)
    if fingerprint is None:
        return tokenizer.encode(text, add_special_tokens=False)
    key = (f"{fingerprint}:{len(tokenizer)}", text)
    ids = _ENCODED.get(key)
    if ids is None:
        ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        _ENCODED.put(key, ids)
    return list(ids)


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
    parts.extend(ANSWER_FORMATS[question.kind].question_lines(question))
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
    return encode_text(tokenizer, text)


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
