"""One rollout of the multi-turn research loop, turn by turn, tokens in/tokens out: what a
turn appends, which tool it calls, when the rollout stops, and the trajectory it becomes.
Scheduling many rollouts at once is the rollout engine's job (futureworld.agent.engine).

The context is a list of token ids. Generated ids are appended with loss mask 1 and their
behaviour log-probs; tool observations are tokenized once and appended with mask 0 and
log-prob 0.0. Nothing is re-tokenized from text. Persisting the result is storage's job.
Every question kind runs through this one loop: a turn stops at the tools' closing tags or
its kind's answer tag (parsing.action_stop_strings), and only the kind's own answer format
ends the rollout as answered; another kind's answer tag is no action (NO_ACTION).

Budget: the observation that leads into a rollout's last turn ends with LAST_TURN_NOTICE, so
the agent knows that turn must answer (a tool call there ends the rollout unanswered,
MAX_TURNS); the prompt states the budget in no other way.

Seeding: a rollout has its own seed (a hash of the agent's seed, the question, the policy
version and the sample index: `rollout_seed`); its turn t samples with seed + t·1000003 and
the belief after turn t with that plus 500009.

A prompt that leaves no room for a full first turn (`max_total_tokens − max_new_tokens`) is
cut by one rule before the question is given up: the background is shortened from its end
(marked "[…]"), down to nothing, then the resolution criteria the same way; a prompt still too
long (title and dates alone) raises `PromptTooLong`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from transformers import PreTrainedTokenizerBase

from futureworld.agent.parsing import Action, ActionKind, parse_answer
from futureworld.agent.parsing import parse_action as parse_action_text
from futureworld.agent.prompts import encode_prompt, encode_text
from futureworld.agent.tools import Corpus, format_article, format_search_results
from futureworld.domain import GenerationSettings, Question, QuestionKind, StopReason, Turn
from futureworld.policy.base import FinishReason, Generation

TURN_SEED_STRIDE = 1_000_003
BELIEF_SEED_OFFSET = 500_009
CUT_MARK = " […]"
LAST_TURN_NOTICE = "\nLast turn: give your answer."
"""Ends the observation before a rollout's last turn (module docstring, "Budget")."""


class PromptTooLong(ValueError):
    """Even the cut prompt leaves no room for a first turn."""


def rollout_seed(base_seed: int, question_id: int, policy_version: int, sample: int) -> int:
    """A rollout's 32-bit seed: sha256 of (agent seed, question, version, sample index)."""
    parts = (base_seed, question_id, policy_version, sample)
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def turn_seed(seed: int, turn_no: int) -> int:
    return seed + turn_no * TURN_SEED_STRIDE


def belief_seed(seed: int, turn_no: int) -> int:
    return seed + turn_no * TURN_SEED_STRIDE + BELIEF_SEED_OFFSET


@dataclass(frozen=True)
class FittedPrompt:
    ids: list[int]
    cut: str | None = None
    """What was shortened to make the prompt fit, if anything."""


def fit_prompt(
    tokenizer: PreTrainedTokenizerBase,
    question: Question,
    *,
    as_of: datetime,
    settings: GenerationSettings,
) -> FittedPrompt:
    """The question's prompt, cut by the module's rule when it leaves no room for a turn."""
    limit = settings.max_total_tokens - settings.max_new_tokens

    def encode(q: Question) -> list[int]:
        return encode_prompt(tokenizer, q, as_of=as_of, brief=settings.brief_prompt)

    ids = encode(question)
    if len(ids) <= limit:
        return FittedPrompt(ids)
    cuts = []
    fields = () if settings.brief_prompt else ("background", "resolution_criteria")
    for name in fields:
        text = getattr(question, name)
        if not text:
            continue
        question, ids = _shorten(tokenizer, question, name, limit, encode)
        kept = len(getattr(question, name))
        cuts.append(f"{name} {len(text)} → {kept} chars")
        if len(ids) <= limit:
            return FittedPrompt(ids, "; ".join(cuts))
    raise PromptTooLong(
        f"question {question.id}: prompt has {len(ids)} tokens"
        + (f" after cutting ({'; '.join(cuts)})" if cuts else "")
        + f", over max_total_tokens {settings.max_total_tokens} − max_new_tokens "
        f"{settings.max_new_tokens}"
    )


