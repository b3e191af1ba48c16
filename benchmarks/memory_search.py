"""`InMemoryCorpus.search` on the research demo's warm-start corpus, against a scan.

The corpus is every article the research demo's warm world (`DemoConfig(research=True)`, seed
10,000, the world its warm start's demonstrations search) has published by the last cut-off
of its 100 days of questions: 23,318 articles. The queries are what the reference researcher
and the learner write: 500 question titles drawn at random, each whole and as its first four
words ("<entity> <event>" and the poor query's entity), as of the question's cut-off, k = 2
(the demo's `research_search_k`). The reference, in the same process, is a scan that ranks
every article by the same rule (as tests/agent/test_tools_and_prompts.py checks it); the
report gives the ratio and checks that both return the same articles.

    .venv/bin/python benchmarks/memory_search.py
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from flows.demo.config import DemoConfig
from flows.demo.researcher import warm_start_questions, world_corpus
from futureworld.agent.tools import InMemoryCorpus
from futureworld.domain import Article
from futureworld.world import World

WARM_SEED = 10_000
DAYS = 100
QUESTIONS = 500

Search = Callable[[str, datetime, int], list[Article]]


def scan_search(articles: Sequence[Article]) -> Search:
    """Every article's words against the query's, ranked by shared words, newest, lowest id."""
    words = [set(re.findall(r"\w+", f"{a.title} {a.summary} {a.body}".lower())) for a in articles]

    def search(query: str, as_of: datetime, k: int) -> list[Article]:
        terms = set(re.findall(r"\w+", query.lower()))
        scored = [
            (-len(terms & w), -a.published_at.timestamp(), a.id or 0, n)
            for n, (a, w) in enumerate(zip(articles, words, strict=True))
            if a.published_at <= as_of and terms & w
        ]
        return [articles[n] for *_, n in sorted(scored)[:k]]

    return search


def per_search_ms(search: Search, queries: Sequence[tuple[str, datetime]], k: int) -> float:
    started = time.perf_counter()
    for query, as_of in queries:
        search(query, as_of, k)
    return (time.perf_counter() - started) / len(queries) * 1e3


def main() -> None:
    config = DemoConfig(research=True)
    world = World(config.world_config(seed=WARM_SEED, questions_per_day=40))
    questions = warm_start_questions(world, DAYS)
    last = max(q.info_cutoff_at for _, q in questions)
    corpus, guid_of = world_corpus(world, last)
    articles = [a for i in guid_of if (a := corpus.open(i, last)) is not None]
    rng = random.Random(0)
    queries = []
    for _, question in rng.sample(questions, QUESTIONS):
        title = question.title.removesuffix("?")
        queries += [(title, question.info_cutoff_at)]
        queries += [(" ".join(title.split()[:4]), question.info_cutoff_at)]
    k = config.research_search_k
    indexed, scan = InMemoryCorpus(articles).search, scan_search(articles)
    same = all(
        [a.id for a in indexed(q, t, k)] == [a.id for a in scan(q, t, k)] for q, t in queries
    )
    per_search_ms(indexed, queries[:50], k)  # warm-up
    ours, reference = per_search_ms(indexed, queries, k), per_search_ms(scan, queries, k)
    print(f"{len(articles):,} articles, {len(queries)} queries, k = {k}; same results: {same}")
    print(f"InMemoryCorpus.search {ours:.3f} ms, scan {reference:.3f} ms: {ours / reference:.4f}x")


if __name__ == "__main__":
    main()
