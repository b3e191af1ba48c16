"""Questions and their outcome revisions: idempotent upserts keyed by (source, external_id)
and (question, revision), and the one definition of time shared by predict, backtest,
evaluation and replay.

Time (ARCHITECTURE §7): an outcome revision is *revealed* at T when its resolved_at <= T. A
question is *open* at T when it was posed by T (created_at <= T and info_cutoff_at <= T), has
not closed before T (close_at is None or > T), and has no revealed outcome revision. Its
*current outcome as of T* is its highest revealed revision. Without a T (`as_of=None`) every
stored revision counts, which is what live operation sees. The stored `status` column is a
convenience for live listings; openness never reads it, so a question imported together
with its resolution can still be forecast as of a date before that resolution.

Rounds: the questions of a ForecastBench round (the forecast due date of its question set)
are the imported questions whose external id starts with that date
(futureworld.sources.forecastbench.round_external_id); `round_question_ids` is the one
definition every command that takes `--round` uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import date, datetime
from types import SimpleNamespace
from typing import Any, cast

from sqlalchemy import ColumnElement, Subquery, exists, func, or_, select, update
from sqlalchemy.orm import Session, aliased

from futureworld.domain import (
    Outcome,
    OutcomeStatus,
    Question,
    QuestionKind,
    QuestionStatus,
    utc_now,
)
from storage.repositories._sql import insert_new
from storage.tables import OutcomeRow, QuestionRow


@dataclass(frozen=True)
class UpsertCount:
    inserted: int
    existing: int


def question_from_row(row: QuestionRow) -> Question:
    return Question(
        id=row.id,
        source=row.source,
        external_id=row.external_id,
        kind=QuestionKind(row.kind),
        title=row.title,
        background=row.background,
        resolution_criteria=row.resolution_criteria,
        url=row.url,
        domain=row.domain,
        created_at=row.created_at,
        info_cutoff_at=row.info_cutoff_at,
        close_at=row.close_at,
        resolve_by=row.resolve_by,
        status=QuestionStatus(row.status),
        crowd_probability=row.crowd_probability,
        options=tuple(row.options or ()),
        extra=dict(row.extra or {}),
    )


def _question_values(question: Question, now: datetime) -> dict[str, Any]:
    return {
        "source": question.source,
        "external_id": question.external_id,
        "kind": str(question.kind),
        "title": question.title,
        "background": question.background,
        "resolution_criteria": question.resolution_criteria,
        "url": question.url,
        "domain": question.domain,
        "created_at": question.created_at,
        "info_cutoff_at": question.info_cutoff_at,
        "close_at": question.close_at,
        "resolve_by": question.resolve_by,
        "status": str(question.status),
        "crowd_probability": question.crowd_probability,
        "options": list(question.options),
        "extra": question.extra,
        "harvested_at": now,
    }


def upsert_questions(session: Session, questions: Sequence[Question]) -> UpsertCount:
    """Insert new questions; an existing (source, external_id) keeps its first-harvest values
    (the crowd probability at harvest and the cut-off must not drift on re-harvest)."""
    if not questions:
        return UpsertCount(0, 0)
    now = utc_now()
    inserted = len(
        insert_new(
            session,
            QuestionRow,
            questions,
            lambda q: _question_values(q, now),
            chunk_size=500,
            returning=[QuestionRow.id],
            conflict_columns=["source", "external_id"],
        )
    )
    return UpsertCount(inserted, len(questions) - inserted)


def question_ids(session: Session, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """Map (source, external_id) → id for the given keys that exist."""
    wanted = set(keys)
    sources = {source for source, _ in wanted}
    rows = session.execute(
        select(QuestionRow.source, QuestionRow.external_id, QuestionRow.id).where(
            QuestionRow.source.in_(sources)
        )
    ).all()
    return {(s, e): i for s, e, i in rows if (s, e) in wanted}


def list_questions(
    session: Session,
    *,
    status: QuestionStatus | None = None,
    source: str | None = None,
    ids: Sequence[int] | None = None,
) -> list[Question]:
    # Core rows, not ORM instances: building the instances cost more than the query.
    statement = select(*QuestionRow.__table__.columns).order_by(QuestionRow.id)
    if status is not None:
        statement = statement.where(QuestionRow.status == str(status))
    if source is not None:
        statement = statement.where(QuestionRow.source == source)
    if ids is not None:
        statement = statement.where(QuestionRow.id.in_(list(ids)))
    rows = session.connection().execute(statement).mappings()
    return [question_from_row(cast(QuestionRow, SimpleNamespace(**row))) for row in rows]


FORECASTBENCH_SOURCE_PREFIX = "forecastbench:"
"""Question.source prefix of imported ForecastBench questions (futureworld.sources.forecastbench,
which storage does not import)."""


class UnknownRound(LookupError):
    """No stored question belongs to the round asked for; the message names the stored ones."""


def in_round(due: date) -> ColumnElement[bool]:
    """The condition "this question is one of ForecastBench round `due`" on QuestionRow: an
    imported question whose external id starts with the round's due date."""
    return QuestionRow.source.startswith(
        FORECASTBENCH_SOURCE_PREFIX, autoescape=True
    ) & QuestionRow.external_id.startswith(f"{due.isoformat()}/", autoescape=True)