def _shorten(tokenizer, question, name, limit, encode) -> tuple[Question, list[int]]:
    """The longest head of field `name` (in tokens, marked) with which the prompt fits, or
    the field removed; binary search over the kept token count."""
    field_ids = tokenizer.encode(getattr(question, name), add_special_tokens=False)
    low, high = 0, len(field_ids) - 1
    best = replace(question, **{name: ""})
    best_ids = encode(best)
    while low <= high:
        mid = (low + high) // 2
        candidate = replace(question, **{name: tokenizer.decode(field_ids[:mid]) + CUT_MARK})
        ids = encode(candidate)
        if len(ids) <= limit and mid > 0:
            best, best_ids, low = candidate, ids, mid + 1
        elif len(ids) <= limit:
            low = mid + 1
        else:
            high = mid - 1
    return best, best_ids


@dataclass
class Rollout:
    """One rollout's state while it runs."""

    index: int
    """Sample index within its group."""
    seed: int
    completion: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    stop: StopReason | None = None
    last_text: str = ""
    tool_s: float = 0.0
    generate_s: float = 0.0
    turn_no: int = 0
    beliefs_pending: int = 0

    @property
    def done(self) -> bool:
        return self.stop is not None and self.beliefs_pending == 0


def append_generation(
    rollout: Rollout,
    generation: Generation,
    budget: int,
    tokenizer: PreTrainedTokenizerBase,
    kind: QuestionKind = QuestionKind.BINARY,
) -> Action:
    """Append one assistant turn (mask 1); settle the stop reason if the turn ends the rollout.
    Only the answer format of the question's `kind` ends it as answered."""
    ids, logprobs = generation.token_ids, generation.logprobs
    over_budget = len(ids) > budget
    if over_budget:  # Tokens past this rollout's own budget were never part of its context.
        ids, logprobs = ids[:budget], logprobs[:budget]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    start = len(rollout.completion)
    rollout.completion.extend(ids)
    rollout.mask.extend([1] * len(ids))
    rollout.logprobs.extend(logprobs)
    action = parse_action_text(text, kind)
    rollout.turns.append(
        Turn(
            index=len(rollout.turns),
            role="assistant",
            text=text,
            token_start=start,
            token_end=len(rollout.completion),
            tool_name=None if action.kind in (ActionKind.NONE, ActionKind.ANSWER) else action.kind,
            tool_args=action.argument if action.kind is not ActionKind.NONE else None,
        )
    )
    rollout.last_text = text
    if action.kind is ActionKind.ANSWER:
        rollout.stop = StopReason.ANSWERED
    elif over_budget or (
        action.kind is ActionKind.NONE
        and generation.finish_reason is FinishReason.LENGTH
        and len(ids) >= budget
    ):
        rollout.stop = StopReason.MAX_TOKENS
    elif action.kind is ActionKind.NONE:
        rollout.stop = StopReason.NO_ACTION
    return action


@dataclass(frozen=True)
class Observation:
    """A tool call's outcome, before it is appended: the framed text and its token ids, or
    the corpus error that ends the rollout. Computing it touches no rollout, so it can run
    on another thread while the rollout waits."""

    action: Action
    tool_s: float
    """Seconds in the corpus call."""
    text: str = ""
    ids: tuple[int, ...] = ()
    result_ids: tuple[int, ...] = ()
    error: str | None = None
    """`Type: message` of a corpus failure (the rollout then stops with TOOL_ERROR)."""


def leads_into_last_turn(turn_no: int, settings: GenerationSettings) -> bool:
    """Whether the observation of turn `turn_no`'s tool call leads into the rollout's last
    turn (turns count from 0; a rollout has `settings.max_turns`)."""
    return turn_no + 2 == settings.max_turns


