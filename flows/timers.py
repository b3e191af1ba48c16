"""Per-question resolution timers (apscheduler 3): a check at each open question's close and
resolve-by time, so outcomes are recorded (and rewards backfilled) when they happen rather
than at the next daily cycle. Jobs live in the project's own database, survive restarts,
and missed ones run on start within a grace period. The daily cycle stays the safety net.

Nothing in a stored job can run code or leak a secret. apscheduler's SQL job store pickles
each job (its function reference and arguments), so whoever can write the job table could run
code in the scheduler. `TimerJobStore` keeps the same table but stores each job as a small
JSON document, the question id, the check kind and its times, and reads a row back only as a
call of `check_resolution(question_id)`: a pickle, a foreign function or a malformed document
is dropped with one warning line (no traceback), never executed. The database URL is not in
the job: the check reads it from the environment (FW_DB_URL) of the process running the
timers."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from apscheduler.job import Job
from apscheduler.jobstores.base import ConflictingIdError, JobLookupError
from apscheduler.jobstores.memory import MemoryJobStore
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.util import datetime_to_utc_timestamp
from sqlalchemy import Engine, and_, select
from sqlalchemy.exc import IntegrityError

from flows.context import open_context
from flows.stages.backfilling import backfill_rewards
from flows.stages.resolving import resolve
from futureworld.domain import Question, QuestionStatus
from storage.engine import make_engine, session_scope
from storage.repositories.questions import list_questions

log = logging.getLogger(__name__)

JOB_TABLE = "resolution_timer_jobs"
"""The timers' job table, in the same database as everything else (rows are JSON)."""
MISFIRE_GRACE_S = 12 * 3600
"""A check missed while the scheduler was down still runs on start if at most this late."""
REFRESH_INTERVAL_S = 1800
"""How often the scheduler looks for newly harvested questions to time."""
CHECK_KINDS = ("close", "resolve-by")
CHECK_REF = "flows.timers:check_resolution"
"""The one function a stored timer job may call."""
_DOCUMENT_KEYS = frozenset({"question_id", "kind", "run_at", "next_run_at"})


class TimerJobStore(SQLAlchemyJobStore):
    """apscheduler's SQL job store holding only resolution checks, each row a JSON document
    `{"question_id", "kind", "run_at", "next_run_at"}`; nothing is pickled or unpickled."""

    def __init__(self, engine: Engine, *, misfire_grace_s: int = MISFIRE_GRACE_S) -> None:
        super().__init__(engine=engine, tablename=JOB_TABLE)
        self.misfire_grace_s = misfire_grace_s

    # apscheduler's own add_job/update_job pickle `job.__getstate__()`; these replace them
    # whole, so no row is ever written as a pickle.
    def add_job(self, job: Job) -> None:
        insert = self.jobs_t.insert().values(id=job.id, **self._row(job))
        with self.engine.begin() as connection:
            try:
                connection.execute(insert)
            except IntegrityError:
                raise ConflictingIdError(job.id) from None

    def update_job(self, job: Job) -> None:
        update = self.jobs_t.update().values(**self._row(job)).where(self.jobs_t.c.id == job.id)
        with self.engine.begin() as connection:
            if connection.execute(update).rowcount == 0:
                raise JobLookupError(job.id)

    def lookup_job(self, job_id: str) -> Job | None:
        try:
            return super().lookup_job(job_id)
        except ValueError as error:
            log.warning("timer job %s is unreadable and ignored: %s", job_id, error)
            return None

    def _get_jobs(self, *conditions: Any) -> list[Job]:
        """apscheduler's own loop (the rows in run order; the unreadable ones deleted), with
        one warning line for each row it removes instead of a traceback."""
        jobs: list[Job] = []
        query = select(self.jobs_t.c.id, self.jobs_t.c.job_state).order_by(
            self.jobs_t.c.next_run_time
        )
        query = query.where(and_(*conditions)) if conditions else query
        unreadable: list[str] = []
        with self.engine.begin() as connection:
            for row in connection.execute(query):
                try:
                    jobs.append(self._reconstitute_job(row.job_state))
                except Exception as error:
                    reason = " ".join(str(error).split()) or type(error).__name__
                    log.warning("timer job %s is unreadable and removed: %s", row.id, reason)
                    unreadable.append(row.id)
            if unreadable:
                connection.execute(self.jobs_t.delete().where(self.jobs_t.c.id.in_(unreadable)))
        return jobs

    @staticmethod
    def _check(job: Job) -> None:
        if (
            job.func_ref != CHECK_REF
            or not isinstance(job.trigger, DateTrigger)
            or job.kwargs
            or len(job.args) != 1
            or not _is_question_id(job.args[0])
        ):
            raise ValueError(
                f"job {job.id}: the timer store holds only {CHECK_REF}(question_id) at a date"
            )

    def _document(self, job: Job) -> bytes:
        question_id = job.args[0]
        kind = job.id.removeprefix(f"resolve-{question_id}-")
        return json.dumps(
            {
                "question_id": question_id,
                "kind": kind,
                "run_at": job.trigger.run_date.astimezone(UTC).isoformat(),
                "next_run_at": None
                if job.next_run_time is None
                else job.next_run_time.astimezone(UTC).isoformat(),
            }
        ).encode("utf-8")

    def _reconstitute_job(self, job_state: bytes) -> Job:
        """A stored row back as a job; ValueError (and nothing run) for anything else."""
        try:
            document = json.loads(bytes(job_state).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise ValueError(f"not a timer document ({type(error).__name__})") from None
        if not isinstance(document, dict) or set(document) != _DOCUMENT_KEYS:
            raise ValueError(f"not a timer document: {str(document)[:120]}")
        question_id, kind = document["question_id"], document["kind"]
        if not _is_question_id(question_id) or kind not in CHECK_KINDS:
            raise ValueError(f"not a resolution check: {str(document)[:120]}")
        run_at = _utc(document["run_at"])
        next_run_at = document["next_run_at"]
        job = Job.__new__(Job)
        job.__setstate__(
            {
                "version": 1,
                "id": job_id(question_id, kind),
                "func": CHECK_REF,
                "trigger": DateTrigger(run_date=run_at, timezone=UTC),
                "executor": "default",
                "args": (question_id,),
                "kwargs": {},
                "name": f"resolution check {kind} q{question_id}",
                "misfire_grace_time": self.misfire_grace_s,
                "coalesce": True,
                "max_instances": 1,
                "next_run_time": None if next_run_at is None else _utc(next_run_at),
            }
        )
        job._scheduler = self._scheduler
        job._jobstore_alias = self._alias
        return job

    def _row(self, job: Job) -> dict[str, Any]:
        self._check(job)
        return {
            "next_run_time": datetime_to_utc_timestamp(job.next_run_time),
            "job_state": self._document(job),
        }


def _is_question_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _utc(value: Any) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"time {value!r} is not an ISO string")
    parsed = datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"time {value!r} has no timezone")
    return parsed.astimezone(UTC)


