"""The simulated world's news: the evidence, lure, report and distractor articles of every
kind of question, each drawn from seeded streams. model.py gathers a day's articles.

Per question, `evidence_articles_per_question` articles are published uniformly in the
`evidence_lead_hours` before it is posed, each a noisy reading of its cue: the true level with
probability 1 − `evidence_noise`, else a neighbouring level (binary); the favourite, else a
random other option (choice); μ + N(0, (σ/2)²) rounded (numeric). In a research world a choice
reading also states the favourite's strength and a numeric one the σ (what the title no longer
says), and `research_lures_per_question` lures about the question's entities share the window.
Distractors (`distractor_rate` of the day's articles) are cue-free chatter; at each resolution
a report states the outcome (`publish_resolution_reports`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from futureworld.domain import Article
from futureworld.world.config import WorldConfig, cue_phrase
from futureworld.world.outcomes import KindResolution, MarketResolution, Resolution
from futureworld.world.questions import SimChoiceQuestion, SimKindQuestion, SimMarket, SimQuestion
from futureworld.world.research import lure_texts
from futureworld.world.vocabulary import (
    CHOICE_STRENGTH_WORDS,
    DISTRACTOR_EVENTS,
    EVIDENCE_SOURCES,
    Entity,
    Topic,
)


class ArticleKind(StrEnum):
    EVIDENCE = "evidence"
    """A noisy reading of one question's cue level, published before the question."""
    DISTRACTOR = "distractor"
    """Chatter about an entity that carries no reading of any question (in a research world
    also a lure: odds on a rival event no question asks about)."""
    REPORT = "report"
    """The outcome of one question, published at its resolution."""


@dataclass(frozen=True, kw_only=True)
class SimArticle:
    guid: str
    kind: ArticleKind
    topic: Topic
    title: str
    summary: str
    body: str
    published_at: datetime
    question_id: str | None = None
    """The question this article is evidence for or reports on; None for distractors."""
    cue_reading: int | None = None
    """The cue level an evidence article reports (0-based); None for every other article."""

    @property
    def path(self) -> str:
        return f"/articles/{self.guid}"

    def to_domain(self, *, base_url: str, fetched_at: datetime) -> Article:
        return Article(
            feed=f"{base_url.rstrip('/')}/feeds/{self.topic.value}.xml",
            guid=self.guid,
            link=f"{base_url.rstrip('/')}{self.path}",
            title=self.title,
            summary=self.summary,
            body=self.body,
            published_at=self.published_at,
            fetched_at=fetched_at,
        )


def _published_before(rng: random.Random, question: SimMarket, config: WorldConfig) -> datetime:
    """An instant in the `evidence_lead_hours` before the question is posed."""
    lead_s = int(config.evidence_lead_hours * 3600)
    return question.created_at - timedelta(seconds=rng.randint(60, lead_s))


def _evidence_article(
    config: WorldConfig,
    question: SimMarket,
    j: int,
    texts: tuple[str, str, int],
    published_at: datetime,
) -> SimArticle:
    headline, summary, reading = texts
    return SimArticle(
        guid=f"w{config.seed}-ev-{question.key}-{j}",
        kind=ArticleKind.EVIDENCE,
        topic=question.topic,
        title=headline,
        summary=summary,
        body=f"{summary} The assessment was shared on {published_at:%Y-%m-%d}.",
        published_at=published_at,
        question_id=question.external_id,
        cue_reading=reading,
    )


def binary_evidence(
    rng: random.Random, question: SimQuestion, config: WorldConfig
) -> list[SimArticle]:
    """A binary question's evidence, drawn from its question's stream `rng`."""
    cfg = config
    articles = []
    for j in range(cfg.evidence_articles_per_question):
        reported = question.cue_level
        if rng.random() < cfg.evidence_noise:
            reported = min(cfg.n_levels - 1, max(0, reported + rng.choice((-1, 1))))
        phrase = cue_phrase(reported, cfg.n_levels)
        source = rng.choice(EVIDENCE_SOURCES)
        published_at = _published_before(rng, question, cfg)
        headline = f"{source} see {phrase} odds that {question.entity} will {question.event}"
        summary = (
            f"{source} rate the chance that {question.entity} will {question.event} "
            f"by {question.close_at:%Y-%m-%d} as {phrase}."
        )
        articles.append(
            _evidence_article(cfg, question, j, (headline, summary, reported), published_at)
        )
    return articles


def kind_evidence(question: SimKindQuestion, config: WorldConfig) -> list[SimArticle]:
    """A choice or numeric question's evidence, from a stream of its own."""
    rng = random.Random(f"{config.seed}:evidence-{question.key}")
    articles = []
    for j in range(config.evidence_articles_per_question):
        texts = kind_evidence_texts(
            rng, question, evidence_noise=config.evidence_noise, research=config.research
        )
        published_at = _published_before(rng, question, config)
        articles.append(_evidence_article(config, question, j, texts, published_at))
    return articles