def run_tool(
    action: Action,
    corpus: Corpus,
    as_of: datetime,
    frame: tuple[str, str],
    settings: GenerationSettings,
    tokenizer: PreTrainedTokenizerBase,
    *,
    last_turn_next: bool = False,
) -> Observation:
    """Run the search/open and tokenize its observation once (framed, cut to the budget,
    ending with LAST_TURN_NOTICE where the turn it leads into is the rollout's last)."""
    t0 = time.perf_counter()
    result_ids: tuple[int, ...] = ()
    try:
        if action.kind is ActionKind.SEARCH:
            articles = corpus.search(action.argument, as_of, settings.search_k)
            result_ids = tuple(a.id for a in articles if a.id is not None)
            content = format_search_results(action.argument, articles)
        else:
            content = _open_article(action.argument, corpus, as_of)
            if content.startswith("[id "):
                result_ids = (int(action.argument),)
    except Exception as error:  # Any corpus failure ends this rollout, recorded, not raised.
        return Observation(
            action, time.perf_counter() - t0, error=f"{type(error).__name__}: {error}"
        )
    tool_s = time.perf_counter() - t0
    content = _truncate_middle(content, settings.max_observation_tokens, tokenizer)
    if last_turn_next:
        content += LAST_TURN_NOTICE
    text = frame[0] + content + frame[1]
    ids = tuple(encode_text(tokenizer, text))
    return Observation(action, tool_s, text=text, ids=ids, result_ids=result_ids)


def append_observation(
    rollout: Rollout, observation: Observation, prompt_len: int, settings: GenerationSettings
) -> None:
    """Append a tool turn (mask 0, log-prob 0.0), or stop the rollout: TOOL_ERROR on a corpus
    failure, MAX_TOKENS when the observation leaves no room for one more generated token."""
    action = observation.action
    rollout.tool_s += observation.tool_s
    start = len(rollout.completion)
    if observation.error is not None:
        rollout.stop = StopReason.TOOL_ERROR
        rollout.turns.append(
            Turn(
                index=len(rollout.turns),
                role="tool",
                text=observation.error,
                token_start=start,
                token_end=start,
                tool_name=action.kind,
                tool_args=action.argument,
            )
        )
        return
    ids = observation.ids
    if prompt_len + start + len(ids) + 1 > settings.max_total_tokens:
        rollout.stop = StopReason.MAX_TOKENS
        return
    rollout.completion.extend(ids)
    rollout.mask.extend([0] * len(ids))
    rollout.logprobs.extend([0.0] * len(ids))
    rollout.turns.append(
        Turn(
            index=len(rollout.turns),
            role="tool",
            text=observation.text,
            token_start=start,
            token_end=len(rollout.completion),
            tool_name=action.kind,
            tool_args=action.argument,
            tool_result_ids=observation.result_ids,
        )
    )


def call_tool(
    rollout: Rollout,
    action: Action,
    corpus: Corpus,
    as_of: datetime,
    prompt: Sequence[int],
    frame: tuple[str, str],
    settings: GenerationSettings,
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Run the search/open, append its observation once-tokenized with mask 0 and, unless the
    rollout stopped, move it on to its next turn (as the engine does after a tool call)."""
    last = leads_into_last_turn(rollout.turn_no, settings)
    observation = run_tool(action, corpus, as_of, frame, settings, tokenizer, last_turn_next=last)
    append_observation(rollout, observation, len(prompt), settings)
    if rollout.stop is None:
        rollout.turn_no += 1


def record_belief(
    rollout: Rollout, turn_index: int, generation: Generation, tokenizer: PreTrainedTokenizerBase
) -> None:
    """A belief side generation's answer goes on the tool turn it was elicited after. Beliefs
    are P(yes) and elicited on binary questions only."""
    text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
    belief, _ = parse_answer("<probability>" + text)
    rollout.turns[turn_index] = replace(rollout.turns[turn_index], belief=belief)


def _open_article(argument: str, corpus: Corpus, as_of: datetime) -> str:
    try:
        article_id = int(argument.strip().lstrip("#"))
    except ValueError:
        return f"'{argument}' is not an article id; use a number from the search results."
    article = corpus.open(article_id, as_of)
    if article is None:
        return f"No article with id {article_id} is available as of {as_of:%Y-%m-%d}."
    return format_article(article)


def _truncate_middle(content: str, max_tokens: int, tokenizer: PreTrainedTokenizerBase) -> str:
    """Keep the head and tail of an over-long observation, with a marker between."""
    ids = encode_text(tokenizer, content)
    if len(ids) <= max_tokens:
        return content
    head = max_tokens // 2
    tail = max_tokens - head
    omitted = len(ids) - head - tail
    return (
        tokenizer.decode(ids[:head])
        + f"\n[… {omitted} tokens omitted …]\n"
        + tokenizer.decode(ids[len(ids) - tail :])
    )
