"""Predict: claim open questions for an agent's current policy version and persist G rollouts
per question, from the agent's forecaster (flows.forecasters: the rollout engine or a
baseline). Claims make concurrent workers safe and re-runs idempotent.

Questions are claimed lazily, `forecaster.claim_batch` at a time, only when the forecaster
pulls more work (the engine pulls while fewer than its `LOOKAHEAD_ROLLOUTS` rollouts are
unfinished), so a worker holds claims on about what it is generating and has queued. Each
group is persisted in its own transaction as soon as it is complete, together with the
release of its claim: a crash loses at most the groups in flight
(and the at most `WRITE_QUEUE_GROUPS` complete ones waiting to be written) and leaves their
claims to `release_dead_local_claims` or the lease.

The writes (a complete group, a failure record) run in order on one writer thread of the run,
so the engine's thread goes straight back to keeping its backend full instead of waiting on
the database (with short HTTP turns persisting took a fifth of the run on that thread). The
writer's queue is bounded: when the database is slower than generation the engine waits for
room, as it waited for each write before. The writer's first error stops it: it is raised on
the engine's thread at its next hand-off, or when the run ends, and the writes still queued
are dropped (their claims are released with every other unfinished group's). The writer is
drained and joined before the run returns or raises, so the report counts every write.

Poison isolation: a question that cannot be forecast (its prompt too long even after the cut
rule, a generation error, a persistence error) is recorded as an error event of the predict
stage (source `q<question>-a<agent>`, kind and reason) and skipped; the run goes on. A
question with `settings.predict_max_failures` such failures for the agent is parked: no
longer claimed, listed in the report, until its events are cleared.

Transient database errors (a lost connection, a server restart, a serialization failure) are
not poison: every transaction of the run goes through `storage.engine.run_transaction`,
which retries it with backoff. A completed group stays in memory while its write is retried
and is persisted after the reconnect; only when the retries are spent does the run fail.

Across hosts: a claim names its worker (`settings.worker_id`, default host:pid) and carries a
lease of `settings.claim_lease_s`, renewed each time this worker claims more work. A dead
worker on this host is detected by pid at the start of a run; one on another host by its
expired lease, after which any worker takes the group over. A late write of the first worker
is absorbed by the rollouts' idempotency keys, and it frees only the claims it still holds."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date
from functools import partial

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from flows.context import PipelineContext
from flows.forecasters import FORECASTERS, Work
from futureworld.domain import Question, Trajectory, utc_now
from storage.engine import is_transient, run_transaction
from storage.repositories.claims import (
    claim_questions,
    claim_workers,
    release_claims,
    release_worker_claims,
    renew_claims,
)
from storage.repositories.events import PipelineEvent, record_events
from storage.repositories.questions import list_questions, open_questions_at, round_question_ids
from storage.repositories.reforecasts import questions_due
from storage.repositories.rollouts import (
    PREDICT_STAGE,
    existing_samples,
    insert_rollouts,
    prediction_failure_source,
    prediction_failures,
)

log = logging.getLogger(__name__)

WRITE_QUEUE_GROUPS = 8
"""Writes (complete groups, failure records) that may wait for the writer thread; with G = 8
and 32 requests in flight a wave of equal turns completes four groups at once."""


@dataclass(frozen=True)
class PredictReport:
    agent: str
    policy_version: int
    questions: int
    """Questions whose group was completed and persisted."""
    rollouts: int
    failed: int = 0
    """Groups that could not be forecast this run (recorded as predict events)."""
    parked: tuple[int, ...] = ()
    """Questions parked for this agent after too many failures (not attempted)."""


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def release_dead_local_claims(engine: Engine) -> int:
    """Free the claims of predict workers on this host whose process is gone (killed midway),
    so a rerun picks their groups up at once instead of waiting for the lease to expire."""
    host = socket.gethostname()

    def release(session: Session) -> int:
        workers = claim_workers(session, f"{host}:")
        return release_worker_claims(
            session, [w for w in workers if not _alive(w.rsplit(":", 1)[1])]
        )

    return run_transaction(engine, release, what="predict: release dead claims")


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def predict(
    ctx: PipelineContext,
    agent_name: str,
    *,
    samples: int = 1,
    limit: int | None = None,
    on_group: Callable[[int], None] | None = None,
    on_total: Callable[[int], None] | None = None,
    round: date | None = None,
) -> PredictReport:
    """Forecast every question open at `ctx.as_of` that this agent has not forecast yet (or
    whose current version's group has fewer than `samples` rollouts), plus, with
    `settings.reforecast_every_days`, those whose newest forecast is that old, at most
    `limit` questions. `on_group(n_rollouts)` is called after each persisted group and
    `on_total(n)` once, before the first claim, with the questions this run will claim at most
    (fewer when another worker claims some first): progress. With `round`, only the questions
    of that ForecastBench round (`round_question_ids`; UnknownRound when none is stored)."""
    engine = ctx.engine
    worker = ctx.settings.worker_id or default_worker_id()
    max_failures = ctx.settings.predict_max_failures
    release_dead_local_claims(engine)
    agent = ctx.agent(agent_name)
    assert agent.id is not None
    version = ctx.current_version(agent)

    def open_ids(session: Session) -> list[int]:
        scope = None if round is None else round_question_ids(session, round)
        return [
            q.id
            for q in open_questions_at(session, ctx.as_of)
            if q.id is not None and (scope is None or q.id in scope)
        ]

    candidates, failures = run_transaction(
        engine,
        lambda session: (
            questions_due(
                session,
                open_ids(session),
                agent_id=agent.id,
                policy_version=version.version,
                as_of=ctx.as_of,
                every_days=ctx.settings.reforecast_every_days,
            ),
            prediction_failures(session, agent.id),
        ),
        what="predict: open questions",
    )
    parked = [q for q in candidates if failures.get(q, 0) >= max_failures]
    if parked:
        log.warning(
            "%s: %d question(s) parked after %d failed predictions each: %s",
            agent.name,
            len(parked),
            max_failures,
            ", ".join(map(str, parked[:20])),
        )
    candidates = [q for q in candidates if failures.get(q, 0) < max_failures]
    if on_total is not None:
        on_total(len(candidates) if limit is None else min(limit, len(candidates)))
    forecaster = FORECASTERS[agent.backend](ctx, agent, version)
    if forecaster.max_samples is not None:
        samples = min(samples, forecaster.max_samples)
    run = _PredictRun(ctx, agent.id, version.version, worker, samples, on_group)
    writer = _Writer(WRITE_QUEUE_GROUPS)

    def work() -> Iterator[Work]:
        pending = list(candidates)
        claimed_total = 0
        while pending and (limit is None or claimed_total < limit):
            batch = forecaster.claim_batch
            if limit is not None:
                batch = min(batch, limit - claimed_total)
            claimed, questions, have = run.claim(pending, batch)
            if not claimed:
                return
            claimed_set = set(claimed)
            pending = [q for q in pending if q not in claimed_set]
            claimed_total += len(claimed)
            for question_id in claimed:
                missing = tuple(i for i in range(samples) if i not in have.get(question_id, ()))
                if not missing:
                    run.release([question_id])
                    continue
                yield questions[question_id], missing

    try:
        forecaster.run(
            work(),
            lambda question, group: writer.submit(partial(run.persist, question, group)),
            lambda question, kind, detail: writer.submit(partial(run.fail, question, kind, detail)),
            lambda question, kind, detail: writer.submit(partial(run.note, question, kind, detail)),
        )
    finally:
        write_error = writer.close()  # Every queued write done (or dropped after an error).
        run.release(run.held_now())  # Whatever did not finish: free for the next worker.
    if write_error is not None:
        raise write_error
    newly_parked = [q for q in run.failed if failures.get(q, 0) + 1 >= max_failures]
    return PredictReport(
        agent.name,
        version.version,
        run.questions,
        run.rollouts,
        failed=len(run.failed),
        parked=tuple(parked + newly_parked),
    )


class _Writer:
    """Runs writes in the order given on a thread of its own, behind a bounded queue. The
    first write that raises (anything, KeyboardInterrupt included) stops it: the error is
    raised by the next `submit` and returned by `close`, and later writes are dropped."""

    def __init__(self, maxsize: int) -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="predict-writer", daemon=True)
        self._thread.start()

    def submit(self, write: Callable[[], None]) -> None:
        """Queue `write`, waiting while the queue is full; raises the writer's error."""
        if self._error is not None:
            raise self._error
        self._queue.put(write)

    def close(self) -> BaseException | None:
        """Wait for every queued write, stop the thread; the writer's error, if any."""
        self._queue.put(None)
        self._thread.join()
        return self._error

    def _work(self) -> None:
        while (write := self._queue.get()) is not None:
            if self._error is not None:
                continue  # Dropped: the writer has stopped writing; keep the queue moving.
            try:
                write()
            except BaseException as error:  # Raised on the engine's thread, not lost here.
                self._error = error


@dataclass
class _PredictRun:
    """One predict run's claims, persistence and failure records. Claims are taken on the
    engine's thread and written off on the writer's: `held` is read and changed under a lock."""

    ctx: PipelineContext
    agent_id: int
    policy_version: int
    worker: str
    samples: int
    on_group: Callable[[int], None] | None
    held: set[int] = field(default_factory=set)
    failed: list[int] = field(default_factory=list)
    questions: int = 0
    rollouts: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def held_now(self) -> list[int]:
        with self._lock:
            return sorted(self.held)

    def claim(
        self, pending: list[int], batch: int
    ) -> tuple[list[int], dict[int, Question], dict[int, set[int]]]:
        lease_s = self.ctx.settings.claim_lease_s

        def claim(session: Session) -> tuple[list[int], dict[int, Question], dict[int, set[int]]]:
            now = utc_now()
            if held := self.held_now():  # Heartbeat: the groups in flight keep their lease.
                renew_claims(
                    session,
                    held,
                    agent_id=self.agent_id,
                    policy_version=self.policy_version,
                    worker=self.worker,
                    lease_s=lease_s,
                    now=now,
                )
            claimed = claim_questions(
                session,
                pending,
                agent_id=self.agent_id,
                policy_version=self.policy_version,
                samples=self.samples,
                worker=self.worker,
                lease_s=lease_s,
                limit=batch,
                now=now,
            )
            have = existing_samples(session, claimed, self.agent_id, self.policy_version)
            questions = {q.id: q for q in list_questions(session, ids=claimed)}
            return claimed, questions, have

        claimed, questions, have = run_transaction(
            self.ctx.engine, claim, what="predict: claim questions"
        )
        with self._lock:
            self.held.update(claimed)
        return claimed, questions, have

    def release(self, question_ids: list[int]) -> None:
        if not question_ids:
            return
        run_transaction(
            self.ctx.engine,
            lambda session: release_claims(
                session,
                question_ids,
                agent_id=self.agent_id,
                policy_version=self.policy_version,
                worker=self.worker,
            ),
            what="predict: release claims",
        )
        with self._lock:
            self.held.difference_update(question_ids)

    def persist(self, question: Question, group: list[Trajectory]) -> None:
        """Store one complete group and free its claim, in one transaction, retried on a
        transient error (the group waits in memory); a group that cannot be stored for any
        other reason is recorded as a failure instead."""
        assert question.id is not None

        def store(session: Session) -> int:
            inserted = insert_rollouts(session, group)
            release_claims(
                session,
                [question.id],
                agent_id=self.agent_id,
                policy_version=self.policy_version,
                worker=self.worker,
            )
            return inserted

        try:
            inserted = run_transaction(
                self.ctx.engine, store, what=f"predict: persist question {question.id}"
            )
        except Exception as error:  # This group only: the run goes on.
            if is_transient(error):
                raise  # The database stayed away past the retries: the run fails.
            self.fail(question, "persist_error", f"{type(error).__name__}: {error}")
            return
        with self._lock:
            self.held.discard(question.id)
        self.questions += 1
        self.rollouts += inserted
        if self.on_group is not None:
            self.on_group(len(group))

    def fail(self, question: Question, kind: str, detail: str) -> None:
        assert question.id is not None
        self._record(question, kind, detail[:2000], level="error")
        self.failed.append(question.id)
        self.release([question.id])

    def note(self, question: Question, kind: str, detail: str) -> None:
        self._record(question, kind, detail, level="warning")

    def _record(self, question: Question, kind: str, detail: str, *, level: str) -> None:
        assert question.id is not None
        if level == "error":
            log.warning("predict: question %s %s: %s", question.id, kind, detail)
        run_transaction(
            self.ctx.engine,
            lambda session: record_events(
                session,
                [
                    PipelineEvent(
                        run_key=self.ctx.run_key,
                        stage=PREDICT_STAGE,
                        source=prediction_failure_source(question.id, self.agent_id),
                        kind=kind,
                        detail=detail.replace("\x00", "\ufffd"),
                        level=level,
                    )
                ],
            ),
            what="predict: record failure",
        )
