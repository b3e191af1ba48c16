from __future__ import annotations

import random
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from futureworld.agent.prompts import (
    SYSTEM_PROMPT,
    SYSTEM_PROMPTS,
    encode_prompt,
    encode_text,
    observation_frame,
    render_question,
    tokenizer_fingerprint,
)
from futureworld.agent.tools import (
    Corpus,
    InMemoryCorpus,
    format_article,
    format_search_results,
)
from futureworld.domain import Article, NumericSpec, QuestionKind
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


def test_in_memory_search_ranks_as_a_scan_of_every_article_would():
    """The word index visits only articles sharing a word with the query; the ranking is the
    rule's, checked against a scan of every article: more distinct query words, then newer,
    then the lower id (random corpora with many ties, queries with repeated and unknown
    words, cut-offs in the middle of the corpus)."""
    rng = random.Random(7)
    vocabulary = [f"w{i}" for i in range(30)]
    articles = [
        Article(
            feed="news",
            guid=f"g{i}",
            link=f"https://news.example/{i}",
            title=" ".join(rng.choices(vocabulary, k=3)),
            published_at=CUTOFF + timedelta(hours=rng.randint(-48, 48)),  # hour ties
            fetched_at=CUTOFF + timedelta(days=3),
            summary=" ".join(rng.choices(vocabulary, k=4)),
            body=" ".join(rng.choices(vocabulary, k=rng.randint(0, 8))).upper(),
            id=i,
        )
        for i in rng.sample(range(1, 10_000), 400)
    ]
    corpus = InMemoryCorpus(articles)

    def scan(query: str, as_of: datetime, k: int) -> list[int]:
        terms = set(re.findall(r"\w+", query.lower()))
        scored = []
        for a in articles:
            words = set(re.findall(r"\w+", f"{a.title} {a.summary} {a.body}".lower()))
            if a.published_at <= as_of and terms & words:
                scored.append((-len(terms & words), -a.published_at.timestamp(), a.id))
        return [i for _, _, i in sorted(scored)[:k]]

    for _ in range(300):
        query = " ".join(rng.choices([*vocabulary, "unknown", "W3"], k=rng.randint(1, 4)))
        as_of = CUTOFF + timedelta(hours=rng.randint(-60, 60))
        k = rng.choice([1, 2, 5, 50])
        assert [a.id for a in corpus.search(query, as_of, k)] == scan(query, as_of, k), query


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


def test_an_opened_article_names_its_publisher_not_its_feeds_url():
    """The host of the feed: a URL's port or path says nothing about the news, and the demo's
    world is served on a different free port every run."""
    article = make_articles()[0]
    for feed in ("http://127.0.0.1:35555/feeds/all.xml", "http://127.0.0.1:32939/feeds/x.xml"):
        text = format_article(replace(article, feed=feed))
        assert "UTC (127.0.0.1)\n" in text and "feeds" not in text
    text = format_article(replace(article, feed="https://Feeds.BBCI.co.uk/news/rss.xml"))
    assert "UTC (feeds.bbci.co.uk)\n" in text
    assert "UTC (news)\n" in format_article(replace(article, feed="news"))  # not a URL


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


