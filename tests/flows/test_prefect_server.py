"""The deployments on a real Prefect server: a `prefect server start` subprocess with its own
home and SQLite database, a process work pool and worker, `prefect deploy --all` from
prefect.yaml in the source tree, and `prefect deployment run` triggering replay-and-train and
evaluate with parameters; the training run registers a new policy version."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest

from flows.runtime import runner_factory
from flows.settings import Settings
from flows.stages.predicting import predict
from flows.stages.scoring import backfill_rewards
from futureworld.domain import Agent, Outcome, OutcomeStatus, Question
from futureworld.policy.tiny import init_tiny_model
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent, get_agent, latest_policy_version
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions

REPO = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).with_name("prefect"))
CUTOFF = datetime(2026, 5, 1, tzinfo=UTC)
GENERATION = {"temperature": 1.0, "max_turns": 1, "max_new_tokens": 12, "max_total_tokens": 512}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A real Prefect API on 127.0.0.1 and the environment its CLI and worker need."""
    home = tmp_path_factory.mktemp("prefect-home")
    port = _free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_CLI_PROMPT": "false",
        "DO_NOT_TRACK": "1",
        "FW_REPO_DIR": str(REPO),
    }
    log = (home / "server.log").open("w")
    server = subprocess.Popen(
        [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{env['PREFECT_API_URL']}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None, (home / "server.log").read_text()
            assert time.monotonic() < deadline, "Prefect server did not start in 90 s"
            time.sleep(0.5)
        yield env
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def _prefect(env: dict[str, str], *args: str, timeout: float = 180) -> str:
    result = subprocess.run(
        [PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _scored_tiny_agent(db_url: str, data_dir: Path) -> None:
    """A local tiny-model agent with three completed, rewarded groups of three rollouts."""
    engine = make_engine(db_url)
    upgrade_database(engine)
    settings = Settings(data_dir=data_dir, db_url=db_url)
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
    predict(
        engine, "tiny", samples=3, as_of=CUTOFF, runner_factory=runner_factory(settings, engine)
    )
    with session_scope(engine) as session:
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=q.id,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=float(i % 2),
                    resolved_at=CUTOFF + timedelta(days=3),
                )
                for i, q in enumerate(list_questions(session))
            ],
        )
    backfill_rewards(engine)
    engine.dispose()


def test_deployments_run_on_a_real_server_with_a_process_worker(prefect_server, tmp_path) -> None:
    env = {**prefect_server, "FW_DATA_DIR": str(tmp_path / "data")}
    db_url = f"sqlite:///{tmp_path / 'fw.db'}"
    _scored_tiny_agent(db_url, tmp_path / "data")

    _prefect(env, "work-pool", "create", "futureworld", "--type", "process")
    deployed = _prefect(env, "deploy", "--all")
    for name in ("daily-cycle", "replay-and-train", "evaluate"):
        assert name in deployed
    schedule = _prefect(env, "deployment", "inspect", "daily-cycle/daily-cycle")
    assert "0 6 * * *" in schedule and "UTC" in schedule

    worker_log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [PREFECT, "worker", "start", "--pool", "futureworld", "--type", "process"],
        env=env,
        cwd=tmp_path,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
    )
    try:
        out = _prefect(
            env,
            "deployment",
            "run",
            "replay-and-train/replay-and-train",
            "-p",
            "agent=tiny",
            "-p",
            f"db_url={db_url}",
            "-p",
            "max_groups=3",
            "--watch",
            "--watch-timeout",
            "150",
        )
        assert "Completed" in out, out
        _prefect(
            env,
            "deployment",
            "run",
            "evaluate/evaluate",
            "-p",
            f"db_url={db_url}",
            "--watch",
            "--watch-timeout",
            "90",
        )
    finally:
        worker.terminate()
        worker.wait(30)
        worker_log.close()

    engine = make_engine(db_url)
    with session_scope(engine) as session:
        version = latest_policy_version(session, get_agent(session, "tiny").id)
    engine.dispose()
    assert (version.version, version.parent_version) == (1, 0)
    assert Path(version.checkpoint_path).is_dir()
    assert list((tmp_path / "data" / "reports").glob("training-tiny-*.png"))
    artifacts = _prefect(env, "artifact", "ls")
    assert "training-tiny" in artifacts and "evaluate-scores" in artifacts
