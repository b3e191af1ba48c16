"""Binary forecasting questions generated from news articles, and their resolution by a judge.

Templates turn "Entity to/will <event> by/on <date>" sentences of titles and summaries into
questions; an optional LLM pass (`complete(prompt) -> str`, the caller wraps a policy
backend) proposes more. Quality filters drop and count: no resolvable date, dates out of
range, vague wording, near-duplicates and domain overflow. No I/O here.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta

from futureworld.domain import Article, Question, QuestionKind

Complete = Callable[[str], str]
GENERATED_SOURCE = "rss"
"""The source name of questions generated from news articles."""

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_MONTHS["sept"] = 9
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DATE_PATTERNS = (
    re.compile(r"^(?P<year>\d{4})-(?P<mnum>\d{2})-(?P<day>\d{2})$"),
    re.compile(
        rf"^{_MONTH}\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(?P<year>\d{{4}}))?$", re.I
    ),
    re.compile(rf"^(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH}(?:\s+(?P<year>\d{{4}}))?$", re.I),
    re.compile(rf"^(?:the\s+end\s+of\s+)?{_MONTH}(?:\s+(?P<year>\d{{4}}))?$", re.I),
)
_CLAIM = re.compile(
    r"^(?P<entity>[A-Z][\w&'.-]*(?:\s+(?:[A-Z][\w&'.-]*|of|and|the|for)){0,5}?)\s+"
    r"(?P<modal>will|to|plans\s+to|is\s+expected\s+to|are\s+expected\s+to|is\s+set\s+to|"
    r"are\s+set\s+to|set\s+to|aims\s+to|expects\s+to|vows\s+to)\s+"
    r"(?P<event>.+)\s+(?P<prep>by\s+the\s+end\s+of|on|by|before|in)\s+(?P<when>[^;:]+?)\s*$"
)
_MONTH_ANY = _MONTH.replace("(?P<month>", "(?:")
_DATE_PHRASE = re.compile(rf"\b{_MONTH_ANY}\s+\d{{1,2}}\b|\b\d{{1,2}}\s+{_MONTH_ANY}", re.I)
_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\s+[-–—|]\s+")
_TOKEN = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    "the a an of to in on by before will be is are for and or at with from this that its it".split()  # noqa: SIM905
)
DEFAULT_VAGUE_WORDS = (
    "significant", "significantly", "major", "substantial", "soon", "some", "many", "several",
    "various", "likely", "possibly", "might", "may", "could", "approximately", "roughly",
    "considerable", "notable", "somewhat",
)  # fmt: skip
DEFAULT_DOMAIN_KEYWORDS: dict[str, tuple[str, ...]] = {
    "politics": ("election", "senate", "parliament", "vote", "president", "minister", "congress",
                 "bill", "law", "party", "governor", "court", "treaty", "sanctions"),
    "economics": ("inflation", "rate", "rates", "bank", "gdp", "budget", "stocks", "market",
                  "merger", "earnings", "prices", "tariff", "ipo", "jobs", "unemployment"),
    "sports": ("match", "cup", "league", "championship", "final", "season", "tournament", "win",
               "coach", "transfer", "olympic"),
    "science": ("launch", "rocket", "study", "trial", "vaccine", "ai", "model", "satellite",
                "mission", "drug", "approval"),
    "weather": ("storm", "hurricane", "temperature", "flood", "drought", "heatwave", "snow"),
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class QuestionGenConfig:
    """Templates, horizons and filter thresholds of question generation."""

    min_horizon_days: float = 1.0
    """A question must close at least this long after generation (else trivially known)."""
    max_horizon_days: float = 365.0
    """…and at most this long after it (else the reward arrives too late to train on)."""
    resolve_grace_days: float = 7.0
    """resolve_by = close_at + grace: time for the news to report the outcome."""
    near_duplicate_jaccard: float = 0.8
    """Drop a question whose title-token Jaccard with an accepted one reaches this."""
    max_per_domain: int = 50
    """Domain balance: at most this many generated questions per domain per call."""
    vague_words: tuple[str, ...] = DEFAULT_VAGUE_WORDS
    """Words that make a question ambiguous to resolve."""
    domain_keywords: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: dict(DEFAULT_DOMAIN_KEYWORDS)
    )
    """Keyword lists per domain; the domain with most hits wins, "general" if none."""
    judge_min_confidence: float = 0.7
    """Verdicts below this confidence are flagged for manual resolution."""
    judge_max_articles: int = 20
    """At most this many articles go into one judge prompt."""

    def __post_init__(self) -> None:
        if not 0 <= self.min_horizon_days < self.max_horizon_days:
            raise ValueError("need 0 <= min_horizon_days < max_horizon_days")
        if self.resolve_grace_days < 0:
            raise ValueError(f"resolve_grace_days must be >= 0, got {self.resolve_grace_days}")
        if not 0 < self.near_duplicate_jaccard <= 1:
            raise ValueError("near_duplicate_jaccard must be in (0, 1]")
        if self.max_per_domain < 1:
            raise ValueError(f"max_per_domain must be >= 1, got {self.max_per_domain}")
        if not 0 <= self.judge_min_confidence <= 1:
            raise ValueError("judge_min_confidence must be in [0, 1]")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A proposed question before filtering."""

    title: str
    close_on: date | None
    criteria: str
    article: Article
    generator: str
    """template | llm"""
    domain: str = ""


