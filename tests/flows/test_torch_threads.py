"""The CPU entrances give torch the thread count FW_TORCH_THREADS names, else the cores the
process may use: a real `futureworld predict` on a tiny local model in a fresh process, and an
in-process update."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from flows.stages.training import TrainOptions, supervised_finetune
from futureworld.agent.demonstrations import Demonstration, demonstration_trajectory
from futureworld.domain import Agent, Question
from futureworld.policy.tiny import init_tiny_model
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import upsert_questions
from tests.flows.conftest import CUTOFF, GENERATION, make_context

ROOT = Path(__file__).resolve().parents[2]
PREDICT_AND_REPORT = """
import json, os, sys
import torch
torch.set_num_threads(5)  # whatever torch started with, the entrance decides
from flows.cli import app
code = app(sys.argv[1:], standalone_mode=False)
print(json.dumps({"code": code, "threads": torch.get_num_threads(),
                  "cores": len(os.sched_getaffinity(0))}))
"""


@pytest.fixture
def tiny_database(tmp_path: Path) -> str:
    """A SQLite database with one open question and a tiny local agent `tiny`."""
    url = f"sqlite:///{tmp_path / 'fw.db'}"
    engine = make_engine(url)
    upgrade_database(engine)
    model = init_tiny_model(tmp_path / "tiny-model", seed=1)
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id="q0",
                    title="Will it rain in June?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                    close_at=CUTOFF + timedelta(days=30),
                )
            ],
        )
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )
    engine.dispose()
    return url


@pytest.mark.parametrize("named", [None, "3"])
def test_predict_on_a_local_model_sets_torch_threads(
    tiny_database: str, tmp_path: Path, named: str | None
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "FW_TORCH_THREADS"}
    env.update({"FW_DB_URL": tiny_database, "FW_DATA_DIR": str(tmp_path / "data")})
    if named is not None:
        env["FW_TORCH_THREADS"] = named
    args = ["predict", "--agent", "tiny", "-G", "1", "--as-of", CUTOFF.isoformat()]
    done = subprocess.run(
        [sys.executable, "-c", PREDICT_AND_REPORT, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr[-2000:]
    assert report["threads"] == (report["cores"] if named is None else int(named))


def test_an_in_process_update_uses_the_named_torch_threads(
    tiny_database: str, tmp_path: Path
) -> None:
    engine = make_engine(tiny_database)
    ctx = make_context(engine, tmp_path / "data", torch_threads=1)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tiny-model", local_files_only=True)
    demo = Demonstration(prompt="Will it rain?", completion="<probability>0.20</probability>")
    trajectory = demonstration_trajectory(
        tokenizer, demo, agent_id=0, policy_version=0, sample_index=0
    )
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        report = supervised_finetune(ctx, "tiny", [trajectory], TrainOptions())
        assert report.to_version == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
        engine.dispose()
