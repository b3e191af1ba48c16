"""Every version reaches the server: after registration the serve step loads a LoRA version
into the running server, or restarts the server (infra/vllm/restart.sh) on a full checkpoint
under the version's name and waits for it; predict then samples that version, every request
names it and every rollout records it; a version the server does not serve is refused
before anything is sampled. An update whose version could not be served (all weights, no
restart command) is refused before it trains, and the replay-and-train flow trains an
adapter for an HTTP agent unless told otherwise. The server is the loopback completions
server with vLLM's API shape, recording which model each request named."""

from __future__ import annotations

import os
import shutil
import signal
import socket
from datetime import timedelta
from inspect import signature
from pathlib import Path

import pytest
import yaml
from peft import LoraConfig, get_peft_model
from sqlalchemy import func, select
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from flows.cli import app
from flows.orchestration.pipeline import DAILY_TRAIN, replay_and_train_flow
from flows.stages.backfilling import backfill_rewards
from flows.stages.predicting import predict
from flows.stages.serving import NotServableError, ServeAction, serve_current_version
from flows.stages.training import TrainOptions, replay_and_train, supervised_finetune
from futureworld.domain import Agent, BackendKind, PolicyVersion, Question
from futureworld.policy.base import is_lora_adapter
from futureworld.policy.local import LocalBackend
from futureworld.policy.openai_http import NotServingError
from futureworld.policy.tiny import init_tiny_model
from futureworld.rl.checkpoints import checkpoint_sha256
from futureworld.rl.config import TrainConfig
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.agents import (
    ensure_agent,
    get_agent,
    latest_policy_version,
    register_policy_version,
)
from storage.repositories.questions import upsert_questions
from storage.repositories.rollouts import rollouts_for
from storage.tables import TrainingRunRow
from tests.flows.conftest import (
    CUTOFF,
    GENERATION,
    RESOLVED_AT,
    make_context,
    resolve_every_question,
)
from tests.policy.completions_server import ServerState, serve_completions

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)


def _questions(engine, numbers: range) -> None:
    """Open questions; each is forecast once per agent, so every version gets new ones."""
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
                    close_at=CUTOFF + timedelta(days=5),
                )
                for i in numbers
            ],
        )


def _setup(engine, tiny_model: Path, url: str) -> None:
    _questions(engine, range(2))
    with session_scope(engine) as session:
        ensure_agent(
            session,
            Agent(
                name="remote",
                base_model=str(tiny_model),
                backend=BackendKind.OPENAI,
                base_url=url,
                generation=GENERATION,
            ),
        )


def _register(engine, version: int, checkpoint: Path) -> None:
    with session_scope(engine) as session:
        agent = get_agent(session, "remote")
        register_policy_version(
            session,
            PolicyVersion(
                agent_id=agent.id,
                version=version,
                parent_version=version - 1,
                checkpoint_path=str(checkpoint),
                checkpoint_sha256=checkpoint_sha256(checkpoint),
            ),
        )


def _backends(engine, version: int) -> set[str]:
    with session_scope(engine) as session:
        return {t.sampling["backend"] for t in rollouts_for(session) if t.policy_version == version}


def test_a_lora_version_is_loaded_into_the_running_server_and_sampled(
    engine, tiny_model: Path, tmp_path: Path
) -> None:
    adapter = tmp_path / "v1"
    lora = LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM")
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), lora).save_pretrained(adapter)
    state = ServerState(backend=LocalBackend.from_pretrained(tiny_model), served_name="model")
    with serve_completions(state) as url:
        _setup(engine, tiny_model, url)
        ctx = make_context(engine, tmp_path)
        assert serve_current_version(ctx, "remote").action is ServeAction.ALREADY_SERVED
        _register(engine, 1, adapter)
        report = serve_current_version(ctx, "remote")
        assert (report.action, report.served_name) == (ServeAction.ADAPTER_LOADED, "remote-v1")
        assert state.adapters == {"remote-v1": str(adapter)}
        predicted = predict(ctx, "remote", samples=2)
    assert (predicted.policy_version, predicted.rollouts) == (1, 4)
    named = {body["model"] for path, body in state.requests if path == "/v1/completions"}
    assert named == {"remote-v1"}
    assert _backends(engine, 1) == {f"openai:{url}/remote-v1"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_full_checkpoint_restarts_the_server_on_it_and_an_unserved_version_is_refused(
    engine, tiny_model: Path, tmp_path: Path
) -> None:
    port = _free_port()
    pidfile = tmp_path / "server.pid"
    restart = (
        f"env PORT={{port}} PIDFILE={pidfile} LOG={tmp_path / 'server.log'} "
        f"VLLM_SERVE_SCRIPT={ROOT / 'tests/policy/serve_loopback.sh'} "
        f"bash {ROOT / 'infra/vllm/restart.sh'} {{checkpoint}} {{served_name}}"
    )
    url = f"http://127.0.0.1:{port}"
    _setup(engine, tiny_model, url)
    ctx = make_context(engine, tmp_path, serve_restart_command=restart, serve_timeout_s=120)
    for v in (1, 2):
        shutil.copytree(tiny_model, tmp_path / f"v{v}")
    try:
        _register(engine, 1, tmp_path / "v1")
        report = serve_current_version(ctx, "remote")
        assert (report.action, report.served_name) == (ServeAction.RESTARTED, "remote-v1")
        first_pid = int(pidfile.read_text())
        assert predict(ctx, "remote", samples=2).rollouts == 4
        assert _backends(engine, 1) == {f"openai:{url}/remote-v1"}

        _register(engine, 2, tmp_path / "v2")  # registered, not yet served
        _questions(engine, range(2, 4))
        with pytest.raises(NotServingError, match=r"serves \['remote-v1'\], not 'remote-v2'"):
            predict(ctx, "remote", samples=2)
        assert _backends(engine, 2) == set()

        assert serve_current_version(ctx, "remote").action is ServeAction.RESTARTED
        assert int(pidfile.read_text()) != first_pid
        with pytest.raises(ProcessLookupError):
            os.kill(first_pid, 0)  # the previous version's server is gone
        assert predict(ctx, "remote", samples=2).rollouts == 4
        assert _backends(engine, 2) == {f"openai:{url}/remote-v2"}
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGTERM)