@dataclass(frozen=True, kw_only=True)
class GenerationResult:
    questions: list[Question]
    dropped: Counter[str] = field(default_factory=Counter)
    """Why candidates were dropped: no_template_match, no_resolvable_date, date_out_of_range,
    ambiguous, near_duplicate, domain_cap, llm_unparseable."""


def parse_date(text: str, *, today: date) -> date | None:
    """An explicit calendar date ('March 15', '15 March 2026', '2026-03-15', 'the end of June').

    A month alone means its last day; a missing year means the next such date on/after today.
    """
    text = text.strip().rstrip(".").strip()
    for pattern in _DATE_PATTERNS:
        match = pattern.match(text)
        if not match:
            continue
        groups = match.groupdict()
        month = int(groups["mnum"]) if groups.get("mnum") else _MONTHS[groups["month"].lower()]
        year = int(groups["year"]) if groups.get("year") else today.year
        day_text = groups.get("day")
        try:
            day = int(day_text) if day_text else calendar.monthrange(year, month)[1]
            result = date(year, month, day)
            if not groups.get("year") and result < today:
                day = int(day_text) if day_text else calendar.monthrange(year + 1, month)[1]
                result = date(year + 1, month, day)
        except ValueError:
            return None
        return result
    return None


def classify_domain(text: str, keywords: dict[str, tuple[str, ...]]) -> str:
    tokens = Counter(_TOKEN.findall(text.lower()))
    scores = {name: sum(tokens[w] for w in words) for name, words in keywords.items()}
    best = max(scores, key=lambda name: scores[name], default="general")
    return best if scores.get(best) else "general"


def template_candidates(article: Article, *, today: date) -> tuple[list[Candidate], str | None]:
    """Candidates from the article's title and summary sentences; else the reason for none."""
    reason = "no_template_match"
    candidates: list[Candidate] = []
    for sentence in _SENTENCE_SPLIT.split(f"{article.title}. {article.summary}"):
        match = _CLAIM.match(sentence.strip().rstrip(".!?"))
        if not match:
            continue
        entity, event = match["entity"].strip(), match["event"].strip()
        if entity.startswith("The "):
            entity = "the " + entity[4:]
        close_on = parse_date(match["when"], today=today)
        if close_on is None:
            reason = "no_resolvable_date"
            continue
        deadline = f"{close_on:%B} {close_on.day}, {close_on.year}"
        candidates.append(
            Candidate(
                title=f"Will {entity} {event} by {deadline}?",
                close_on=close_on,
                criteria=(
                    f"Resolves YES if credible news reports published by {deadline} 23:59 UTC "
                    f"state that {entity} did {event}. Resolves NO otherwise."
                ),
                article=article,
                generator="template",
            )
        )
    return candidates, None if candidates else reason


LLM_PROMPT = """You write binary forecasting questions from a news article.
Article title: {title}
Article summary: {summary}
Today: {today}
Return one JSON object per line, nothing else:
{{"question": "Will ... by <date>?", "close_date": "YYYY-MM-DD", "resolution_criteria": "..."}}
Each question must be unambiguous, resolvable from later news, and close after today."""


def llm_candidates(
    article: Article, complete: Complete, *, today: date
) -> tuple[list[Candidate], int]:
    """Candidates proposed by the LLM; returns them and the number of unparseable lines."""
    reply = complete(LLM_PROMPT.format(title=article.title, summary=article.summary, today=today))
    candidates: list[Candidate] = []
    bad = 0
    for line in reply.splitlines():
        line = line.strip().strip(",")
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
            title = str(obj["question"]).strip()
            close_on = date.fromisoformat(str(obj["close_date"]))
            criteria = str(obj.get("resolution_criteria") or "").strip()
        except (ValueError, KeyError, TypeError):
            bad += 1
            continue
        if not title.endswith("?") or not criteria:
            bad += 1
            continue
        candidates.append(
            Candidate(
                title=title, close_on=close_on, criteria=criteria, article=article, generator="llm"
            )
        )
    return candidates, bad