def stored_rounds(session: Session) -> list[date]:
    """The ForecastBench rounds that have stored questions, oldest first."""
    prefix = func.substr(QuestionRow.external_id, 1, 10)
    rows = session.execute(
        select(prefix)
        .where(QuestionRow.source.startswith(FORECASTBENCH_SOURCE_PREFIX, autoescape=True))
        .distinct()
    ).scalars()
    rounds = set()
    for text in rows:
        try:
            rounds.add(date.fromisoformat(text))
        except ValueError:
            continue  # not a round-prefixed id
    return sorted(rounds)


def round_question_ids(session: Session, due: date) -> set[int]:
    """The ids of the questions of ForecastBench round `due` (`in_round`); UnknownRound when
    none is stored."""
    ids = set(session.scalars(select(QuestionRow.id).where(in_round(due))))
    if not ids:
        known = ", ".join(d.isoformat() for d in stored_rounds(session)) or "none"
        raise UnknownRound(
            f"round {due.isoformat()}: no question of it is stored (stored rounds: {known}); "
            "import its question set with `futureworld import forecastbench`"
        )
    return ids


def revealed_by(as_of: datetime | None) -> ColumnElement[bool] | None:
    """The condition "this outcome revision is known at `as_of`" (None: every revision)."""
    return None if as_of is None else OutcomeRow.resolved_at <= as_of


def is_open_at(as_of: datetime) -> ColumnElement[bool]:
    """The one definition of "open at `as_of`" as a condition on QuestionRow (see the module
    docstring); predict, backtest and every as-of query use it."""
    revealed = exists().where(
        OutcomeRow.question_id == QuestionRow.id, OutcomeRow.resolved_at <= as_of
    )
    return (
        (QuestionRow.created_at <= as_of)
        & (QuestionRow.info_cutoff_at <= as_of)
        & or_(QuestionRow.close_at.is_(None), QuestionRow.close_at > as_of)
        & ~revealed
    )


def open_questions_at(session: Session, as_of: datetime) -> list[Question]:
    """Questions open at `as_of`: posed by then, not closed before it, no outcome revealed by
    it (whatever their stored status says), oldest cut-off first."""
    statement = (
        select(QuestionRow)
        .where(is_open_at(as_of))
        .order_by(QuestionRow.info_cutoff_at, QuestionRow.id)
    )
    return [question_from_row(row) for row in session.scalars(statement)]


def questions_due_for_resolution(session: Session, now: datetime) -> list[Question]:
    """Open questions whose close or resolve-by time has passed (or that have neither)."""
    due = or_(
        QuestionRow.close_at <= now,
        QuestionRow.resolve_by <= now,
        (QuestionRow.close_at.is_(None) & QuestionRow.resolve_by.is_(None)),
    )
    statement = (
        select(QuestionRow)
        .where(QuestionRow.status == str(QuestionStatus.OPEN))
        .where(due)
        .order_by(QuestionRow.id)
    )
    return [question_from_row(row) for row in session.scalars(statement)]


def outcome_from_row(row: OutcomeRow) -> Outcome:
    return Outcome(
        id=row.id,
        question_id=row.question_id,
        revision=row.revision,
        status=OutcomeStatus(row.status),
        value=row.value,
        resolved_at=row.resolved_at,
        raw=dict(row.raw or {}),
    )


