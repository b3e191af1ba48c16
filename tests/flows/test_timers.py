"""Resolution timers on a real job store in the project's database (Postgres and SQLite):
jobs survive a scheduler restart, scheduling is idempotent, a check missed while the
scheduler was down runs on start and records the outcome from the served world, and the job
table holds JSON documents only: a crafted pickle row runs nothing."""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED
from sqlalchemy import text

from flows.context import build_context
from flows.settings import Settings
from flows.stages.harvesting import harvest
from flows.timers import (
    JOB_TABLE,
    check_resolution,
    job_id,
    make_scheduler,
    schedule_check,
    schedule_resolution_checks,
    start_timers,
)
from futureworld.domain import Question, QuestionStatus
from futureworld.world import SimClock, World, WorldConfig, serve_world
from storage.engine import session_scope
from storage.repositories.questions import latest_outcomes, list_questions, upsert_questions

NOW = datetime.now(UTC)


def _question(qid: int, close_in_h: float | None, resolve_in_h: float | None) -> Question:
    def at(hours: float | None) -> datetime | None:
        return None if hours is None else NOW + timedelta(hours=hours)

    return Question(
        id=qid or None,
        source="manifold",
        external_id=f"q{qid}-{close_in_h}",
        title=f"question {qid}?",
        created_at=NOW - timedelta(days=1),
        info_cutoff_at=NOW - timedelta(days=1),
        close_at=at(close_in_h),
        resolve_by=at(resolve_in_h),
    )


def _jobs(scheduler) -> dict[str, datetime]:
    return {job.id: job.next_run_time for job in scheduler.get_jobs(jobstore="default")}


def test_timers_persist_across_a_scheduler_restart_and_scheduling_is_idempotent(
    db_url: str,
) -> None:
    questions = [
        _question(1, 24, 72),
        _question(2, 48, None),
        _question(3, -48, -47),  # long past: left to the daily cycle
        Question(**{**_question(4, 5, 6).__dict__, "status": QuestionStatus.RESOLVED}),
    ]
    first = make_scheduler(db_url)
    first.start(paused=True)
    first.remove_all_jobs()  # the Postgres database is shared by the session's tests
    ids = schedule_resolution_checks(first, questions, now=NOW)
    assert ids == [job_id(1, "close"), job_id(1, "resolve-by"), job_id(2, "close")]
    schedule_resolution_checks(first, questions, now=NOW)
    before = _jobs(first)
    first.shutdown(wait=False)

    second = make_scheduler(db_url)
    second.start(paused=True)
    try:
        after = _jobs(second)
        assert after == before
        assert after[job_id(1, "close")] == questions[0].close_at
        assert second.get_job(job_id(1, "close")).args == (1,)
    finally:
        second.shutdown(wait=False)

    with pytest.raises(ValueError, match="unknown check kind"):
        schedule_check(second, 1, "tomorrow", NOW)


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_missed_check_runs_on_start_and_records_the_outcome(
    engine, db_url: str, tmp_path, monkeypatch
) -> None:
    world = World(WorldConfig(seed=4, questions_per_day=3, cancel_rate=0.0))
    clock = SimClock(world.day_start(1) + timedelta(hours=12))
    with serve_world(world, clock) as server:
        monkeypatch.setenv("FW_MANIFOLD_BASE_URL", server.manifold_base_url)
        monkeypatch.setenv("FW_HTTP_MAX_RETRIES", "0")
        monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
        monkeypatch.setenv("FW_DB_URL", db_url)  # the check reads the database from settings
        ctx = build_context(Settings(), engine, as_of=clock.now(), run_key="d1")
        harvest(ctx, sources=["manifold"], feeds=[])
        with session_scope(engine) as session:
            target, *others = list_questions(session)
        clock.advance(days=9)  # the served world now knows every outcome

        # Scheduled while the scheduler is up, due one second later, then the scheduler is down.
        down = make_scheduler(db_url)
        down.start(paused=True)
        down.remove_all_jobs()
        schedule_check(down, target.id, "close", datetime.now(UTC) + timedelta(seconds=1))
        down.shutdown(wait=False)
        threading.Event().wait(1.5)

        ran = threading.Event()
        results: list[int] = []

        def listener(event) -> None:
            results.append(event.code)
            ran.set()

        up = make_scheduler(db_url)
        up.add_listener(listener, EVENT_JOB_EXECUTED | EVENT_JOB_ERROR)
        up.start()
        try:
            assert ran.wait(30), "the missed check did not run on start"
        finally:
            up.shutdown(wait=True)
    assert results == [EVENT_JOB_EXECUTED]
    with session_scope(engine) as session:
        outcomes = latest_outcomes(session)
    assert set(outcomes) == {target.id}  # only the timed question, not the others
    assert others
    again = make_scheduler(db_url)
    again.start(paused=True)
    try:
        assert job_id(target.id, "close") not in _jobs(again)  # a date job is gone once run
    finally:
        again.shutdown(wait=False)