def test_a_full_checkpoint_without_a_restart_command_is_refused_naming_the_setting(
    engine, tiny_model: Path, tmp_path: Path
) -> None:
    _setup(engine, tiny_model, f"http://127.0.0.1:{_free_port()}")
    shutil.copytree(tiny_model, tmp_path / "v1")
    _register(engine, 1, tmp_path / "v1")
    with pytest.raises(ValueError, match="FW_SERVE_RESTART_COMMAND is not set"):
        serve_current_version(make_context(engine, tmp_path), "remote")


def _training_runs(engine) -> int:
    with session_scope(engine) as session:
        return session.scalar(select(func.count()).select_from(TrainingRunRow))


def test_a_full_weights_update_of_an_http_agent_without_a_restart_command_is_refused_first(
    engine, db_url: str, tiny_model: Path, tmp_path: Path
) -> None:
    """Registered, it could never be served and predict would refuse the agent from then on:
    refused before a training run starts, with one line that says how to fix it."""
    _setup(engine, tiny_model, f"http://127.0.0.1:{_free_port()}")
    ctx = make_context(engine, tmp_path)
    how = r"FW_SERVE_RESTART_COMMAND is not set; set it .* or train a LoRA adapter"
    with pytest.raises(NotServableError, match=how):
        replay_and_train(ctx, "remote", TrainOptions(lora=False))
    with pytest.raises(NotServableError, match=how):
        supervised_finetune(ctx, "remote", [], TrainOptions(lora=False))
    assert _training_runs(engine) == 0
    assert not (tmp_path / "checkpoints" / "remote" / "v1").exists()

    result = CliRunner().invoke(app, ["train", "--agent", "remote", "--db", db_url])
    assert result.exit_code == 2, result.output
    (line,) = [text for text in result.output.splitlines() if text.strip()]
    assert "FW_SERVE_RESTART_COMMAND" in line and "--lora" in line, line
    with session_scope(engine) as session:
        agent = get_agent(session, "remote")
        assert latest_policy_version(session, agent.id).version == 0
    assert _training_runs(engine) == 0


def test_the_replay_and_train_deployment_leaves_lora_to_the_agent() -> None:
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    (replay,) = [d for d in deployments if d["name"] == "replay-and-train"]
    assert TrainOptions(**replay["parameters"]["train"]).lora is None
    assert DAILY_TRAIN.lora is None
    assert signature(replay_and_train_flow.fn).parameters["train"].default.lora is None


def test_replay_and_train_flow_trains_an_http_agent_as_an_adapter_the_server_then_serves(
    prefect_harness, tiny_model: Path, tmp_path: Path, monkeypatch
) -> None:
    db_url = f"sqlite:///{tmp_path / 'fw.db'}"
    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FW_DB_URL", db_url)
    monkeypatch.delenv("FW_SERVE_RESTART_COMMAND", raising=False)
    engine = make_engine(db_url)
    upgrade_database(engine)
    state = ServerState(backend=LocalBackend.from_pretrained(tiny_model), served_name="model")
    with serve_completions(state) as url:
        _setup(engine, tiny_model, url)
        ctx = make_context(engine, tmp_path)
        predict(ctx, "remote", samples=3)
        resolve_every_question(engine)
        backfill_rewards(ctx.at(RESOLVED_AT))
        report = replay_and_train_flow(
            agent="remote",
            as_of=RESOLVED_AT.isoformat(),
            train=TrainOptions(min_groups=1, config=TrainConfig(learning_rate=1e-3)),
        )
        assert report is not None and report.to_version == 1
        assert is_lora_adapter(Path(report.checkpoint_path))
        assert state.adapters == {"remote-v1": report.checkpoint_path}
        _questions(engine, range(2, 4))  # open as of RESOLVED_AT
        predicted = predict(ctx.at(RESOLVED_AT), "remote", samples=1)
    assert (predicted.policy_version, predicted.rollouts) == (1, 2)
    assert _backends(engine, 1) == {f"openai:{url}/remote-v1"}
    engine.dispose()
