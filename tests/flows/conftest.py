"""One Prefect test harness for the whole session: flows run against a temporary Prefect
database (PREFECT_HOME and telemetry are pinned in tests/conftest.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from flows.context import PipelineContext, build_context
from flows.settings import Settings
from futureworld.domain import GenerationSettings

CUTOFF = datetime(2026, 5, 1, tzinfo=UTC)
RESOLVED_AT = CUTOFF + timedelta(days=3)
"""When `resolve_every_question` resolves the questions."""
GENERATION = GenerationSettings(
    temperature=1.0, max_turns=1, max_new_tokens=12, max_total_tokens=512
)


def make_context(
    engine: Engine, data_dir: Path, *, as_of: datetime = CUTOFF, **settings: Any
) -> PipelineContext:
    """The run context the entrances build, on a test's engine and data folder. No question
    is held out of training and no update is gated unless a test asks for it with
    `validation_fraction` (the gate's own tests do): the stage tests count every group."""
    settings.setdefault("validation_fraction", 0.0)
    return build_context(Settings(data_dir=data_dir, **settings), engine, as_of=as_of)


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=None):
        yield
        # The harness drains the log and event workers without a bound on exit; a worker left
        # waiting on a server another test has stopped would hang the session. Drain them here
        # with a bound first (a drained worker leaves the harness nothing to wait for).
        APILogWorker.drain_all(timeout=60)
        EventsWorker.drain_all(timeout=60)


@pytest.fixture
def scored_tiny_agent() -> Callable[[str, Path], None]:
    """Builds, in a database, an LLM agent (tiny model) with three scored groups to train on."""
    return _scored_tiny_agent


def _scored_tiny_agent(db_url: str, data_dir: Path) -> None:
    """A local tiny-model agent with three completed, rewarded groups of three rollouts."""
    from flows.stages.backfilling import backfill_rewards
    from flows.stages.predicting import predict
    from futureworld.domain import Agent, Question
    from futureworld.policy.tiny import init_tiny_model
    from storage.engine import make_engine, session_scope, upgrade_database
    from storage.repositories.agents import ensure_agent
    from storage.repositories.questions import upsert_questions

    engine = make_engine(db_url)
    upgrade_database(engine)
    ctx = make_context(engine, data_dir)
    model = init_tiny_model(data_dir / "tiny-model", seed=2)
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id=f"q{i}",
                    title=f"Will event {i} happen?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                    close_at=CUTOFF + timedelta(days=2),
                )
                for i in range(3)
            ],
        )
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )
    predict(ctx, "tiny", samples=3)
    resolve_every_question(engine)
    backfill_rewards(ctx.at(RESOLVED_AT))
    engine.dispose()


def resolve_every_question(
    engine: Engine, *, external_ids: Collection[str] | None = None, value: float | None = None
) -> None:
    """Resolve every stored question (or those of `external_ids`), alternately NO and YES (or
    all `value`), at RESOLVED_AT (three days after CUTOFF): a stage sees these outcomes only
    in a context as of then or later."""
    from futureworld.domain import Outcome, OutcomeStatus
    from storage.engine import session_scope
    from storage.repositories.questions import list_questions, record_outcomes

    with session_scope(engine) as session:
        questions = [
            q
            for q in list_questions(session)
            if external_ids is None or q.external_id in external_ids
        ]
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=q.id,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=float(i % 2) if value is None else value,
                    resolved_at=RESOLVED_AT,
                )
                for i, q in enumerate(questions)
            ],
        )


def stop_process(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if `process` has not exited within `grace_s`: how fast a helper
    process (a browser, a Prefect worker) shuts down on a loaded machine is not what a test is
    about."""
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)
