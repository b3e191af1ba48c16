"""Resolve: ask each open question's source for its outcome once the question is past its
close, and record outcome revisions; a person's verdict through `resolve --manual`.

Each source fails alone (recorded as a pipeline event; the others go on). Outcomes only add a
revision when the resolution changed, so re-running is idempotent.

Decisions: a Manifold MKT resolution of a binary question (a probability, not 0/1) is stored
as annulled, since binary rewards and calibration metrics need a 0/1 outcome (a choice
question's outcome is the option index, a numeric one's the number); a resolution the source
marks as not final (Kalshi `determined`) is not recorded until it is final. Generated questions have
no platform to ask: they are resolved by the LLM judge when one is configured, and otherwise
counted as waiting for `futureworld resolve --manual`. Imported sets (forecastbench:*)
resolve through their importer.

Each platform asked is judged (SourceStatus): `failed` when it raised or every id it was asked
about failed, `partial` when some ids failed (one market's redirect loop, bad gzip or deeply
nested body fails only that market). A manual verdict on a question id that does not exist is
refused with UnknownQuestion before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from flows.context import PipelineContext
from flows.stages.problems import Problems, SourceStatus, source_verdict
from futureworld.domain import Outcome, OutcomeStatus, Question, QuestionKind
from futureworld.sources.base import SourceResolution
from futureworld.sources.http import SourceClient
from futureworld.sources.platforms import SOURCES, SourceName
from futureworld.sources.question_gen import GENERATED_SOURCE
from futureworld.sources.question_judge import judge_question, verdict_to_resolution
from storage.engine import session_scope
from storage.repositories.articles import articles_between
from storage.repositories.questions import (
    list_questions,
    questions_due_for_resolution,
    record_outcomes,
)


class ManualVerdict(StrEnum):
    """A person's resolution of a question."""

    YES = "yes"
    NO = "no"
    ANNUL = "annul"


class UnknownQuestion(LookupError):
    """A question id that is not in the store."""


@dataclass
class ResolveReport:
    checked: int = 0
    outcomes_recorded: int = 0
    annulled: int = 0
    needs_manual: int = 0
    errors: list[str] = field(default_factory=list)
    sources: dict[str, SourceStatus] = field(default_factory=dict)
    """How each platform asked went."""

    @property
    def verdict(self) -> str | None:
        """One line when a source failed or was partial; None when all went well."""
        return source_verdict(self.sources)


def resolve(ctx: PipelineContext, *, question_ids: Sequence[int] | None = None) -> ResolveReport:
    """Ask each question's source for the outcome of every open question past its close as
    of `ctx.as_of` (only `question_ids`, when given: a timer's one question).

    Generated questions go to `ctx.judge` with the articles published after their close;
    without a judge, or when the judge is unsure, they are counted as waiting for manual
    resolution and the verdict is kept as an event.
    """
    engine, now = ctx.engine, ctx.as_of
    report = ResolveReport()
    problems = Problems(ctx.run_key, "resolve")
    with session_scope(engine) as session:
        due = questions_due_for_resolution(session, now)
    if question_ids is not None:
        wanted = set(question_ids)
        due = [q for q in due if q.id in wanted]
    report.checked = len(due)
    by_source: dict[str, list[Question]] = {}
    for question in due:
        by_source.setdefault(question.source, []).append(question)
    outcomes: list[Outcome] = []
    with SourceClient(ctx.http) as client:
        for name, questions in sorted(by_source.items()):
            if name == GENERATED_SOURCE:
                outcomes += _judge_generated(ctx, questions, report, problems)
                continue
            try:
                source = SourceName(name)
            except ValueError:
                continue  # imported sets (forecastbench:*) resolve through their importer
            try:
                result = SOURCES[source].fetch_resolutions(
                    client,
                    ctx.source_base_url(source),
                    [q.external_id for q in questions],
                    now=now,
                    token=ctx.source_token(source),
                )
            except Exception as error:  # one broken source must not stop the others
                problems.add(name, "source_failed", f"{type(error).__name__}: {error}")
                report.sources[name] = SourceStatus.FAILED
                continue
            for error in result.errors:
                problems.add(name, "item_error", error)
            asked = len({q.external_id for q in questions})
            report.sources[name] = (
                SourceStatus.FAILED
                if result.errors and not result.resolutions and len(result.errors) >= asked
                else SourceStatus.PARTIAL
                if result.errors
                else SourceStatus.OK
            )
            ids = {q.external_id: q.id for q in questions}
            kinds = {q.external_id: q.kind for q in questions}
            outcomes += [
                _outcome(ids[r.external_id], r, kinds[r.external_id])
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
    ctx: PipelineContext,
    questions: Sequence[Question],
    report: ResolveReport,
    problems: Problems,
) -> list[Outcome]:
    judge, now = ctx.judge, ctx.as_of
    if judge is None:
        report.needs_manual += len(questions)
        return []
    outcomes = []
    for question in questions:
        with session_scope(ctx.engine) as session:
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


def _outcome(
    question_id: int, resolution: SourceResolution, kind: QuestionKind = QuestionKind.BINARY
) -> Outcome:
    """The outcome to record; only a binary question needs a 0/1 value (choice questions store
    the option index, numeric ones the number)."""
    value = resolution.value
    binary = kind is QuestionKind.BINARY
    if binary and resolution.status is OutcomeStatus.RESOLVED and value not in (0.0, 1.0):
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


_MANUAL: dict[ManualVerdict, tuple[OutcomeStatus, float | None]] = {
    ManualVerdict.YES: (OutcomeStatus.RESOLVED, 1.0),
    ManualVerdict.NO: (OutcomeStatus.RESOLVED, 0.0),
    ManualVerdict.ANNUL: (OutcomeStatus.ANNULLED, None),
}


def resolve_manually(
    ctx: PipelineContext, question_id: int, verdict: ManualVerdict
) -> Outcome | None:
    """Record a person's resolution as of `ctx.as_of`; None when it changes nothing.

    Raises UnknownQuestion when no question has this id."""
    status, value = _MANUAL[ManualVerdict(verdict)]
    now = ctx.as_of
    with session_scope(ctx.engine) as session:
        if not list_questions(session, ids=[question_id]):
            raise UnknownQuestion(f"no question has id {question_id}")
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
