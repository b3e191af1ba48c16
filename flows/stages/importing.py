"""Import a ForecastBench question set (and optionally its resolution set) into the store.

Both files are parsed completely before anything is written, and each file is written in one
transaction, so a bad file leaves nothing half-written. Re-importing changes nothing; an
updated resolution set whose value changed adds a new outcome revision.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from flows.context import PipelineContext
from futureworld.domain import Outcome
from futureworld.sources.forecastbench import (
    ForecastBenchFormatError,
    parse_question_set,
    parse_resolution_set,
)
from futureworld.sources.forecastbench_outcomes import match_resolutions
from storage.engine import session_scope
from storage.repositories.questions import question_ids, record_outcomes, upsert_questions


@dataclass(frozen=True)
class ImportReport:
    questions_inserted: int
    questions_existing: int
    outcomes_recorded: int
    annulled: int
    still_open: int
    skipped: Counter[str] = field(default_factory=Counter)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ForecastBenchFormatError(f"{path}: file not found") from None
    except UnicodeDecodeError as error:
        raise ForecastBenchFormatError(f"{path}: not UTF-8 text ({error})") from None


def import_forecastbench(
    ctx: PipelineContext, question_set: Path, resolution_set: Path | None = None
) -> ImportReport:
    """Import one question set, and its resolution set when given."""
    engine = ctx.engine
    questions = parse_question_set(_read(question_set), str(question_set))
    resolutions = (
        parse_resolution_set(_read(resolution_set), str(resolution_set))
        if resolution_set is not None
        else None
    )
    skipped = Counter(questions.skipped)
    with session_scope(engine) as session:
        counts = upsert_questions(session, questions.questions)
    if resolutions is None:
        return ImportReport(
            counts.inserted, counts.existing, 0, 0, len(questions.questions), skipped
        )

    skipped.update(resolutions.skipped)
    matches = match_resolutions(questions.questions, resolutions.rows)
    with session_scope(engine) as session:
        ids = question_ids(session, {(q.source, q.external_id) for q in questions.questions})
        outcomes = [
            Outcome(
                question_id=ids[(m.source, m.external_id)],
                revision=0,
                status=m.status,
                value=m.value,
                resolved_at=m.resolved_at,
                raw=m.raw,
            )
            for m in matches
        ]
        recorded = record_outcomes(session, outcomes)
    annulled = sum(1 for m in matches if m.value is None)
    return ImportReport(
        questions_inserted=counts.inserted,
        questions_existing=counts.existing,
        outcomes_recorded=len(recorded),
        annulled=annulled,
        still_open=len(questions.questions) - len(matches),
        skipped=skipped,
    )