def current_outcomes(as_of: datetime | None = None) -> Subquery:
    """Each question's current outcome row (its highest revision revealed by `as_of`; every
    revision when None), as a subquery: the one definition of "current" that rewards, replay
    and evaluation all join against."""
    latest = select(OutcomeRow.question_id, func.max(OutcomeRow.revision).label("revision"))
    if (condition := revealed_by(as_of)) is not None:
        latest = latest.where(condition)
    latest = latest.group_by(OutcomeRow.question_id).subquery()
    return (
        select(OutcomeRow)
        .join(
            latest,
            (OutcomeRow.question_id == latest.c.question_id)
            & (OutcomeRow.revision == latest.c.revision),
        )
        .subquery("current_outcome")
    )


def latest_outcomes(
    session: Session, question_ids: Sequence[int] | None = None, *, as_of: datetime | None = None
) -> dict[int, Outcome]:
    """The current outcome revision (highest, revealed by `as_of` when given) of each question
    that has one."""
    current = aliased(OutcomeRow, current_outcomes(as_of))
    statement = select(current)
    if question_ids is not None:
        statement = statement.where(current.question_id.in_(list(question_ids)))
    return {row.question_id: outcome_from_row(row) for row in session.scalars(statement)}


def open_binary_questions(
    session: Session, *, as_of: datetime, limit: int | None
) -> list[Question]:
    """Binary questions posed and past their cut-off by `as_of` whose outcome is not revealed by
    then, the newest cut-off first, at most `limit` (None: all)."""
    revealed = current_outcomes(as_of)
    statement = (
        select(QuestionRow.id)
        .where(
            QuestionRow.kind == str(QuestionKind.BINARY),
            QuestionRow.created_at <= as_of,
            QuestionRow.info_cutoff_at <= as_of,
            ~exists().where(revealed.c.question_id == QuestionRow.id),
        )
        .order_by(QuestionRow.info_cutoff_at.desc(), QuestionRow.id.desc())
    )
    if limit is not None:
        statement = statement.limit(limit)
    ids = list(session.scalars(statement))
    by_id = {q.id: q for q in list_questions(session, ids=ids)} if ids else {}
    return [by_id[i] for i in ids]


def resolved_history(
    session: Session, *, as_of: datetime | None = None
) -> list[tuple[str, datetime, float]]:
    """(source, resolved_at, value) of every binary question currently resolved (as of `as_of`
    when given): what base rates are computed from (an option index or a number is no YES
    frequency)."""
    current = current_outcomes(as_of)
    rows = session.execute(
        select(QuestionRow.source, current.c.resolved_at, current.c.value)
        .join(current, current.c.question_id == QuestionRow.id)
        .where(current.c.status == str(OutcomeStatus.RESOLVED))
        .where(QuestionRow.kind == str(QuestionKind.BINARY))
        .order_by(current.c.resolved_at)
    ).all()
    return [(source, at, float(value)) for source, at, value in rows]


def record_outcomes(session: Session, outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Add each outcome as a new revision of its question if it differs from the current one.

    The `revision` of the given outcomes is ignored: the next revision is assigned here. An
    unchanged resolution is a no-op, so re-running a resolver or an importer never adds rows.
    Returns the outcomes that were recorded. The question's status follows its latest outcome.
    """
    current = latest_outcomes(session, sorted({o.question_id for o in outcomes}))
    recorded: list[Outcome] = []
    now = utc_now()
    for outcome in outcomes:
        previous = current.get(outcome.question_id)
        if (
            previous is not None
            and previous.status == outcome.status
            and previous.value == outcome.value
        ):
            continue
        revision = 1 if previous is None else previous.revision + 1
        row = OutcomeRow(
            question_id=outcome.question_id,
            revision=revision,
            status=str(outcome.status),
            value=outcome.value,
            resolved_at=outcome.resolved_at,
            raw=outcome.raw,
            recorded_at=now,
        )
        session.add(row)
        session.flush()
        new = replace(outcome, revision=revision, id=row.id)
        current[outcome.question_id] = new
        recorded.append(new)
    for status in (QuestionStatus.RESOLVED, QuestionStatus.ANNULLED):
        wanted = (
            OutcomeStatus.RESOLVED if status is QuestionStatus.RESOLVED else OutcomeStatus.ANNULLED
        )
        ids = [o.question_id for o in recorded if current[o.question_id].status == wanted]
        if ids:
            session.execute(
                update(QuestionRow).where(QuestionRow.id.in_(ids)).values(status=str(status))
            )
    return recorded


def count_rows(session: Session, table: Any) -> int:
    return int(session.scalar(select(func.count()).select_from(table)) or 0)
