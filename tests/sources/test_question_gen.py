import json
from datetime import UTC, datetime, timedelta

import pytest

from futureworld.domain import Article, OutcomeStatus
from futureworld.sources.question_gen import (
    QuestionGenConfig,
    Verdict,
    generate_questions,
    judge_question,
    parse_date,
    verdict_to_resolution,
)

NOW = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def article(i: int, title: str, summary: str = "", days_ago: float = 1) -> Article:
    published = NOW - timedelta(days=days_ago)
    return Article(
        feed="https://news.example/rss",
        guid=f"g{i}",
        link=f"https://news.example/{i}",
        title=title,
        summary=summary,
        published_at=published,
        fetched_at=NOW,
        id=i,
    )


ARTICLES = [
    article(1, "Acme Corp to announce merger decision by March 20"),
    article(2, "Acme Corp will announce merger decision by March 20, 2026"),
    article(3, "Storm season brings floods to the coast"),
    article(4, "City Council plans to vote on the new stadium soon"),
    article(5, "Regulators to issue significant ruling on the merger by April 10"),
    article(6, "Orbital Labs to launch lunar mission in December 2027"),
    article(7, "Zenith FC to win the league title by May 30"),
    article(8, "Harbor United to win the cup final by May 31"),
    article(9, "Town Council to vote on budget on February 27", days_ago=4),
    article(10, "Markets wobble", "The Senate is expected to pass the budget bill by April 15."),
]


def test_fixed_articles_pass_and_fail_the_filters_as_expected():
    result = generate_questions(ARTICLES, now=NOW)
    titles = sorted(q.title for q in result.questions)
    assert titles == [
        "Will Acme Corp announce merger decision by March 20, 2026?",
        "Will Harbor United win the cup final by May 31, 2026?",
        "Will Zenith FC win the league title by May 30, 2026?",
        "Will the Senate pass the budget bill by April 15, 2026?",
    ]
    assert result.dropped == {
        "near_duplicate": 1,  # article 2 restates article 1
        "no_template_match": 1,  # article 3
        "no_resolvable_date": 1,  # "soon"
        "ambiguous": 1,  # "significant"
        "date_out_of_range": 2,  # December 2027, and February 27 already past
    }


def test_generated_questions_are_complete_binary_questions():
    by_title = {q.title: q for q in generate_questions(ARTICLES, now=NOW).questions}
    q = by_title["Will Acme Corp announce merger decision by March 20, 2026?"]
    assert q.source == "rss" and q.external_id.startswith("gen-")
    assert q.close_at == datetime(2026, 3, 20, 23, 59, 59, tzinfo=UTC)
    assert q.resolve_by == q.close_at + timedelta(days=7)
    assert q.info_cutoff_at == NOW and q.domain == "economics"
    assert "Resolves YES" in q.resolution_criteria and q.extra["article_guid"] == "g1"
    assert by_title["Will Zenith FC win the league title by May 30, 2026?"].domain == "sports"
    assert by_title["Will the Senate pass the budget bill by April 15, 2026?"].domain == "politics"


def test_regeneration_gives_the_same_external_ids():
    first = generate_questions(ARTICLES, now=NOW)
    second = generate_questions(list(reversed(ARTICLES)), now=NOW + timedelta(hours=1))
    assert {q.external_id for q in first.questions} == {q.external_id for q in second.questions}


def test_domain_cap_and_existing_titles():
    config = QuestionGenConfig(max_per_domain=1)
    result = generate_questions(ARTICLES, now=NOW, config=config)
    assert result.dropped["domain_cap"] == 1  # the second sports question
    again = generate_questions(
        ARTICLES, now=NOW, existing_titles=[q.title for q in result.questions]
    )
    assert result.questions and not {q.title for q in result.questions} & {
        q.title for q in again.questions
    }


def test_llm_pass_adds_valid_questions_and_counts_bad_lines():
    def complete(prompt: str) -> str:
        assert "Storm season" in prompt or "Acme" in prompt or "Zenith" in prompt
        if "Storm season" not in prompt:
            return ""
        good = {
            "question": "Will the coastal flood warning be lifted by March 10, 2026?",
            "close_date": "2026-03-10",
            "resolution_criteria": "Resolves YES if the weather service lifts the warning.",
        }
        return json.dumps(good) + "\n{not json}\n" + json.dumps({"question": "No date?"})

    result = generate_questions(ARTICLES[:3] + ARTICLES[6:7], now=NOW, complete=complete)
    llm = [q for q in result.questions if q.extra["generator"] == "llm"]
    assert [q.title for q in llm] == ["Will the coastal flood warning be lifted by March 10, 2026?"]
    assert llm[0].domain == "weather"
    assert result.dropped["llm_unparseable"] == 2


def test_parse_date_forms():
    today = NOW.date()
    assert parse_date("Sept. 3", today=today).isoformat() == "2026-09-03"
    assert parse_date("3rd March 2027", today=today).isoformat() == "2027-03-03"
    assert parse_date("the end of February", today=today).isoformat() == "2027-02-28"
    assert parse_date("February 30", today=today) is None
    assert parse_date("next week", today=today) is None


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="max_per_domain"):
        QuestionGenConfig(max_per_domain=0)


QUESTION = generate_questions(ARTICLES[:1], now=NOW).questions[0]
AFTER = [
    article(21, "Acme announces merger", "Acme Corp announced the merger on March 18.", -18),
    article(22, "Weather", "Sunny.", -19),
]


def judge(reply: str):
    prompts: list[str] = []

    def complete(prompt: str) -> str:
        prompts.append(prompt)
        return reply

    return judge_question(QUESTION, AFTER, complete), prompts


def test_confident_cited_verdict_resolves():
    reply = 'Sure. {"verdict": "yes", "evidence": ["21", "99"], "confidence": 0.9}'
    verdict, prompts = judge(reply)
    assert (verdict.verdict, verdict.evidence_ids, verdict.needs_manual) == (
        Verdict.YES,
        ("21",),  # "99" was never shown to the judge
        False,
    )
    assert "[21]" in prompts[0] and QUESTION.title in prompts[0]
    resolution = verdict_to_resolution(QUESTION, verdict, now=NOW)
    assert resolution.value == 1.0 and resolution.status is OutcomeStatus.RESOLVED
    assert resolution.external_id == QUESTION.external_id


@pytest.mark.parametrize(
    "reply",
    [
        '{"verdict": "unknown", "evidence": [], "confidence": 0.9}',
        '{"verdict": "no", "evidence": ["21"], "confidence": 0.4}',
        '{"verdict": "no", "evidence": ["404"], "confidence": 0.95}',
        "I cannot tell.",
        '{"verdict": "perhaps", "confidence": 1}',
    ],
)
def test_unknown_low_confidence_uncited_or_unreadable_needs_manual(reply):
    verdict, _ = judge(reply)
    assert verdict.needs_manual
    assert verdict_to_resolution(QUESTION, verdict, now=NOW) is None


def test_no_articles_needs_manual_without_calling_the_judge():
    def complete(prompt: str) -> str:
        raise AssertionError("the judge must not be called without evidence")

    verdict = judge_question(QUESTION, [], complete)
    assert verdict.verdict is Verdict.UNKNOWN and verdict.needs_manual