def make_scheduler(
    db_url: str, *, blocking: bool = False, misfire_grace_s: int = MISFIRE_GRACE_S
) -> BaseScheduler:
    """A scheduler whose persistent jobs live in `db_url` (for SQLite: the same file).

    A `memory` job store holds non-persistent jobs (the refresh job holds the scheduler).
    """
    cls = BlockingScheduler if blocking else BackgroundScheduler
    return cls(
        jobstores={
            "default": TimerJobStore(make_engine(db_url), misfire_grace_s=misfire_grace_s),
            "memory": MemoryJobStore(),
        },
        job_defaults={"misfire_grace_time": misfire_grace_s, "coalesce": True, "max_instances": 1},
        timezone=UTC,
    )


def job_id(question_id: int, kind: str) -> str:
    return f"resolve-{question_id}-{kind}"


def check_resolution(question_id: int) -> None:
    """The timer job (CHECK_REF): ask the question's source for its outcome, then backfill
    the rewards it unlocks, through the same stages as the daily cycle, on the database of
    this process's settings (FW_DB_URL)."""
    now = datetime.now(UTC)
    with open_context(as_of=now, run_key=f"timer-{now.date()}") as ctx:
        report = resolve(ctx, question_ids=[question_id])
        backfill = backfill_rewards(ctx)
    log.info(
        "question %d: %d outcomes recorded, %d rewards written; errors: %s",
        question_id,
        report.outcomes_recorded,
        backfill.rewards_inserted,
        report.errors or "none",
    )


def schedule_check(scheduler: BaseScheduler, question_id: int, kind: str, run_at: datetime) -> str:
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
        args=[question_id],
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
                scheduled.append(schedule_check(scheduler, question.id, kind, at))
    return scheduled


def schedule_open_questions(scheduler: BaseScheduler, engine: Engine) -> int:
    """Time every open question in the store (run at start and every REFRESH_INTERVAL_S)."""
    with session_scope(engine) as session:
        questions = list_questions(session, status=QuestionStatus.OPEN)
    return len(schedule_resolution_checks(scheduler, questions))


def start_timers(scheduler: BaseScheduler, engine: Engine) -> None:
    """Time the open questions, keep doing so as new ones arrive, and start the scheduler
    (a BlockingScheduler blocks here until shut down)."""
    scheduler.add_job(
        schedule_open_questions,
        trigger="interval",
        seconds=REFRESH_INTERVAL_S,
        args=[scheduler, engine],
        id="refresh-resolution-timers",
        jobstore="memory",
        replace_existing=True,
        next_run_time=datetime.now(UTC),
    )
    scheduler.start()
