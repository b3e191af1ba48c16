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
from futureworld.domain import Outcome, OutcomeStatus
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
    question_ids,
    questions_due_for_resolution,
    record_outcomes,
    upsert_questions,
)

GENERATED_SOURCE = "rss"


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
    events: list[PipelineEvent] = []
    with SourceClient(http_config(settings)) as client:
        for name in sources or ():
            try:
                source = SourceName(name)
            except ValueError:
                known = ", ".join(s.value for s in SourceName)
                report.errors.append(f"{name}: unknown source (known: {known}, or rss feeds)")
                events.append(
                    PipelineEvent(
                        run_key=run_key,
                        stage="harvest",
                        source=name,
                        kind="unknown_source",
                        detail=name,
                    )
                )
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
                report.errors.append(f"{name}: {error}")
                events.append(
                    PipelineEvent(
                        run_key=run_key,
                        stage="harvest",
                        source=name,
                        kind="source_failed",
                        detail=str(error),
                    )
                )
                continue
            with session_scope(engine) as session:
                counts = upsert_questions(session, result.questions)
            report.questions_new += counts.inserted
            report.questions_seen += len(result.questions)
            report.per_source[name] = Counter(result.counts) + Counter(new=counts.inserted)
            report.errors += [f"{name}: {e}" for e in result.errors]
            events += [
                PipelineEvent(
                    run_key=run_key, stage="harvest", source=name, kind="item_error", detail=e
                )
                for e in result.errors
            ]

        urls = configured_feeds(settings, feeds)
        if urls:
            new_articles = _harvest_feeds(engine, client, urls, now, run_key, report, events)
            if generate and new_articles:
                result = generate_questions(new_articles, now=now)
                with session_scope(engine) as session:
                    counts = upsert_questions(session, result.questions)
                report.questions_new += counts.inserted
                report.per_source[GENERATED_SOURCE] = Counter(
                    {f"dropped_{k}": v for k, v in result.dropped.items()}
                ) + Counter(generated=len(result.questions), new=counts.inserted)
    with session_scope(engine) as session:
        record_events(session, events)
    return report


def _harvest_feeds(engine, client, urls, now, run_key, report, events):
    with session_scope(engine) as session:
        states = {}
        for url in urls:
            etag, modified = get_feed_state(session, url)
            states[url] = FeedState(url=url, etag=etag, last_modified=modified)
    results = fetch_feeds(client, urls, states=states, now=now)
    new_articles = []
    with session_scope(engine) as session:
        for result in results:
            inserted = insert_articles(session, result.articles)
            report.articles_new += inserted
            report.articles_seen += len(result.articles)
            report.per_source[f"feed:{result.feed}"] = Counter(result.counts) + Counter(
                new=inserted
            )
            report.errors += [f"{result.feed}: {e}" for e in result.errors]
            events.extend(
                PipelineEvent(
                    run_key=run_key,
                    stage="harvest",
                    source=result.feed,
                    kind="feed_error",
                    detail=e,
                )
                for e in result.errors
            )
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
    events: list[PipelineEvent] = []
    with session_scope(engine) as session:
        due = questions_due_for_resolution(session, now)
    if question_ids_filter is not None:
        wanted = set(question_ids_filter)
        due = [q for q in due if q.id in wanted]
    by_source: dict[str, list[str]] = {}
    for question in due:
        by_source.setdefault(question.source, []).append(question.external_id)
    report.checked = len(due)
    with SourceClient(http_config(settings)) as client:
        for name, external_ids in sorted(by_source.items()):
            if name == GENERATED_SOURCE:
                generated = [q for q in due if q.source == GENERATED_SOURCE]
                _judge_generated(engine, generated, judge, now, run_key, report, events)
                continue
            try:
                source = SourceName(name)
            except ValueError:
                continue  # imported sets (forecastbench:*) resolve through their importer
            try:
                result = SOURCES[source].fetch_resolutions(
                    client,
                    _base_url(settings, source),
                    external_ids,
                    now=now,
                    token=_token(settings, source),
                )
            except Exception as error:
                report.errors.append(f"{name}: {error}")
                events.append(
                    PipelineEvent(
                        run_key=run_key,
                        stage="resolve",
                        source=name,
                        kind="source_failed",
                        detail=str(error),
                    )
                )
                continue
            report.errors += [f"{name}: {e}" for e in result.errors]
            events += [
                PipelineEvent(
                    run_key=run_key, stage="resolve", source=name, kind="item_error", detail=e
                )
                for e in result.errors
            ]
            final = [r for r in result.resolutions if r.final]
            with session_scope(engine) as session:
                ids = question_ids(session, {(r.source, r.external_id) for r in final})
                outcomes = [
                    _outcome(ids[(r.source, r.external_id)], r)
                    for r in final
                    if (r.source, r.external_id) in ids
                ]
                recorded = record_outcomes(session, outcomes)
            report.outcomes_recorded += len(recorded)
            report.annulled += sum(1 for o in recorded if o.status is OutcomeStatus.ANNULLED)
    with session_scope(engine) as session:
        record_events(session, events)
    return report


def _judge_generated(engine, questions, judge, now, run_key, report, events) -> None:
    if judge is None:
        report.needs_manual += len(questions)
        return
    outcomes = []
    for question in questions:
        with session_scope(engine) as session:
            evidence = articles_between(session, question.close_at, now, limit=50)
        verdict = judge_question(question, evidence, judge)
        resolution = verdict_to_resolution(question, verdict, now=now)
        if resolution is None:
            report.needs_manual += 1
            events.append(
                PipelineEvent(
                    run_key=run_key,
                    stage="resolve",
                    source=GENERATED_SOURCE,
                    level="warning",
                    kind="needs_manual",
                    detail=f"question {question.id}: {verdict.verdict} at confidence "
                    f"{verdict.confidence:.2f} citing {list(verdict.evidence_ids)}",
                )
            )
            continue
        outcomes.append(_outcome(question.id, resolution))
    with session_scope(engine) as session:
        recorded = record_outcomes(session, outcomes)
    report.outcomes_recorded += len(recorded)


def _outcome(question_id: int, resolution) -> Outcome:
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
