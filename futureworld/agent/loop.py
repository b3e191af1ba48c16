"""The multi-turn research loop: G rollouts of one question, batched, tokens in/tokens out.

The context is a list of token ids. Generated ids are appended with loss mask 1 and their
behaviour log-probs; tool observations are tokenized once and appended with mask 0 and
log-prob 0.0. Nothing is re-tokenized from text. Persisting the result is storage's job.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from transformers import PreTrainedTokenizerBase

from futureworld.agent.parsing import ACTION_STOP_STRINGS, Action, ActionKind, parse_answer
from futureworld.agent.parsing import parse_action as parse_action_text
from futureworld.agent.prompts import BELIEF_PREFIX, encode_prompt, observation_frame
from futureworld.agent.tools import Corpus, format_article, format_search_results
from futureworld.domain import (
    GenerationSettings,
    ParseStatus,
    Question,
    StopReason,
    Trajectory,
    Turn,
    utc_now,
)
from futureworld.policy.base import FinishReason, Generation, PolicyBackend, SamplingParams

_TURN_SEED_STRIDE = 1_000_003
_BELIEF_SEED_OFFSET = 500_009


@dataclass
class _Rollout:
    index: int
    completion: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    stop: StopReason | None = None
    last_text: str = ""
    tool_s: float = 0.0


def run_group(
    question: Question,
    backend: PolicyBackend,
    corpus: Corpus,
    *,
    samples: int,
    agent_id: int,
    policy_version: int,
    settings: GenerationSettings = GenerationSettings(),
    seed: int | None = None,
    as_of: datetime | None = None,
) -> list[Trajectory]:
    """Run `samples` rollouts of `question` together and return their trajectories.

    Every turn, all still-active rollouts generate in one batched call. The corpus is
    queried as of min(as_of, question.info_cutoff_at), so nothing later can leak in. With a
    seed, turn t samples with seed + t·1000003 (give each question its own seed).
    """
    if question.id is None:
        raise ValueError(f"question {question.source}/{question.external_id} has no id yet")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    params = SamplingParams(
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=settings.max_new_tokens,
        seed=seed,
    )
    started = time.perf_counter()
    as_of = utc_now() if as_of is None else as_of
    search_as_of = min(as_of, question.info_cutoff_at)
    tokenizer = backend.tokenizer
    prompt = encode_prompt(tokenizer, question, as_of=search_as_of, brief=settings.brief_prompt)
    if len(prompt) + 1 > settings.max_total_tokens:
        raise ValueError(
            f"question {question.id}: prompt has {len(prompt)} tokens, over max_total_tokens"
        )
    frame = observation_frame(tokenizer, settings.observation_role)
    belief_ids = tokenizer.encode(BELIEF_PREFIX, add_special_tokens=False)
    stops = tuple(dict.fromkeys((*params.stop, *ACTION_STOP_STRINGS)))
    rollouts = [_Rollout(index=i) for i in range(samples)]
    generate_s = 0.0

    for turn_no in range(settings.max_turns):
        active = [r for r in rollouts if r.stop is None]
        if not active:
            break
        budgets = [settings.max_total_tokens - len(prompt) - len(r.completion) for r in active]
        turn_params = replace(
            params,
            max_new_tokens=min(settings.max_new_tokens, max(budgets)),
            stop=stops,
            seed=None if params.seed is None else params.seed + turn_no * _TURN_SEED_STRIDE,
        )
        t0 = time.perf_counter()
        generations = backend.generate([prompt + r.completion for r in active], turn_params)
        generate_s += time.perf_counter() - t0
        acted: list[_Rollout] = []
        for rollout, generation, budget in zip(active, generations, budgets, strict=True):
            action = _append_generation(rollout, generation, budget, tokenizer)
            if rollout.stop is not None:
                continue
            if turn_no + 1 == settings.max_turns:
                rollout.stop = StopReason.MAX_TURNS
                continue
            _call_tool(rollout, action, corpus, search_as_of, prompt, frame, settings, tokenizer)
            if rollout.stop is None:
                acted.append(rollout)
        if settings.elicit_beliefs and acted:
            t0 = time.perf_counter()
            _elicit_beliefs(acted, backend, prompt, belief_ids, params, turn_no, settings)
            generate_s += time.perf_counter() - t0

    total_s = time.perf_counter() - started
    recorded = replace(params, max_new_tokens=settings.max_new_tokens, stop=stops)
    sampling = {**recorded.to_dict(), "agent": asdict(settings), "backend": backend.describe()}
    trajectories = []
    for r in rollouts:
        p_yes, status = parse_answer(r.last_text)
        if r.stop is not StopReason.ANSWERED and status is ParseStatus.OK:
            p_yes, status = None, ParseStatus.MISSING
        trajectories.append(
            Trajectory(
                question_id=question.id,
                agent_id=agent_id,
                policy_version=policy_version,
                sample_index=r.index,
                prompt_token_ids=tuple(prompt),
                completion_token_ids=tuple(r.completion),
                loss_mask=tuple(r.mask),
                behaviour_logprobs=tuple(r.logprobs),
                turns=tuple(r.turns),
                p_yes=p_yes,
                parse_status=status,
                stop_reason=r.stop or StopReason.MAX_TURNS,
                sampling=sampling,
                timings={"generate_s": generate_s, "tool_s": r.tool_s, "total_s": total_s},
                as_of=as_of,
            )
        )
    return trajectories


def _append_generation(
    rollout: _Rollout, generation: Generation, budget: int, tokenizer: PreTrainedTokenizerBase
) -> Action:
    """Append one assistant turn (mask 1); settle the stop reason if the turn ends the rollout."""
    ids, logprobs = generation.token_ids, generation.logprobs
    over_budget = len(ids) > budget
    if over_budget:  # Tokens past this rollout's own budget were never part of its context.
        ids, logprobs = ids[:budget], logprobs[:budget]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    start = len(rollout.completion)
    rollout.completion.extend(ids)
    rollout.mask.extend([1] * len(ids))
    rollout.logprobs.extend(logprobs)
    action = parse_action_text(text)
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


def _call_tool(
    rollout: _Rollout,
    action: Action,
    corpus: Corpus,
    as_of: datetime,
    prompt: Sequence[int],
    frame: tuple[str, str],
    settings: GenerationSettings,
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Run the search/open, then append its observation once-tokenized with mask 0."""
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
        rollout.tool_s += time.perf_counter() - t0
        rollout.stop = StopReason.TOOL_ERROR
        rollout.turns.append(
            Turn(
                index=len(rollout.turns),
                role="tool",
                text=f"{type(error).__name__}: {error}",
                token_start=len(rollout.completion),
                token_end=len(rollout.completion),
                tool_name=action.kind,
                tool_args=action.argument,
            )
        )
        return
    rollout.tool_s += time.perf_counter() - t0
    content = _truncate_middle(content, settings.max_observation_tokens, tokenizer)
    text = frame[0] + content + frame[1]
    ids = tokenizer.encode(text, add_special_tokens=False)
    # The next turn needs room for at least one generated token.
    if len(prompt) + len(rollout.completion) + len(ids) + 1 > settings.max_total_tokens:
        rollout.stop = StopReason.MAX_TOKENS
        return
    start = len(rollout.completion)
    rollout.completion.extend(ids)
    rollout.mask.extend([0] * len(ids))
    rollout.logprobs.extend([0.0] * len(ids))
    rollout.turns.append(
        Turn(
            index=len(rollout.turns),
            role="tool",
            text=text,
            token_start=start,
            token_end=len(rollout.completion),
            tool_name=action.kind,
            tool_args=action.argument,
            tool_result_ids=result_ids,
        )
    )


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
    ids = tokenizer.encode(content, add_special_tokens=False)
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


def _elicit_beliefs(
    rollouts: list[_Rollout],
    backend: PolicyBackend,
    prompt: Sequence[int],
    belief_ids: Sequence[int],
    params: SamplingParams,
    turn_no: int,
    settings: GenerationSettings,
) -> None:
    """Side generation on a copy of each context; the answer goes on the tool turn's belief."""
    side_params = replace(
        params,
        max_new_tokens=settings.belief_max_new_tokens,
        stop=("</probability>",),
        seed=None
        if params.seed is None
        else params.seed + turn_no * _TURN_SEED_STRIDE + _BELIEF_SEED_OFFSET,
    )
    contexts = [[*prompt, *r.completion, *belief_ids] for r in rollouts]
    generations = backend.generate(contexts, side_params)
    for rollout, generation in zip(rollouts, generations, strict=True):
        text = backend.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        belief, _ = parse_answer("<probability>" + text)
        rollout.turns[-1] = replace(rollout.turns[-1], belief=belief)
