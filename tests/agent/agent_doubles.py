"""Test doubles for the agent tests: a scripted stand-in for an external model, a corpus
that records what it was asked, and a tiny model taught a few steps to use the actions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import torch
from transformers import PreTrainedTokenizerBase

from futureworld.agent.prompts import encode_prompt, observation_frame
from futureworld.agent.tools import InMemoryCorpus
from futureworld.domain import Article, Question
from futureworld.policy.base import FinishReason, Generation, SamplingParams
from futureworld.policy.local import LocalBackend
from futureworld.policy.streaming import SequentialStream

CUTOFF = datetime(2026, 3, 1, 12, tzinfo=UTC)


def make_question(**overrides: object) -> Question:
    fields: dict[str, object] = {
        "source": "sim",
        "external_id": "q-1",
        "title": "Will the central bank raise interest rates before April?",
        "background": "Inflation rose for the third month in a row.",
        "resolution_criteria": "YES if the announced policy rate is higher than today.",
        "created_at": CUTOFF - timedelta(days=1),
        "info_cutoff_at": CUTOFF,
        "resolve_by": CUTOFF + timedelta(days=40),
        "id": 7,
    }
    fields.update(overrides)
    return Question(**fields)  # type: ignore[arg-type]


def make_articles() -> list[Article]:
    def article(i: int, title: str, days: float, body: str = "") -> Article:
        return Article(
            feed="news",
            guid=f"g{i}",
            link=f"https://news.example/{i}",
            title=title,
            published_at=CUTOFF + timedelta(days=days),
            fetched_at=CUTOFF + timedelta(days=max(days, 0) + 1),
            summary=f"{title}. The bank said rates are under review.",
            body=body or f"{title}. " * 3,
            id=i,
        )

    return [
        article(1, "Central bank holds rates steady", -3),
        article(2, "Inflation rises again, bank rates in focus", -1),
        article(3, "Central bank raises rates by a quarter point", 5),  # after the cut-off
        article(4, "Long bank report", -2, body="bank rates inflation outlook " * 200),
    ]


class RecordingCorpus(InMemoryCorpus):
    """The in-memory corpus, remembering each call's as_of; can be told to fail."""

    def __init__(self, articles: Sequence[Article], *, fail: bool = False) -> None:
        super().__init__(articles)
        self.as_of_seen: list[datetime] = []
        self.fail = fail

    def search(self, query: str, as_of: datetime, k: int) -> list[Article]:
        self.as_of_seen.append(as_of)
        if self.fail:
            raise ConnectionError("full-text index unavailable")
        return super().search(query, as_of, k)

    def open(self, article_id: int, as_of: datetime) -> Article | None:
        self.as_of_seen.append(as_of)
        return super().open(article_id, as_of)


class ScriptedBackend:
    """Stands in for an external model with fixed replies, for deterministic loop tests.

    A context at turn k (the k-th assistant header after the prompt's) is answered with
    `turns[min(k, last)][j % n]`, j counting the calls of that turn; belief calls (stop is
    only "</probability>") answer `belief_reply`. Log-probs are distinct negative numbers
    so tests can check where each one lands. Its stream answers one request per call.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        turns: Sequence[Sequence[str]],
        belief_reply: str = "0.6</probability>",
    ) -> None:
        self._tokenizer = tokenizer
        self.turns = turns
        self.belief_reply = belief_reply
        self.calls: list[tuple[list[list[int]], SamplingParams]] = []
        self.belief_calls: list[list[list[int]]] = []
        self._counter = 0
        self._per_turn: dict[int, int] = {}

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def describe(self) -> str:
        return "scripted"

    def open_stream(self) -> SequentialStream:
        return SequentialStream(self.generate)

    def _turn_of(self, context: list[int]) -> int:
        text = self._tokenizer.decode(context, skip_special_tokens=False)
        return text.count("<|im_start|>assistant") - 1

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        contexts = [list(p) for p in prompts]
        if params.stop == ("</probability>",):
            self.belief_calls.append(contexts)
            replies = [self.belief_reply] * len(prompts)
        else:
            self.calls.append((contexts, params))
            replies = []
            for context in contexts:
                turn = min(self._turn_of(context), len(self.turns) - 1)
                j = self._per_turn[turn] = self._per_turn.get(turn, -1) + 1
                replies.append(self.turns[turn][j % len(self.turns[turn])])
        generations = []
        for reply in replies:
            ids = self._tokenizer.encode(reply, add_special_tokens=False)
            finish = FinishReason.STOP
            if len(ids) > params.max_new_tokens:
                ids, finish = ids[: params.max_new_tokens], FinishReason.LENGTH
            logprobs = []
            for _ in ids:
                self._counter += 1
                logprobs.append(-0.001 * self._counter)
            generations.append(
                Generation(token_ids=tuple(ids), logprobs=tuple(logprobs), finish_reason=finish)
            )
        return generations


def teach_actions(backend: LocalBackend, question: Question, steps: int = 30) -> None:
    """A few supervised steps so the tiny model searches first and answers after a result.

    Makes the real model produce multi-turn rollouts; its weights change in place.
    """
    tokenizer = backend.tokenizer
    prompt = encode_prompt(tokenizer, question, as_of=question.info_cutoff_at)
    before, after = observation_frame(tokenizer)
    search = tokenizer.encode("<search>bank rates</search>", add_special_tokens=False)
    observation = tokenizer.encode(
        before + "Search results for: bank rates\n1. [id 1] Central bank" + after,
        add_special_tokens=False,
    )
    answer = tokenizer.encode("<probability>0.7</probability>", add_special_tokens=False)
    # One sequence, loss on the two generated spans: half the compute of two examples.
    sequence = [*prompt, *search, *observation, *answer]
    targets = torch.full((len(sequence),), -100)
    for start, span in ((len(prompt), search), (len(sequence) - len(answer), answer)):
        targets[start : start + len(span)] = torch.tensor(span)
    inputs = torch.tensor([sequence])
    model = backend.model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(steps):
        logits = model(input_ids=inputs).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits, targets[1:], ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
