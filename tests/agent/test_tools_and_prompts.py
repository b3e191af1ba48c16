from __future__ import annotations

from datetime import timedelta

import pytest

from futureworld.agent.prompts import encode_prompt, observation_frame, render_question
from futureworld.agent.tools import (
    Corpus,
    InMemoryCorpus,
    format_article,
    format_search_results,
)
from futureworld.policy.local import LocalBackend
from tests.agent.agent_doubles import CUTOFF, make_articles, make_question


def test_in_memory_corpus_hides_articles_published_after_as_of():
    corpus = InMemoryCorpus(make_articles())
    assert isinstance(corpus, Corpus)
    found = [a.id for a in corpus.search("central bank raises rates", CUTOFF, k=10)]
    assert 3 not in found and found[0] == 1
    assert 3 in [a.id for a in corpus.search("raises", CUTOFF + timedelta(days=6), k=10)]
    assert corpus.open(3, CUTOFF) is None and corpus.open(1, CUTOFF) is not None
    assert corpus.search("rates", CUTOFF, k=1)[0].id == 2  # ties go to the newest


def test_search_results_are_numbered_snippets_with_ids_and_dates():
    articles = make_articles()[:2]
    text = format_search_results("bank rates", articles, snippet_chars=20)
    lines = text.splitlines()
    assert lines[0] == "Search results for: bank rates"
    assert lines[1].startswith("1. [id 1] 2026-02-26 Central bank holds rates steady — ")
    assert lines[2].startswith("2. [id 2] 2026-02-28 ")
    assert len(lines[1].split(" — ")[1]) == 20
    assert "No articles found." in format_search_results("x", [])
    assert "[id 4] Long bank report" in format_article(make_articles()[3])


def test_naive_as_of_is_rejected():
    with pytest.raises(ValueError, match="timezone-aware"):
        InMemoryCorpus(make_articles()).search("rates", CUTOFF.replace(tzinfo=None), k=3)


def test_prompt_carries_question_dates_and_actions(tiny_backend: LocalBackend):
    question = make_question()
    text = render_question(question, as_of=CUTOFF)
    for part in (question.title, question.background, question.resolution_criteria):
        assert part in text
    assert "As of: 2026-03-01 12:00 UTC" in text and "Resolves by: 2026-04-10" in text
    tokenizer = tiny_backend.tokenizer
    prompt = tokenizer.decode(encode_prompt(tokenizer, question, as_of=CUTOFF))
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "<search>" in prompt and "<open>" in prompt and "<probability>" in prompt


def test_observation_frame_closes_the_turn_and_reopens_the_assistant(tiny_backend: LocalBackend):
    before, after = observation_frame(tiny_backend.tokenizer)
    assert before == "<|im_end|>\n<|im_start|>user\n"
    assert after == "<|im_end|>\n<|im_start|>assistant\n"
    assert observation_frame(tiny_backend.tokenizer, role="tool")[0].endswith("tool\n")
