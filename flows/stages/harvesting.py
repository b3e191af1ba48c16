"""Harvest: open questions from the forecasting platforms and articles from RSS/Atom feeds into
the store, and optionally questions generated from the new articles.

Each source fails alone: its error is recorded as a pipeline event and reported, and the
other sources go on. Re-running is idempotent: questions are keyed by (source, external_id),
articles by guid and link.

Each source asked for is judged (SourceStatus): a platform `failed` when it is unknown, raised,
or not even its first page came back, `partial` when some pages or items failed; the feeds
together are the source `rss`, `failed` when no feed answered with articles or a 304, `partial`
when some feeds or entries failed. The CLI and the daily cycle fail on a failed source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine

from flows.context import PipelineContext
from flows.settings import Settings
from flows.stages.problems import Problems, SourceStatus, source_verdict
from futureworld.domain import Article
from futureworld.sources.http import SourceClient
from futureworld.sources.platforms import SOURCES, SourceName
from futureworld.sources.question_gen import GENERATED_SOURCE, generate_questions
from futureworld.sources.rss import FeedResult, FeedState, fetch_feeds, read_feed_list
from storage.engine import session_scope
from storage.repositories.articles import get_feed_state, insert_articles, set_feed_state
from storage.repositories.questions import upsert_questions


@dataclass
class HarvestReport:
    questions_new: int = 0
    questions_seen: int = 0
    articles_new: int = 0
    articles_seen: int = 0
    per_source: dict[str, Counter[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    sources: dict[str, SourceStatus] = field(default_factory=dict)
    """How each source asked for went (the feeds together as `rss`)."""

    @property
    def verdict(self) -> str | None:
        """One line when a source failed or was partial; None when all went well."""
        return source_verdict(self.sources)


def configured_feeds(settings: Settings, feeds: Sequence[str] | None) -> list[str]:
    if feeds:
        return list(feeds)
    urls = list(settings.feeds)
    if settings.feeds_file is not None:
        urls += read_feed_list(settings.feeds_file.read_text(encoding="utf-8"))
    return list(dict.fromkeys(urls))


def harvest(
    ctx: PipelineContext,
    *,
    sources: Sequence[str] | None,
    feeds: Sequence[str] | None,
    generate: bool = False,
    limit_per_source: int = 500,
) -> HarvestReport:
    """Harvest open questions from `sources` and articles from `feeds` (default: settings)
    as of `ctx.as_of`. With `generate`, binary questions are generated from the newly
    stored articles."""
    engine, now = ctx.engine, ctx.as_of
    report = HarvestReport()
    problems = Problems(ctx.run_key, "harvest")
    with SourceClient(ctx.http) as client:
        for name in sources or ():
            try:
                source = SourceName(name)
            except ValueError:
                known = ", ".join(s.value for s in SourceName)
                problems.add(
                    name, "unknown_source", f"unknown source (known: {known}, {GENERATED_SOURCE})"
                )
                report.sources[name] = SourceStatus.FAILED
                continue
            try:
                result = SOURCES[source].harvest_open(
                    client,
                    ctx.source_base_url(source),
                    now=now,
                    limit=limit_per_source,
                    token=ctx.source_token(source),
                )
            except Exception as error:  # one broken source must not stop the others
                problems.add(name, "source_failed", f"{type(error).__name__}: {error}")
                report.sources[name] = SourceStatus.FAILED
                continue
            with session_scope(engine) as session:
                counts = upsert_questions(session, result.questions)
            report.questions_new += counts.inserted
            report.questions_seen += len(result.questions)
            report.per_source[name] = Counter(result.counts) + Counter(new=counts.inserted)
            for error in result.errors:
                problems.add(name, "item_error", error)
            report.sources[name] = (
                SourceStatus.FAILED
                if result.counts["pages"] == 0
                else SourceStatus.PARTIAL
                if result.errors
                else SourceStatus.OK
            )

        urls = configured_feeds(ctx.settings, feeds)
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
    report.sources[GENERATED_SOURCE] = _feeds_status(results)
    return new_articles


def _feeds_status(results: Sequence[FeedResult]) -> SourceStatus:
    """The feeds as one source: failed when none answered, partial when some feed or entry
    failed. A feed failed when it reported errors and gave neither articles nor a 304."""
    failed = [r for r in results if r.errors and not r.articles and not r.not_modified]
    if results and len(failed) == len(results):
        return SourceStatus.FAILED
    return SourceStatus.PARTIAL if any(r.errors for r in results) else SourceStatus.OK
