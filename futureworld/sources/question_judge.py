"""Resolving generated questions: an LLM judge reads articles published after the close.

`complete(prompt) -> str` is the caller's policy backend. The judge must cite evidence
among the given articles; an unknown, unsupported or low-confidence verdict is flagged
`needs_manual` and never becomes an outcome on its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from futureworld.domain import Article, OutcomeStatus, Question
from futureworld.sources.base import SourceResolution

Complete = Callable[[str], str]
_JSON_OBJECT = re.compile(r"\{.*\}", re.S)


class Verdict(StrEnum):
    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"


@dataclass(frozen=True, kw_only=True)
class JudgeVerdict:
    """The judge's reading of the news after a generated question closed."""

    verdict: Verdict
    evidence_ids: tuple[str, ...]
    """Ids of the cited articles (Article.id, else its guid), only ones the judge was shown."""
    confidence: float
    """In [0, 1]; 0 when the reply could not be read."""
    needs_manual: bool
    """Unknown, unparseable, uncited or below the confidence threshold: a person decides."""
    rationale: str = ""


JUDGE_PROMPT = """You resolve a forecasting question using only the news articles below.
Question: {title}
Resolution criteria: {criteria}
The question closed at {close_at}.

Articles:
{articles}

Answer with one JSON object and nothing else:
{{"verdict": "yes" | "no" | "unknown", "evidence": ["<article id>", ...], "confidence": 0.0-1.0,
 "rationale": "<one sentence>"}}
Say "unknown" unless the articles clearly settle the question."""


def article_ref(article: Article) -> str:
    return str(article.id) if article.id is not None else article.guid


def judge_question(
    question: Question,
    articles_after_close: Sequence[Article],
    complete: Complete,
    *,
    min_confidence: float = 0.7,
    max_articles: int = 20,
    max_chars_per_article: int = 1500,
) -> JudgeVerdict:
    """Ask the judge; parse its JSON; keep only evidence it was actually shown."""
    shown = list(articles_after_close)[:max_articles]
    if not shown:
        return JudgeVerdict(
            verdict=Verdict.UNKNOWN,
            evidence_ids=(),
            confidence=0.0,
            needs_manual=True,
            rationale="no articles after the close",
        )
    listing = "\n\n".join(
        f"[{article_ref(a)}] {a.published_at:%Y-%m-%d} {a.title}\n"
        f"{(a.summary + ' ' + a.body).strip()[:max_chars_per_article]}"
        for a in shown
    )
    prompt = JUDGE_PROMPT.format(
        title=question.title,
        criteria=question.resolution_criteria or "(none given)",
        close_at=question.close_at.isoformat() if question.close_at else "(no close time)",
        articles=listing,
    )
    return parse_verdict(complete(prompt), {article_ref(a) for a in shown}, min_confidence)


def parse_verdict(reply: str, shown_ids: set[str], min_confidence: float) -> JudgeVerdict:
    """Read the judge's JSON reply; anything unreadable becomes unknown + needs_manual."""
    match = _JSON_OBJECT.search(reply)
    try:
        obj = json.loads(match.group(0)) if match else None
        verdict = Verdict(str(obj["verdict"]).strip().lower())
        confidence = float(obj.get("confidence", 0.0))
        cited = [str(e) for e in obj.get("evidence") or []]
    except (TypeError, ValueError, KeyError, AttributeError):
        return JudgeVerdict(
            verdict=Verdict.UNKNOWN,
            evidence_ids=(),
            confidence=0.0,
            needs_manual=True,
            rationale=f"unreadable judge reply: {reply[:200]}",
        )
    confidence = min(1.0, max(0.0, confidence)) if confidence == confidence else 0.0
    evidence = tuple(dict.fromkeys(e for e in cited if e in shown_ids))
    needs_manual = (
        verdict is Verdict.UNKNOWN
        or confidence < min_confidence
        # A yes/no the judge cannot back with an article it was shown is not trusted.
        or not evidence
    )
    return JudgeVerdict(
        verdict=verdict,
        evidence_ids=evidence,
        confidence=confidence,
        needs_manual=needs_manual,
        rationale=str(obj.get("rationale") or ""),
    )


def verdict_to_resolution(
    question: Question, verdict: JudgeVerdict, *, now: datetime
) -> SourceResolution | None:
    """A trusted yes/no verdict as a SourceResolution; None when a person must decide."""
    if verdict.needs_manual or verdict.verdict is Verdict.UNKNOWN:
        return None
    return SourceResolution(
        source=question.source,
        external_id=question.external_id,
        status=OutcomeStatus.RESOLVED,
        value=1.0 if verdict.verdict is Verdict.YES else 0.0,
        resolved_at=now,
        final=True,
        raw={
            "judge_verdict": str(verdict.verdict),
            "evidence_ids": list(verdict.evidence_ids),
            "confidence": verdict.confidence,
            "rationale": verdict.rationale,
        },
    )
