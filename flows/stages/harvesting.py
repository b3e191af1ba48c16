"""Harvest questions and news, and resolve questions past their close, through the source
adapters (futureworld.sources) into the store.

Each source fails alone: its error is recorded as a pipeline event and reported, and the
other sources go on. Re-running is idempotent: questions are keyed by (source, external_id),
articles by guid and link, outcomes only add a revision when the resolution changed.

Decisions: a Manifold MKT resolution (a probability, not 0/1) is stored as annulled, since
binary rewards and calibration metrics need a 0/1 outcome; a resolution the source marks as
not final (Kalshi `determined`) is not recorded until it is final. Generated (rss) questions
have no platform to ask: they are resolved by the LLM judge when a judge is configured, and
otherwise counted as waiting for `futureworld resolve --manual`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine

from flows.settings import Settings
from futureworld.domain import Article, Outcome, OutcomeStatus, Question
from futureworld.sources.base import SourceResolution
from futureworld.sources.http import HttpConfig, SourceClient
from futureworld.sources.platforms import SOURCES, SourceName
from futureworld.sources.question_gen import generate_questions
from futureworld.sources.question_judge import Complete, judge_question, verdict_to_resolution
from futureworld.sources.rss import FeedState, fetch_feeds, read_feed_list
from storage.engine import session_scope
from storage.repositories.articles import (
    articles_between,
    get_feed_state,
    insert_articles,
    set_feed_state,
)
from storage.repositories.events import PipelineEvent, record_events
from storage.repositories.questions import (
    questions_due_for_resolution,
    record_outcomes,
    upsert_questions,
)

GENERATED_SOURCE = "rss"


@dataclass
class Problems:
    """What went wrong in one stage run: readable lines for the report, and the same as
    pipeline events in the store (counted per source and kind in the cycle summary)."""

    run_key: str
    stage: str
    lines: list[str] = field(default_factory=list)
    events: list[PipelineEvent] = field(default_factory=list)

    def add(self, source: str, kind: str, detail: str, *, level: str = "error") -> None:
        self.lines.append(f"{source}: {detail}")
        self.events.append(
            PipelineEvent(
                run_key=self.run_key,
                stage=self.stage,
                source=source,
                kind=kind,
                detail=detail,
                level=level,
            )
        )

    def save(self, engine: Engine) -> None:
        with session_scope(engine) as session:
            record_events(session, self.events)


@dataclass
class HarvestReport:
    questions_new: int = 0
    questions_seen: int = 0
    articles_new: int = 0
    articles_seen: int = 0
    per_source: dict[str, Counter[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass
class ResolveReport:
    checked: int = 0
    outcomes_recorded: int = 0
    annulled: int = 0
    needs_manual: int = 0
    errors: list[str] = field(default_factory=list)


def http_config(settings: Settings) -> HttpConfig:
    return HttpConfig(
        timeout_s=settings.http_timeout_s,
        max_retries=settings.http_max_retries,
        user_agent=settings.user_agent,
    )


def _base_url(settings: Settings, source: SourceName) -> str:
    return str(getattr(settings, f"{source.value}_base_url"))


def _token(settings: Settings, source: SourceName) -> str | None:
    secret = settings.metaculus_token if source is SourceName.METACULUS else None
    return secret.get_secret_value() if secret is not None else None


def configured_feeds(settings: Settings, feeds: Sequence[str] | None) -> list[str]:
    if feeds:
        return list(feeds)
    urls = list(settings.feeds)
    if settings.feeds_file is not None:
        urls += read_feed_list(settings.feeds_file.read_text(encoding="utf-8"))
    return list(dict.fromkeys(urls))


def harvest(
    engine: Engine,
    settings: Settings,
    *,
    sources: Sequence[str] | None,
    feeds: Sequence[str] | None,
    now: datetime,
    run_key: str,
    generate: bool = False,
    limit_per_source: int = 500,
) -> HarvestReport:
    """Harvest open questions from `sources` and articles from `feeds` (default: settings).

    With `generate`, binary questions are generated from the newly stored articles.
    """
    report = HarvestReport()
    problems = Problems(run_key, "harvest")
    with SourceClient(http_config(settings)) as client:
        for name in sources or ():
            try:
                source = SourceName(name)
            except ValueError:
                known = ", ".join(s.value for s in SourceName)
                problems.add(name, "unknown_source", f"unknown source (known: {known}, or rss)")
                continue
            try:
                result = SOURCES[source].harvest_open(
                    client,
                    _base_url(settings, source),
                    now=now,
                    limit=limit_per_source,
                    token=_token(settings, source),
                )
            except Exception as error:  # one broken source must not stop the others
                problems.add(name, "source_failed", str(error))
                continue
            with session_scope(engine) as session:
                counts = upsert_questions(session, result.questions)
            report.questions_new += counts.inserted
            report.questions_seen += len(result.questions)
            report.per_source[name] = Counter(result.counts) + Counter(new=counts.inserted)
            for error in result.errors:
                problems.add(name, "item_error", error)

        urls = configured_feeds(settings, feeds)
        new_articles = _harvest_feeds(engine, client, urls, now, report, problems) if urls else []
    if generate and new_articles:
        generated = generate_questions(new_articles, now=now)
        with session_scope(engine) as session:
            counts = upsert_questions(session, generated.questions)
        report.questions_new += counts.inserted
        report.per_source[GENERATED_SOURCE] = Counter(
            {f"dropped_{k}": v for k, v in generated.dropped.items()}
        ) + Counter(generated=len(generated.questions), new=counts.inserted)
    problems.save(engine)
    report.errors = problems.lines
    return report


def _harvest_feeds(
    engine: Engine,
    client: SourceClient,
    urls: Sequence[str],
    now: datetime,
    report: HarvestReport,
    problems: Problems,
) -> list[Article]:
    """Fetch the feeds with their stored conditional-GET state; returns the new articles."""
    with session_scope(engine) as session:
        states = {}
        for url in urls:
            etag, modified = get_feed_state(session, url)
            states[url] = FeedState(url=url, etag=etag, last_modified=modified)
    results = fetch_feeds(client, urls, states=states, now=now)
    new_articles: list[Article] = []
    with session_scope(engine) as session:
        for result in results:
            inserted = insert_articles(session, result.articles)
            report.articles_new += inserted
            report.articles_seen += len(result.articles)
            report.per_source[f"feed:{result.feed}"] = Counter(result.counts) + Counter(
                new=inserted
            )
            for error in result.errors:
                problems.add(result.feed, "feed_error", error)
            set_feed_state(
                session,
                result.feed,
                etag=result.state.etag,
                last_modified=result.state.last_modified,
                fetched_at=now,
            )
            if inserted:
                new_articles += result.articles
    return new_articles


def resolve(
    engine: Engine,
    settings: Settings,
    *,
    now: datetime,
    run_key: str,
    question_ids_filter: Sequence[int] | None = None,
    judge: Complete | None = None,
) -> ResolveReport:
    """Ask each question's source for the outcome of every open question past its close.

    Generated questions go to `judge` (a text completion over a policy backend) with the
    articles published after their close; without a judge, or when the judge is unsure, they
    are counted as waiting for manual resolution and the verdict is kept as an event.
    """
    report = ResolveReport()
    problems = Problems(run_key, "resolve")
    with session_scope(engine) as session:
        due = questions_due_for_resolution(session, now)
    if question_ids_filter is not None:
        wanted = set(question_ids_filter)
        due = [q for q in due if q.id in wanted]
    report.checked = len(due)
    by_source: dict[str, list[Question]] = {}
    for question in due:
        by_source.setdefault(question.source, []).append(question)
    outcomes: list[Outcome] = []
    with SourceClient(http_config(settings)) as client:
        for name, questions in sorted(by_source.items()):
            if name == GENERATED_SOURCE:
                outcomes += _judge_generated(engine, questions, judge, now, report, problems)
                continue
            try:
                source = SourceName(name)
            except ValueError:
                continue  # imported sets (forecastbench:*) resolve through their importer
            try:
                result = SOURCES[source].fetch_resolutions(
                    client,
                    _base_url(settings, source),
                    [q.external_id for q in questions],
                    now=now,
                    token=_token(settings, source),
                )
            except Exception as error:
                problems.add(name, "source_failed", str(error))
                continue
            for error in result.errors:
                problems.add(name, "item_error", error)
            ids = {q.external_id: q.id for q in questions}
            outcomes += [
                _outcome(ids[r.external_id], r)
                for r in result.resolutions
                if r.final and r.external_id in ids
            ]
    with session_scope(engine) as session:
        recorded = record_outcomes(session, outcomes)
    report.outcomes_recorded = len(recorded)
    report.annulled = sum(1 for o in recorded if o.status is OutcomeStatus.ANNULLED)
    problems.save(engine)
    report.errors = problems.lines
    return report


def _judge_generated(
    engine: Engine,
    questions: Sequence[Question],
    judge: Complete | None,
    now: datetime,
    report: ResolveReport,
    problems: Problems,
) -> list[Outcome]:
    if judge is None:
        report.needs_manual += len(questions)
        return []
    outcomes = []
    for question in questions:
        with session_scope(engine) as session:
            evidence = articles_between(session, question.close_at, now, limit=50)
        verdict = judge_question(question, evidence, judge)
        resolution = verdict_to_resolution(question, verdict, now=now)
        if resolution is None:
            report.needs_manual += 1
            problems.add(
                GENERATED_SOURCE,
                "needs_manual",
                f"question {question.id}: {verdict.verdict} at confidence "
                f"{verdict.confidence:.2f} citing {list(verdict.evidence_ids)}",
                level="warning",
            )
            continue
        outcomes.append(_outcome(question.id, resolution))
    return outcomes


def _outcome(question_id: int, resolution: SourceResolution) -> Outcome:
    value = resolution.value
    if resolution.status is OutcomeStatus.RESOLVED and value not in (0.0, 1.0):
        return Outcome(
            question_id=question_id,
            revision=0,
            status=OutcomeStatus.ANNULLED,
            value=None,
            resolved_at=resolution.resolved_at,
            raw={**resolution.raw, "reason": f"resolved to a probability ({value})"},
        )
    return Outcome(
        question_id=question_id,
        revision=0,
        status=resolution.status,
        value=value,
        resolved_at=resolution.resolved_at,
        raw=resolution.raw,
    )


def resolve_manually(
    engine: Engine, question_id: int, verdict: str, *, now: datetime
) -> Outcome | None:
    """Record a person's resolution: yes, no, or annul."""
    choices = {
        "yes": (OutcomeStatus.RESOLVED, 1.0),
        "no": (OutcomeStatus.RESOLVED, 0.0),
        "annul": (OutcomeStatus.ANNULLED, None),
    }
    if verdict not in choices:
        raise ValueError(f"manual verdict must be yes, no or annul, not {verdict!r}")
    status, value = choices[verdict]
    with session_scope(engine) as session:
        recorded = record_outcomes(
            session,
            [
                Outcome(
                    question_id=question_id,
                    revision=0,
                    status=status,
                    value=value,
                    resolved_at=now,
                    raw={"resolved_by": "manual"},
                )
            ],
        )
    return recorded[0] if recorded else None
