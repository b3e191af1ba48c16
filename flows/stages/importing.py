"""Import ForecastBench question sets (and their resolution sets) into the store: one round,
or a folder of rounds.

Both files of a round are parsed completely before anything is written, and each file is
written in one transaction, so a bad file leaves nothing half-written. Re-importing changes
nothing; an updated resolution set whose value changed adds a new outcome revision.

A folder holds question sets (`{"questions": …}`) and resolution sets (`{"resolutions":
…}`) under any names (upstream: `YYYY-MM-DD-llm.json`, `YYYY-MM-DD_resolution_set.json`);
each resolution set is paired with the question set whose `question_set` name it carries.
Rounds are imported oldest due date first. A round that fails (a bad file, a resolution set of
no question set in the folder) is reported by name and the other rounds still import. A
market question posed in several rounds becomes one question per round, with that round's
cut-off and crowd value (futureworld.sources.forecastbench).

A round named by the caller (`round`, the forecast due date) is checked: a question set or
resolution set of another round is refused before anything is written, and from a folder only
that round is imported. The files always name their round (the parser requires
forecast_due_date: it is the prefix of every imported question's external id).

A news archive (JSONL or CSV, futureworld.sources.article_archive) is imported into the corpus
in one transaction, its articles visible at their stated publication time; a refused row is
reported by line and field and the other rows load; a re-import stores nothing new (articles
are deduplicated by guid and by link). The import time is the context's instant (`as_of`).

Progress (`on_progress(done, total)`): questions or articles written of the file's total, in
chunks of WRITE_CHUNK inside the file's one transaction; rounds imported of a folder's total.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, TypeVar

from flows.context import PipelineContext
from futureworld.domain import Outcome
from futureworld.sources.article_archive import (
    ArchiveFormatError,
    parse_article_archive,
)
from futureworld.sources.forecastbench import (
    ForecastBenchFormatError,
    parse_question_set,
    parse_resolution_set,
)
from futureworld.sources.forecastbench_outcomes import match_resolutions
from storage.engine import session_scope
from storage.repositories.articles import Visibility, insert_articles
from storage.repositories.questions import (
    question_ids,
    record_outcomes,
    round_question_ids,
    upsert_questions,
)

R = TypeVar("R")
ImportProgress = Callable[[int, int], None]
"""on_progress(done, total): after each chunk written (or each round of a folder)."""
WRITE_CHUNK = 500
"""Rows a write statement holds (the repositories' own chunk): the step of an import's
progress."""


def _written_in_chunks(
    items: Sequence[Any],
    write: Callable[[Sequence[Any]], R],
    on_progress: ImportProgress | None,
) -> list[R]:
    """`write` of each WRITE_CHUNK of `items` in turn (all inside the caller's transaction),
    reporting the items written so far of all of them."""
    results = []
    for start in range(0, len(items), WRITE_CHUNK):
        results.append(write(items[start : start + WRITE_CHUNK]))
        if on_progress is not None:
            on_progress(min(start + WRITE_CHUNK, len(items)), len(items))
    return results


@dataclass(frozen=True)
class ImportReport:
    questions_inserted: int
    questions_existing: int
    outcomes_recorded: int
    annulled: int
    still_open: int
    skipped: Counter[str] = field(default_factory=Counter)


def read_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ForecastBenchFormatError(f"{path}: file not found") from None
    except UnicodeDecodeError as error:
        raise ForecastBenchFormatError(f"{path}: not UTF-8 text ({error})") from None


def import_forecastbench(
    ctx: PipelineContext,
    question_set: Path,
    resolution_set: Path | None = None,
    *,
    round: date | None = None,
    on_progress: ImportProgress | None = None,
) -> ImportReport:
    """Import one question set, and its resolution set when given; with `round`, both must be
    of that round (ForecastBenchFormatError otherwise, nothing written). `on_progress` hears
    of the questions written of the set's total."""
    engine = ctx.engine
    questions = parse_question_set(read_file(question_set), str(question_set))
    resolutions = (
        parse_resolution_set(read_file(resolution_set), str(resolution_set))
        if resolution_set is not None
        else None
    )
    for path, parsed in ((question_set, questions), (resolution_set, resolutions)):
        if round is not None and parsed is not None and parsed.forecast_due_date != round:
            raise ForecastBenchFormatError(
                f"{path}: its forecast_due_date is {parsed.forecast_due_date}, not --round {round}"
            )
    skipped = Counter(questions.skipped)
    with session_scope(engine) as session:
        parts = _written_in_chunks(
            questions.questions, lambda chunk: upsert_questions(session, chunk), on_progress
        )
    inserted = sum(part.inserted for part in parts)
    existing = sum(part.existing for part in parts)
    if resolutions is None:
        return ImportReport(inserted, existing, 0, 0, len(questions.questions), skipped)

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
        questions_inserted=inserted,
        questions_existing=existing,
        outcomes_recorded=len(recorded),
        annulled=annulled,
        still_open=len(questions.questions) - len(matches),
        skipped=skipped,
    )


def check_round(ctx: PipelineContext, round: date | None) -> None:
    """Raise UnknownRound (storage.repositories.questions) unless `round` is None or has stored
    questions: what an entrance checks before it starts a command's work."""
    if round is not None:
        with session_scope(ctx.engine) as session:
            round_question_ids(session, round)


@dataclass(frozen=True)
class RoundFiles:
    due: str
    """The round's forecast due date (YYYY-MM-DD), from the question set."""
    question_set: Path
    resolution_set: Path | None


@dataclass(frozen=True)
class HistoryReport:
    rounds: list[tuple[RoundFiles, ImportReport]]
    """The rounds imported, oldest first."""
    errors: list[str] = field(default_factory=list)
    """One line per round or file that could not be imported, naming it."""


def _kind_of(path: Path) -> tuple[str, str, str] | None:
    """("questions" | "resolutions", question_set name, due date) of a ForecastBench file,
    or None when it is not one (read by the parser later; this only sorts the folder)."""
    try:
        document = json.loads(read_file(path))
    except (json.JSONDecodeError, RecursionError):
        raise ForecastBenchFormatError(f"{path}: not valid JSON") from None
    if not isinstance(document, dict):
        return None
    for key in ("questions", "resolutions"):
        if key in document:
            name, due = document.get("question_set"), document.get("forecast_due_date")
            if not isinstance(name, str) or not isinstance(due, str):
                raise ForecastBenchFormatError(
                    f"{path}: needs string fields 'question_set' and 'forecast_due_date'"
                )
            return key, name, due
    return None


def find_rounds(folder: Path) -> tuple[list[RoundFiles], list[str]]:
    """The rounds in a folder (its *.json files, not recursive), oldest due date first, and an
    error line per file that is not part of a round."""
    questions: dict[str, tuple[str, Path]] = {}
    resolutions: dict[str, Path] = {}
    errors: list[str] = []
    for path in sorted(folder.glob("*.json")):
        try:
            kind = _kind_of(path)
        except ForecastBenchFormatError as error:
            errors.append(str(error))
            continue
        if kind is None:
            errors.append(f"{path}: neither a question set nor a resolution set; skipped")
            continue
        key, name, due = kind
        target = questions if key == "questions" else resolutions
        if name in target:
            errors.append(f"{path}: a second {key} file for question set {name!r}; skipped")
            continue
        if key == "questions":
            questions[name] = (due, path)
        else:
            resolutions[name] = path
    for name, path in sorted(resolutions.items()):
        if name not in questions:
            errors.append(f"{path}: resolution set of {name!r}, which is not in {folder}; skipped")
    rounds = [
        RoundFiles(due=due, question_set=path, resolution_set=resolutions.get(name))
        for name, (due, path) in questions.items()
    ]
    return sorted(rounds, key=lambda r: (r.due, r.question_set.name)), errors


def import_forecastbench_folder(
    ctx: PipelineContext,
    folder: Path,
    *,
    round: date | None = None,
    on_progress: ImportProgress | None = None,
) -> HistoryReport:
    """Import every round in `folder` (only `round` when given), idempotently; a failing round
    is reported, the others import. `on_progress` hears of the rounds done (imported or
    failed) of the folder's total."""
    if not folder.is_dir():
        raise ForecastBenchFormatError(f"{folder}: not a folder")
    rounds, errors = find_rounds(folder)
    if not rounds and not errors:
        raise ForecastBenchFormatError(f"{folder}: no ForecastBench question set (*.json) in it")
    if round is not None:
        found = sorted({r.due for r in rounds})
        rounds = [r for r in rounds if r.due[:10] == round.isoformat()]
        if not rounds:
            raise ForecastBenchFormatError(
                f"{folder}: no question set of round {round} in it (rounds: "
                f"{', '.join(found) or 'none'})"
            )
    imported: list[tuple[RoundFiles, ImportReport]] = []
    for done, files in enumerate(rounds, start=1):
        try:
            report = import_forecastbench(ctx, files.question_set, files.resolution_set)
        except (ForecastBenchFormatError, ValueError) as error:
            errors.append(f"round {files.due} ({files.question_set.name}): {error}")
        else:
            imported.append((files, report))
        if on_progress is not None:
            on_progress(done, len(rounds))
    return HistoryReport(rounds=imported, errors=errors)


@dataclass(frozen=True)
class ArticleImportReport:
    rows: int
    inserted: int
    """Articles stored by this import."""
    existing: int
    """Valid rows whose article (by guid or link) was already stored, or repeated in the file."""
    errors: list[str] = field(default_factory=list)
    """One line per refused row: the file, its line number, the field and what was wrong."""


def import_articles(
    ctx: PipelineContext, archive: Path, *, on_progress: ImportProgress | None = None
) -> ArticleImportReport:
    """Load a news archive into the corpus, visible at the stated publication times;
    `on_progress` hears of the valid rows written of the file's total."""
    try:
        text = archive.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArchiveFormatError(f"{archive}: file not found") from None
    except UnicodeDecodeError as error:
        raise ArchiveFormatError(f"{archive}: not UTF-8 text ({error})") from None
    parsed = parse_article_archive(text, str(archive), imported_at=ctx.as_of)
    with session_scope(ctx.engine) as session:
        inserted = sum(
            _written_in_chunks(
                parsed.articles,
                lambda chunk: insert_articles(session, chunk, visibility=Visibility.STATED),
                on_progress,
            )
        )
    return ArticleImportReport(
        rows=parsed.counts["rows"],
        inserted=inserted,
        existing=parsed.counts["rows"] - parsed.counts["refused"] - inserted,
        errors=parsed.errors,
    )