def kind_evidence_texts(
    rng: random.Random, question: SimKindQuestion, *, evidence_noise: float, research: bool = False
) -> tuple[str, str, int]:
    """(headline, summary, reading) of one evidence article: a noisy reading of the question's
    cue (the option it names, or the number it reports); in a research world the text also
    states what the title no longer does (the favourite's strength, the σ)."""
    source = rng.choice(EVIDENCE_SOURCES)
    if isinstance(question, SimChoiceQuestion):
        named = question.favourite
        if rng.random() < evidence_noise:
            named = rng.choice([i for i in range(len(question.options)) if i != named])
        option = question.options[named]
        among = f"among {', '.join(question.options)} by {question.close_at:%Y-%m-%d}"
        if research:
            strength = CHOICE_STRENGTH_WORDS[question.strength]
            return (
                f"{source} see a {strength} favourite in {option} to {question.event} first",
                f"{source} see a {strength} favourite in {option} to {question.event} first "
                f"{among}.",
                named,
            )
        return (
            f"{source} expect {option} to {question.event} first",
            f"{source} say {option} is the one to {question.event} first {among}.",
            named,
        )
    reading = round(rng.gauss(question.mean, question.sigma / 2.0))
    spread = f", give or take {question.sigma:g}" if research else ""
    return (
        f"{source} put {question.entity}'s {question.quantity} near {reading}",
        f"{source} estimate {question.entity} will report about {reading} {question.quantity} "
        f"by {question.close_at:%Y-%m-%d}{spread}.",
        reading,
    )


def lure_articles(question: SimMarket, config: WorldConfig) -> list[SimArticle]:
    """A research world's lures of one question: about its entities, in its evidence window,
    carrying no reading of it (research.lure_texts)."""
    cfg = config
    names = question.names
    rng = random.Random(f"{cfg.seed}:lures-{question.key}")
    articles = []
    for j in range(cfg.research_lures_per_question):
        headline, summary = lure_texts(
            rng,
            j,
            entity=names[0] if len(names) == 1 else rng.choice(names),
            topic=question.topic,
            by_date=f"{question.close_at:%Y-%m-%d}",
            n_levels=cfg.n_levels,
        )
        published_at = _published_before(rng, question, cfg)
        articles.append(
            SimArticle(
                guid=f"w{cfg.seed}-dx-{question.key}-{j}",
                kind=ArticleKind.DISTRACTOR,
                topic=question.topic,
                title=headline,
                summary=summary,
                body=f"{summary} The note was shared on {published_at:%Y-%m-%d}.",
                published_at=published_at,
            )
        )
    return articles


def report_article(
    question: SimMarket, resolution: Resolution | KindResolution, config: WorldConfig
) -> SimArticle:
    """The article stating the question's outcome, published at its resolution time."""
    if isinstance(question, SimQuestion):
        assert isinstance(resolution, Resolution)
        title, summary = _binary_report_texts(question, resolution)
    else:
        assert isinstance(resolution, KindResolution)
        title, summary = kind_report_texts(question, resolution)
    return SimArticle(
        guid=f"w{config.seed}-rp-{question.key}",
        kind=ArticleKind.REPORT,
        topic=question.topic,
        title=title,
        summary=summary,
        body=summary,
        published_at=question.resolve_at,
        question_id=question.external_id,
    )


def _binary_report_texts(q: SimQuestion, resolution: Resolution) -> tuple[str, str]:
    if resolution.resolution is MarketResolution.CANCEL:
        title = f"Question on {q.entity} withdrawn"
        return title, f"The question whether {q.entity} would {q.event} was withdrawn."
    did = "did" if resolution.resolution is MarketResolution.YES else "did not"
    return f"{q.entity} {did} {q.event}", (
        f"Confirmed on {q.resolve_at:%Y-%m-%d}: {q.entity} {did} {q.event}."
    )


def kind_report_texts(question: SimKindQuestion, resolution: KindResolution) -> tuple[str, str]:
    """(title, summary) of the article stating the outcome at the resolution time."""
    if resolution.value is None:
        what = (
            f"which option would {question.event} first"
            if isinstance(question, SimChoiceQuestion)
            else f"{question.entity}'s {question.quantity}"
        )
        return "Question withdrawn", f"The question on {what} was withdrawn."
    if isinstance(question, SimChoiceQuestion):
        winner = question.options[int(resolution.value)]
        text = f"{winner} was the first to {question.event}"
        return text, f"Confirmed on {question.resolve_at:%Y-%m-%d}: {text}."
    text = f"{question.entity} reported {resolution.value:g} {question.quantity}"
    return text, f"Confirmed on {question.resolve_at:%Y-%m-%d}: {text}."


def distractor_articles(
    day: int, day_start: datetime, entities: tuple[Entity, ...], config: WorldConfig
) -> list[SimArticle]:
    """The day's cue-free chatter: `distractor_rate` of its articles."""
    cfg = config
    base = cfg.questions_per_day * max(1, cfg.evidence_articles_per_question)
    count = round(base * cfg.distractor_rate / (1.0 - cfg.distractor_rate))
    rng = random.Random(f"{cfg.seed}:distractors:{day}")
    articles = []
    for j in range(count):
        entity = rng.choice(entities)
        event = rng.choice(DISTRACTOR_EVENTS)
        published_at = day_start + timedelta(seconds=rng.randint(0, 86399))
        summary = f"{entity.name} {event} this week, a spokesperson said."
        articles.append(
            SimArticle(
                guid=f"w{cfg.seed}-dx-d{day}-{j}",
                kind=ArticleKind.DISTRACTOR,
                topic=entity.topic,
                title=f"{entity.name} {event}",
                summary=summary,
                body=f"{summary} No further details were given.",
                published_at=published_at,
            )
        )
    return articles
