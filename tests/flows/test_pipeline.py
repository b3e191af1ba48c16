"""The Prefect flows on the simulated world served on loopback: a daily cycle harvests,
predicts with baseline agents, resolves, backfills and evaluates, publishing artifacts; a
failing source is reported in the summary and the rest of the cycle still runs. The flows take
no database URL: they read FW_DB_URL, or the Prefect Secret block FW_DB_URL_SECRET names."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from datetime import timedelta

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    ArtifactFilterType,
)
from prefect.client.schemas.sorting import ArtifactSort
from sqlalchemy import func, select
from typer.testing import CliRunner

from flows.cli import app
from flows.context import open_context, run_key_for
from flows.orchestration.artifacts import (
    CYCLE_SUMMARY_KEY,
    RELIABILITY_KEY,
    SCORES_KEY,
    artifact_key,
)
from flows.orchestration.deployments import build_deployments
from flows.orchestration.pipeline import (
    DAILY_TRAIN,
    FLOWS,
    CycleFailed,
    daily_cycle_flow,
    evaluate_flow,
)
from flows.settings import DAILY_CRON, parse_as_of
from flows.stages.resolving import resolve
from futureworld.domain import Agent, Question
from futureworld.world import SimClock, World, WorldConfig, serve_world
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import upsert_questions
from storage.repositories.rollouts import count_rollouts
from storage.tables import OutcomeRow, QuestionRow, RewardRow, RolloutRow, TrainingRunRow
from tests.flows.conftest import CUTOFF, RESOLVED_AT

TRAIN = DAILY_TRAIN.model_copy(update={"min_groups": 3})


def _dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _count(engine, table) -> int:
    with session_scope(engine) as session:
        return int(session.scalar(select(func.count()).select_from(table)))


def _artifacts(key: str) -> list:
    """Every version of the artifact `key`."""
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), limit=200
        )


def _latest_artifact(key: str):
    found = _artifacts(key)
    assert found, f"no artifact {key!r}"
    return max(found, key=lambda a: a.created)


def test_flow_names_match_the_registry() -> None:
    assert {name: f.name for name, f in FLOWS.items()} == {name: name for name in FLOWS}


def test_as_of_accepts_dates_and_iso_datetimes_and_names_the_run_by_date() -> None:
    assert run_key_for(parse_as_of("2026-03-04")) == "2026-03-04"
    assert parse_as_of("2026-03-04T23:30:00-02:00").isoformat() == "2026-03-05T01:30:00+00:00"
    with pytest.raises(ValueError, match="not-a-date"):
        parse_as_of("not-a-date")
    assert artifact_key("training", "Qwen 0.5B_v2") == "training-qwen-0-5b-v2"


def _failed_cycle(**params) -> dict:
    """A daily cycle that fails at the end (a source gave nothing): its stages by name."""
    state = daily_cycle_flow(**params, return_state=True)
    failure = state.result(raise_on_failure=False)
    assert state.is_failed() and isinstance(failure, CycleFailed)
    assert "stages failed: harvest" in str(failure)
    return {s.stage: s for s in failure.stages}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def task_run_lines() -> Iterator[list[str]]:
    """What the flows' task runs say to their run logger (the lines a task run's Logs tab
    shows), at INFO for this test (the suite keeps Prefect at WARNING, tests/conftest.py)."""
    logger = logging.getLogger("prefect.task_runs")
    level = logger.level
    lines = _Lines()
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    yield lines.messages
    logger.removeHandler(lines)
    logger.setLevel(level)


def test_daily_cycle_runs_the_loop_and_reports_a_failing_source(
    prefect_harness, engine, db_url: str, tmp_path, monkeypatch, task_run_lines
) -> None:
    world = World(WorldConfig(seed=5, questions_per_day=5, cancel_rate=0.0))
    clock = SimClock(world.day_start(2) + timedelta(hours=12))
    with session_scope(engine) as session:
        for name in ("crowd", "uniform"):
            ensure_agent(session, Agent(name=name, base_model=name, backend="baseline"))
    with serve_world(world, clock) as server:
        monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
        monkeypatch.setenv("FW_DB_URL", db_url)
        monkeypatch.setenv("FW_MANIFOLD_BASE_URL", server.manifold_base_url)
        monkeypatch.setenv("FW_POLYMARKET_BASE_URL", _dead_url())
        monkeypatch.setenv("FW_HTTP_MAX_RETRIES", "0")
        monkeypatch.setenv("FW_HTTP_TIMEOUT_S", "2")
        params = dict(sources=["manifold", "polymarket"], feeds=[], samples=1)

        day2 = clock.now().isoformat()
        stages = _failed_cycle(as_of=day2, **params)
        posed = _count(engine, QuestionRow)
        assert stages["harvest"].counts["questions_new"] == posed > 0
        assert any(e.startswith("polymarket:") for e in stages["harvest"].errors)
        # A requested source that gave nothing fails the stage; the cycle still runs on.
        assert stages["harvest"].failed == "failed: nothing came through from polymarket"
        assert stages["predict crowd"].counts["rollouts"] == posed
        assert stages["predict uniform"].counts["rollouts"] == posed
        summary = _latest_artifact(CYCLE_SUMMARY_KEY).data
        assert f"Daily cycle {run_key_for(clock.now())}" in summary
        assert "polymarket" in summary and "What failed and why" in summary
        # every task says what it did to its run logger, and predict reports its progress
        messages = list(task_run_lines)
        with get_client(sync_client=True) as client:
            progress = client.read_artifacts(
                artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"])),
                sort=ArtifactSort.CREATED_DESC,
                limit=50,
            )
        said_predict = f"predict crowd: policy version 0, questions {posed}, rollouts {posed}"
        assert any(m.startswith(said_predict) for m in messages), messages
        assert any(m.startswith("harvest: ") and "questions new" in m for m in messages)
        assert any(m.startswith("backfill: ") for m in messages)
        predicted = [a for a in progress if a.description == "predict crowd: questions forecast"]
        assert predicted and predicted[0].data == 100.0, [a.data for a in predicted]  # newest

        # Re-running the same day changes nothing.
        again = _failed_cycle(as_of=day2, **params)
        assert again["harvest"].counts["questions_new"] == 0
        assert again["predict crowd"].counts["rollouts"] == 0
        assert _count(engine, RolloutRow) == 2 * posed

        clock.advance(days=9)
        later = _failed_cycle(as_of=clock.now().isoformat(), **params)
    assert later["resolve"].counts["outcomes_recorded"] == posed
    assert later["backfill"].counts["rewards_inserted"] > 0
    assert later["evaluate"].counts["forecasts_scored"] == 2 * posed
    assert _count(engine, OutcomeRow) == posed  # day 11 harvested new, still open questions
    assert _count(engine, RewardRow) == later["backfill"].counts["rewards_inserted"]

    scores = _latest_artifact(SCORES_KEY)
    assert {row["agent"] for row in json.loads(scores.data)} >= {"crowd", "uniform"}
    reliability = _latest_artifact(RELIABILITY_KEY).data
    assert (tmp_path / "reports" / f"reliability-{run_key_for(clock.now())}.png").stat().st_size
    assert "reliability-" in reliability

    rows = evaluate_flow(as_of=clock.now().isoformat())
    uniform = next(r for r in rows if r["agent"] == "uniform" and r["source"] is None)
    assert uniform["brier"] == 0.25 and uniform["n"] == posed


def _rewarded_questions(engine) -> list[int]:
    with session_scope(engine) as session:
        return list(
            session.scalars(
                select(RolloutRow.question_id).join(
                    RewardRow, RewardRow.rollout_id == RolloutRow.id
                )
            )
        )


def test_a_past_dated_cycle_and_evaluate_score_and_reward_nothing_from_their_future(
    prefect_harness, engine, db_url: str, tmp_path, monkeypatch
) -> None:
    """The database already holds outcomes revealed after the run's as-of (recorded on day 11):
    a cycle as of day 6 and the evaluate deployment as of day 6 score and reward only those
    revealed by then; a cycle as of day 11 scores the rest, which waited in the queue."""
    world = World(WorldConfig(seed=5, questions_per_day=5, cancel_rate=0.0))
    clock = SimClock(world.day_start(2) + timedelta(hours=12))
    with session_scope(engine) as session:
        for name in ("crowd", "uniform"):
            ensure_agent(session, Agent(name=name, base_model=name, backend="baseline"))
    with serve_world(world, clock) as server:
        monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
        monkeypatch.setenv("FW_DB_URL", db_url)
        monkeypatch.setenv("FW_MANIFOLD_BASE_URL", server.manifold_base_url)
        monkeypatch.setenv("FW_HTTP_MAX_RETRIES", "0")
        params = dict(sources=["manifold"], feeds=[], samples=1)
        daily_cycle_flow(as_of=clock.now().isoformat(), **params)
        past = clock.now() + timedelta(days=4)
        clock.advance(days=9)
        with open_context(as_of=clock.now()) as ctx:  # the outcomes known by day 11, stored
            resolve(ctx)
        stages = {s.stage: s for s in daily_cycle_flow(as_of=past.isoformat(), **params)}
        rows = evaluate_flow(as_of=past.isoformat())
        with session_scope(engine) as session:
            resolved_at = dict(
                session.execute(select(OutcomeRow.question_id, OutcomeRow.resolved_at)).all()
            )
            made = list(
                session.execute(
                    select(RolloutRow.question_id, RolloutRow.as_of).where(RolloutRow.as_of <= past)
                )
            )
        revealed = {q for q, at in resolved_at.items() if at <= past}
        assert revealed and set(resolved_at) - revealed, "the fixture needs outcomes either side"
        rewarded = _rewarded_questions(engine)
        assert rewarded and set(rewarded) <= revealed
        assert stages["backfill"].counts["rewards_inserted"] == len(rewarded)
        with session_scope(engine) as session:  # written in the run's time, not the wall's
            assert set(session.scalars(select(RewardRow.made_at))) == {past}
        scored = [q for q, _ in made if q in revealed]
        assert stages["evaluate"].counts["forecasts_scored"] == len(scored)
        overall = {r["agent"]: r["n"] for r in rows if r["source"] is None}
        assert sum(overall.values()) == len(scored)

        later = {s.stage: s for s in daily_cycle_flow(as_of=clock.now().isoformat(), **params)}
    assert later["backfill"].counts["rewards_inserted"] > 0
    assert set(_rewarded_questions(engine)) - revealed  # the rest waited in the queue


def test_a_past_dated_cycle_trains_on_no_outcome_revealed_after_it(
    prefect_harness, scored_tiny_agent, tmp_path, monkeypatch
) -> None:
    """The tiny agent's three groups are rewarded on outcomes revealed at RESOLVED_AT: a cycle
    as of the day before trains on none of them (nor evaluates them); one as of then does."""
    db_url = f"sqlite:///{tmp_path / 'fw.db'}"
    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FW_DB_URL", db_url)
    scored_tiny_agent(db_url, tmp_path)
    before = (RESOLVED_AT - timedelta(days=1)).isoformat()
    stages = {s.stage: s for s in daily_cycle_flow(as_of=before, feeds=[], samples=2, train=TRAIN)}
    assert stages["train tiny"].note.startswith("fewer than 3")
    assert stages["evaluate"].counts["forecasts_scored"] == 0
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        assert count_rollouts(session) == 9  # nothing was open to forecast either
    engine.dispose()
    then = {
        s.stage: s
        for s in daily_cycle_flow(as_of=RESOLVED_AT.isoformat(), feeds=[], samples=2, train=TRAIN)
    }
    assert then["train tiny"].counts["to_version"] == 1
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        (run,) = session.scalars(select(TrainingRunRow)).all()
        assert run.made_at == RESOLVED_AT and run.started_at > RESOLVED_AT  # as-of vs wall
    engine.dispose()


def test_cycle_command_runs_the_daily_cycle_and_prints_each_stage(
    prefect_harness, tmp_path, monkeypatch
) -> None:
    db_url = f"sqlite:///{tmp_path / 'fw.db'}"
    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FW_DB_URL", "")  # recorded, so the `--db` the command exports is undone
    monkeypatch.delenv("FW_DB_URL")
    engine = make_engine(db_url)
    upgrade_database(engine)
    with session_scope(engine) as session:
        ensure_agent(session, Agent(name="uniform", base_model="uniform", backend="baseline"))
    engine.dispose()
    result = CliRunner().invoke(
        app, ["orchestrate", "cycle", "--as-of", "2026-02-01", "--db", db_url]
    )
    assert result.exit_code == 0, result.output
    for stage in ("harvest", "resolve", "backfill", "predict uniform", "evaluate"):
        assert f"{stage}:" in result.output

    bad = CliRunner().invoke(app, ["orchestrate", "cycle", "--as-of", "someday", "--db", db_url])
    assert bad.exit_code == 2
    assert "someday" in bad.output and "Traceback" not in bad.output


def test_served_deployments_schedule_only_the_daily_cycle_and_carry_no_database_url() -> None:
    deployments = {d.name: d for d in build_deployments()}
    assert set(deployments) == set(FLOWS)
    (schedule,) = deployments["daily-cycle"].schedules
    assert (schedule.schedule.cron, schedule.schedule.timezone) == (DAILY_CRON, "UTC")
    assert all(not d.schedules for name, d in deployments.items() if name != "daily-cycle")
    for deployment in deployments.values():
        assert deployment.parameters == {}
    for flow in FLOWS.values():
        assert "db_url" not in flow.parameters.properties  # no flow takes the URL at all


def test_flows_read_the_database_url_from_a_prefect_secret_block(
    prefect_harness, tmp_path, monkeypatch
) -> None:
    from prefect.blocks.system import Secret

    from flows.orchestration.pipeline import harvest_flow
    from storage.repositories.events import event_counts

    db_url = f"sqlite:///{tmp_path / 'secret.db'}"
    Secret(value=db_url).save("fw-test-db-url", overwrite=True)
    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("FW_DB_URL", raising=False)
    monkeypatch.setenv("FW_DB_URL_SECRET", "fw-test-db-url")
    report = harvest_flow(as_of="2026-02-01", sources=["nosuch"], feeds=[])
    assert report.sources == {"nosuch": "failed"}
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        assert event_counts(session, "2026-02-01")[("harvest", "nosuch", "unknown_source")] == 1
    engine.dispose()
    assert not (tmp_path / "futureworld.db").exists()  # not the default database


def test_daily_cycle_trains_an_llm_agent_then_predicts_with_its_new_version(
    prefect_harness, scored_tiny_agent, tmp_path, monkeypatch
) -> None:
    db_url = f"sqlite:///{tmp_path / 'fw.db'}"
    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FW_DB_URL", db_url)
    scored_tiny_agent(db_url, tmp_path)
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id="open",
                    title="Will the open event happen?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                    close_at=CUTOFF + timedelta(days=30),
                )
            ],
        )
    as_of = (CUTOFF + timedelta(days=4)).isoformat()
    dashboards = len(_artifacts(artifact_key("dashboard", "tiny")))
    stages = {s.stage: s for s in daily_cycle_flow(as_of=as_of, feeds=[], samples=2, train=TRAIN)}
    assert stages["train tiny"].counts["to_version"] == 1
    # one dashboard a cycle: after evaluate, not also after the update it shows
    assert len(_artifacts(artifact_key("dashboard", "tiny"))) == dashboards + 1
    predicted = stages["predict tiny"].counts
    assert (predicted["policy_version"], predicted["questions"], predicted["rollouts"]) == (1, 1, 2)
    assert stages["evaluate"].failed is None  # tiny-model answers rarely parse: few scored
    training = _latest_artifact(artifact_key("training", "tiny")).data
    assert "v0 → v1" in training and "kl_behaviour" in training
    assert list((tmp_path / "reports").glob("training-tiny-*.png"))
    # the train task reported its optimiser steps as a progress artifact, done at the end
    with get_client(sync_client=True) as client:
        progress = client.read_artifacts(
            artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["progress"])),
            sort=ArtifactSort.CREATED_DESC,
            limit=50,
        )
    trained = [a for a in progress if a.description == "train tiny: optimiser steps done"]
    assert trained and trained[0].data == 100.0, [a.data for a in trained]  # newest
    # the promotion gate ran (no held-out question resolved: q0–q2 lie outside the 10%
    # slice; its health rules judged the open question); the dashboard, last published by the
    # cycle's evaluate, shows v1's verdict, its update's health and both versions' live scores
    dashboard = _latest_artifact(artifact_key("dashboard", "tiny")).data
    assert "| v1 | promoted |" in dashboard
    assert "no resolved question: the Brier rule waits for outcomes" in dashboard
    assert "| v0 | promoted |" in dashboard and "data:image/png;base64," in dashboard
    assert list((tmp_path / "reports").glob("dashboard-tiny-*.png"))

    # The same day again: nothing left to train on, nothing left to forecast.
    again = {s.stage: s for s in daily_cycle_flow(as_of=as_of, feeds=[], samples=2, train=TRAIN)}
    assert again["train tiny"].note.startswith("fewer than 3")
    assert again["predict tiny"].counts["rollouts"] == 0
    with session_scope(engine) as session:
        assert count_rollouts(session) == 9 + 2
    engine.dispose()
