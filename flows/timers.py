"""Per-question resolution timers (apscheduler 3): a check at each open question's close and
resolve-by time, so outcomes are recorded (and rewards backfilled) when they happen rather
than at the next daily cycle. Jobs live in the project's own database, survive restarts,
and missed ones run on start within a grace period. The daily cycle stays the safety net."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from sqlalchemy import Engine

from flows.context import open_context
from flows.stages.backfilling import backfill_rewards
from flows.stages.resolving import resolve
from futureworld.domain import Question, QuestionStatus
from storage.engine import make_engine, session_scope
from storage.repositories.questions import list_questions

log = logging.getLogger(__name__)

JOB_TABLE = "resolution_timer_jobs"
"""apscheduler's job table, in the same database as everything else."""
MISFIRE_GRACE_S = 12 * 3600
"""A check missed while the scheduler was down still runs on start if at most this late."""
REFRESH_INTERVAL_S = 1800
"""How often the scheduler looks for newly harvested questions to time."""
CHECK_KINDS = ("close", "resolve-by")


def make_scheduler(
    db_url: str, *, blocking: bool = False, misfire_grace_s: int = MISFIRE_GRACE_S
) -> BaseScheduler:
    """A scheduler whose persistent jobs live in `db_url` (for SQLite: the same file).

    A `memory` job store holds non-persistent jobs (the refresh job holds the scheduler).
    """
    cls = BlockingScheduler if blocking else BackgroundScheduler
    return cls(
        jobstores={
            "default": SQLAlchemyJobStore(engine=make_engine(db_url), tablename=JOB_TABLE),
            "memory": MemoryJobStore(),
        },
        job_defaults={"misfire_grace_time": misfire_grace_s, "coalesce": True, "max_instances": 1},
        timezone=UTC,
    )


def job_id(question_id: int, kind: str) -> str:
    return f"resolve-{question_id}-{kind}"


def check_resolution(question_id: int, db_url: str | None = None) -> None:
    """The timer job (a module-level function, so the stored job is a picklable reference):
    ask the question's source for its outcome, then backfill the rewards it unlocks, through
    the same stages as the daily cycle."""
    now = datetime.now(UTC)
    with open_context(db_url=db_url, as_of=now, run_key=f"timer-{now.date()}") as ctx:
        report = resolve(ctx, question_ids=[question_id])
        backfill = backfill_rewards(ctx)
    log.info(
        "question %d: %d outcomes recorded, %d rewards written; errors: %s",
        question_id,
        report.outcomes_recorded,
        backfill.rewards_inserted,
        report.errors or "none",
    )


def schedule_check(
    scheduler: BaseScheduler, question_id: int, kind: str, run_at: datetime, db_url: str
) -> str:
    """Add (or move) one question's check; the job id makes it idempotent."""
    if kind not in CHECK_KINDS:
        raise ValueError(f"unknown check kind {kind!r} (known: {', '.join(CHECK_KINDS)})")
    if run_at.tzinfo is None:
        raise ValueError(f"question {question_id}: {kind} time {run_at} has no timezone")
    ident = job_id(question_id, kind)
    scheduler.add_job(
        check_resolution,
        trigger="date",
        run_date=run_at.astimezone(UTC),
        args=[question_id, db_url],
        id=ident,
        name=f"resolution check {kind} q{question_id}",
        replace_existing=True,
        jobstore="default",
    )
    return ident


def schedule_resolution_checks(
    scheduler: BaseScheduler,
    questions: Iterable[Question],
    *,
    db_url: str,
    now: datetime | None = None,
    misfire_grace_s: int = MISFIRE_GRACE_S,
) -> list[str]:
    """Schedule a check at each open question's close and resolve-by time.

    Times further in the past than the grace period are left to the daily cycle. Calling
    this again replaces jobs instead of adding duplicates. Returns the scheduled job ids.
    """
    now = now or datetime.now(UTC)
    oldest = now - timedelta(seconds=misfire_grace_s)
    scheduled: list[str] = []
    for question in questions:
        if question.id is None or question.status is not QuestionStatus.OPEN:
            continue
        for kind, at in (("close", question.close_at), ("resolve-by", question.resolve_by)):
            if at is not None and at >= oldest:
                scheduled.append(schedule_check(scheduler, question.id, kind, at, db_url))
    return scheduled


def schedule_open_questions(scheduler: BaseScheduler, engine: Engine, db_url: str) -> int:
    """Time every open question in the store (run at start and every REFRESH_INTERVAL_S)."""
    with session_scope(engine) as session:
        questions = list_questions(session, status=QuestionStatus.OPEN)
    return len(schedule_resolution_checks(scheduler, questions, db_url=db_url))


def start_timers(scheduler: BaseScheduler, engine: Engine, db_url: str) -> None:
    """Time the open questions, keep doing so as new ones arrive, and start the scheduler
    (a BlockingScheduler blocks here until shut down)."""
    scheduler.add_job(
        schedule_open_questions,
        trigger="interval",
        seconds=REFRESH_INTERVAL_S,
        args=[scheduler, engine, db_url],
        id="refresh-resolution-timers",
        jobstore="memory",
        replace_existing=True,
        next_run_time=datetime.now(UTC),
    )
    scheduler.start()
