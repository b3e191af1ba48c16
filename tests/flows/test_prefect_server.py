"""The deployments on a real Prefect server: a `prefect server start` subprocess with its own
home and SQLite database, a process work pool and worker, `prefect deploy --all` from
prefect.yaml in the source tree, and `prefect deployment run` triggering replay-and-train and
evaluate with parameters; the training run registers a new policy version. The database URL
is never a parameter: the worker has it in its environment (FW_DB_URL)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.engine import make_engine, session_scope
from storage.repositories.agents import get_agent, latest_policy_version
from tests.flows.conftest import stop_process
from tests.flows.prefect_server import PREFECT, running_prefect_server

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory) -> Iterator[dict[str, str]]:
    """A real Prefect API on 127.0.0.1 and the environment its CLI and worker need."""
    home = tmp_path_factory.mktemp("prefect-home")
    with running_prefect_server(home, ui=False, extra_env={"FW_REPO_DIR": str(REPO)}) as (_, env):
        yield env


def _prefect(env: dict[str, str], *args: str, timeout: float = 180) -> str:
    result = subprocess.run(
        [PREFECT, *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"prefect {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_deployments_run_on_a_real_server_with_a_process_worker(
    prefect_server, scored_tiny_agent, tmp_path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'fw.db'}"
    env = {**prefect_server, "FW_DATA_DIR": str(tmp_path / "data"), "FW_DB_URL": db_url}
    scored_tiny_agent(db_url, tmp_path / "data")

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
            'train={"max_groups": 3, "config": {"learning_rate": 1e-3}}',
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
            "--watch",
            "--watch-timeout",
            "90",
        )
    finally:
        stop_process(worker, 120)  # a loaded machine's worker took over 30 s to stop
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