def title_tokens(title: str) -> frozenset[str]:
    return frozenset(t for t in _TOKEN.findall(title.lower()) if t not in _STOPWORDS)


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """|a ∩ b| / |a ∪ b|; 0 for two empty sets."""
    return len(a & b) / len(a | b) if a or b else 0.0


def question_external_id(title: str, close_on: date) -> str:
    """Stable id: the same normalized title and close date always give the same id."""
    key = " ".join(_TOKEN.findall(title.lower())) + "|" + close_on.isoformat()
    return "gen-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:20]


def generate_questions(
    articles: Iterable[Article],
    *,
    now: datetime,
    config: QuestionGenConfig | None = None,
    complete: Complete | None = None,
    existing_titles: Iterable[str] = (),
) -> GenerationResult:
    """Template (+ optional LLM) candidates → filters → binary Questions (source "rss").

    `existing_titles` (e.g. already stored generated questions) count for near-duplicates.
    """
    config = config or QuestionGenConfig()
    today = now.astimezone(UTC).date()
    dropped: Counter[str] = Counter()
    candidates: list[Candidate] = []
    for article in articles:
        # Year-less dates are read relative to the article, not to the harvest day.
        found, reason = template_candidates(article, today=article.published_at.date())
        if reason:
            dropped[reason] += 1
        candidates.extend(found)
        if complete is not None:
            proposed, bad = llm_candidates(article, complete, today=today)
            dropped["llm_unparseable"] += bad
            candidates.extend(proposed)
    accepted_tokens = [title_tokens(t) for t in existing_titles]
    per_domain: Counter[str] = Counter()
    questions: dict[str, Question] = {}
    vague = frozenset(w.lower() for w in config.vague_words)
    for candidate in candidates:
        reason = _filter_reason(candidate, now, config, vague, accepted_tokens)
        if reason:
            dropped[reason] += 1
            continue
        domain = classify_domain(
            f"{candidate.title} {candidate.article.title} {candidate.article.summary}",
            config.domain_keywords,
        )
        if per_domain[domain] >= config.max_per_domain:
            dropped["domain_cap"] += 1
            continue
        assert candidate.close_on is not None
        close_at = datetime.combine(candidate.close_on, time(23, 59, 59), UTC)
        external_id = question_external_id(candidate.title, candidate.close_on)
        if external_id in questions:
            dropped["near_duplicate"] += 1
            continue
        per_domain[domain] += 1
        accepted_tokens.append(title_tokens(candidate.title))
        questions[external_id] = Question(
            source=GENERATED_SOURCE,
            external_id=external_id,
            kind=QuestionKind.BINARY,
            title=candidate.title,
            background=f"{candidate.article.title}. {candidate.article.summary}".strip(),
            resolution_criteria=candidate.criteria,
            url=candidate.article.link,
            domain=domain,
            created_at=now,
            info_cutoff_at=now,
            close_at=close_at,
            resolve_by=close_at + timedelta(days=config.resolve_grace_days),
            extra={
                "generator": candidate.generator,
                "article_guid": candidate.article.guid,
                "article_feed": candidate.article.feed,
            },
        )
    return GenerationResult(questions=list(questions.values()), dropped=dropped)


def _filter_reason(
    candidate: Candidate,
    now: datetime,
    config: QuestionGenConfig,
    vague: frozenset[str],
    accepted: Sequence[frozenset[str]],
) -> str | None:
    if candidate.close_on is None:
        return "no_resolvable_date"
    close_at = datetime.combine(candidate.close_on, time(23, 59, 59), UTC)
    horizon_days = (close_at - now).total_seconds() / 86400.0
    if not config.min_horizon_days <= horizon_days <= config.max_horizon_days:
        return "date_out_of_range"
    # Dates are removed first: the month "May" is not the vague modal "may".
    if set(_TOKEN.findall(_DATE_PHRASE.sub(" ", candidate.title).lower())) & vague:
        return "ambiguous"
    tokens = title_tokens(candidate.title)
    if any(jaccard(tokens, other) >= config.near_duplicate_jaccard for other in accepted):
        return "near_duplicate"
    return None


def _web_link(link: str) -> str:
    """The article's link as a question URL; "" for a linkless entry's stand-in key."""
    return link if link.startswith(("http://", "https://")) else ""


# The judging half of the generated-question life cycle lives next door; re-exported here.
from futureworld.sources.question_judge import (  # noqa: E402
    JudgeVerdict,
    Verdict,
    judge_question,
    verdict_to_resolution,
)

__all__ = [
    "Candidate",
    "GenerationResult",
    "JudgeVerdict",
    "QuestionGenConfig",
    "Verdict",
    "generate_questions",
    "judge_question",
    "parse_date",
    "verdict_to_resolution",
]