def test_encode_text_keeps_ids_per_tokenizer_definition(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    from futureworld.policy.tiny import init_tiny_model

    texts = [
        "Results for 'Acme rates': [id 3] 2026-02-27 Acme rates rise",
        "<|im_end|>\n<|im_start|>user\nno results<|im_end|>\n<|im_start|>assistant\n",
        "",
        "ünïcode — and\ttabs\n\n",
    ]
    first = AutoTokenizer.from_pretrained(tiny_model_dir)
    again = AutoTokenizer.from_pretrained(tiny_model_dir)  # a second load: one definition
    assert tokenizer_fingerprint(first) == tokenizer_fingerprint(again) is not None
    for text in texts * 2:  # the second pass reads the kept ids
        for tokenizer in (first, again):
            ids = encode_text(tokenizer, text)
            assert ids == tokenizer.encode(text, add_special_tokens=False)
            ids.append(-1)  # each call's list is its own
            assert encode_text(tokenizer, text) == tokenizer.encode(text, add_special_tokens=False)
    other_dir = init_tiny_model(tmp_path / "other", seed=0, extra_texts=["Acme rates rise"] * 50)
    other = AutoTokenizer.from_pretrained(other_dir)
    assert tokenizer_fingerprint(other) != tokenizer_fingerprint(first)
    assert other.encode(texts[0], add_special_tokens=False) != first.encode(
        texts[0], add_special_tokens=False
    )
    assert encode_text(other, texts[0]) == other.encode(texts[0], add_special_tokens=False)
    # a token added after the tokenizer's first encode is not missed
    again.add_tokens(["Acme rates"])
    assert encode_text(again, texts[0]) == again.encode(texts[0], add_special_tokens=False)
    assert encode_text(again, texts[0]) != encode_text(first, texts[0])


def test_observation_frame_closes_the_turn_and_reopens_the_assistant(tiny_backend: LocalBackend):
    before, after = observation_frame(tiny_backend.tokenizer)
    assert before == "<|im_end|>\n<|im_start|>user\n"
    assert after == "<|im_end|>\n<|im_start|>assistant\n"
    assert observation_frame(tiny_backend.tokenizer, role="tool")[0].endswith("tool\n")


def test_binary_prompt_is_the_one_the_binary_agents_learned(tiny_backend: LocalBackend):
    question = make_question()
    tokenizer = tiny_backend.tokenizer
    prompt = tokenizer.decode(encode_prompt(tokenizer, question, as_of=CUTOFF))
    assert SYSTEM_PROMPTS[QuestionKind.BINARY] is SYSTEM_PROMPT and SYSTEM_PROMPT in prompt
    assert "Options" not in prompt and "Range" not in prompt


def test_choice_prompt_lists_labelled_options_and_its_answer_format(tiny_backend: LocalBackend):
    question = make_question(
        kind=QuestionKind.CHOICE, options=("Arden Bank", "Borel Labs", "Calder Clinic")
    )
    text = render_question(question, as_of=CUTOFF, brief=True)
    assert "Options:\nA: Arden Bank\nB: Borel Labs\nC: Calder Clinic" in text
    assert question.background not in text
    tokenizer = tiny_backend.tokenizer
    prompt = tokenizer.decode(encode_prompt(tokenizer, question, as_of=CUTOFF))
    assert "<probabilities>A: 0.2, B: 0.5, C: 0.3</probabilities>" in prompt
    assert "<probability>p</probability>" not in prompt
    ordered = make_question(
        kind=QuestionKind.CHOICE, options=("0-9", "10+"), extra={"ordered_options": True}
    )
    assert "Options (ordered):" in render_question(ordered, as_of=CUTOFF)


def test_numeric_prompt_states_range_bounds_scale_and_unit(tiny_backend: LocalBackend):
    spec = NumericSpec(lower=1.0, upper=1e6, open_upper=True, log_scale=True, unit="USD")
    question = make_question(kind=QuestionKind.NUMERIC, extra=spec.to_extra())
    text = render_question(question, as_of=CUTOFF)
    assert "Range: 1 to 1000000 USD (log scale); the outcome can be above 1000000" in text
    assert "Answer with the quantiles 5%, 25%, 50%, 75%, 95%." in text
    tokenizer = tiny_backend.tokenizer
    prompt = tokenizer.decode(encode_prompt(tokenizer, question, as_of=CUTOFF))
    assert "<quantiles>5%: 10, 25%: 14, 50%: 17, 75%: 21, 95%: 30</quantiles>" in prompt
    start, end = datetime(2026, 4, 1, tzinfo=UTC), datetime(2026, 6, 30, tzinfo=UTC)
    dates = NumericSpec(lower=start.timestamp(), upper=end.timestamp(), time_axis=True)
    dated = make_question(kind=QuestionKind.NUMERIC, extra=dates.to_extra())
    assert "Range: 2026-04-01 to 2026-06-30\n" in render_question(dated, as_of=CUTOFF)