def test_started_timers_time_every_open_question_in_the_store(engine, db_url: str) -> None:
    with session_scope(engine) as session:
        upsert_questions(session, [_question(0, 24, None), _question(0, 30, 40)])
        stored = list_questions(session)
    scheduler = make_scheduler(db_url)
    scheduler.start(paused=True)
    scheduler.remove_all_jobs()
    scheduler.shutdown(wait=False)

    scheduler = make_scheduler(db_url)
    start_timers(scheduler, engine)  # the refresh job runs at once
    try:
        deadline = time.monotonic() + 20
        while len(_jobs(scheduler)) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert set(_jobs(scheduler)) == {
            job_id(stored[0].id, "close"),
            job_id(stored[1].id, "close"),
            job_id(stored[1].id, "resolve-by"),
        }
    finally:
        scheduler.shutdown(wait=False)


class _RunsACommand:
    """What an attacker would write into a pickled job row: unpickling it runs a command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _rows(engine) -> dict[str, bytes]:
    with engine.connect() as connection:
        found = connection.execute(text(f"SELECT id, job_state FROM {JOB_TABLE}")).all()
    return {row[0]: bytes(row[1]) for row in found}


def test_the_job_table_holds_json_and_a_crafted_row_runs_nothing(
    engine, db_url: str, tmp_path, caplog
) -> None:
    scheduler = make_scheduler(db_url)
    scheduler.start(paused=True)
    scheduler.remove_all_jobs()
    schedule_check(scheduler, 7, "close", NOW + timedelta(days=1))
    with pytest.raises(ValueError, match=r"only flows\.timers:check_resolution"):
        scheduler.add_job(print, "date", run_date=NOW + timedelta(days=1), args=["x"], id="other")
    with pytest.raises(ValueError, match=r"only flows\.timers:check_resolution"):
        scheduler.add_job(check_resolution, "date", run_date=NOW, args=["7; rm -rf /"], id="bad")
    scheduler.shutdown(wait=False)
    [(ident, state)] = _rows(engine).items()
    document = json.loads(state)
    assert ident == job_id(7, "close")
    assert document == {
        "question_id": 7,
        "kind": "close",
        "run_at": (NOW + timedelta(days=1)).isoformat(),
        "next_run_at": (NOW + timedelta(days=1)).isoformat(),
    }

    marker = tmp_path / "pwned"
    foreign = {**document, "func": "os:system", "args": [f"touch {marker}"]}
    with engine.begin() as connection:
        for ident, state in (
            ("crafted-pickle", pickle.dumps(_RunsACommand(marker))),
            ("crafted-json", json.dumps(foreign).encode()),
            ("crafted-id", json.dumps({**document, "question_id": "7; touch x"}).encode()),
        ):
            connection.execute(
                text(f"INSERT INTO {JOB_TABLE} (id, next_run_time, job_state) VALUES (:i, 0, :s)"),
                {"i": ident, "s": state},
            )
    again = make_scheduler(db_url)
    again.start(paused=True)
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING):
            assert [job.id for job in again.get_jobs(jobstore="default")] == [job_id(7, "close")]
        assert again.get_job("crafted-pickle") is None
    finally:
        again.shutdown(wait=False)
    assert not marker.exists()
    assert set(_rows(engine)) == {job_id(7, "close")}  # the unreadable rows were dropped
    # one log line for each row removed, naming it and why, and no traceback
    removed = {r.args[0]: r for r in caplog.records if "unreadable and removed" in r.msg}
    assert set(removed) == {"crafted-pickle", "crafted-json", "crafted-id"}
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == list(removed.values())
    for record in removed.values():
        assert record.exc_info is None and "\n" not in record.getMessage()
    assert "not a resolution check" in removed["crafted-id"].getMessage()
