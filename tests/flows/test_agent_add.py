"""`futureworld agent add --model ORG/NAME` takes the model from the local Hugging Face cache
and never downloads: a cached model is registered at its snapshot folder; one that is not
cached is refused in one line that says how to get it (exit 2). Each run is a fresh process
whose Hub cache (HF_HUB_CACHE) is a temporary folder in the cache's own layout and whose Hub
endpoint (HF_ENDPOINT) is a loopback server that counts the requests it gets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from futureworld.policy.local import LocalBackend
from futureworld.policy.tiny import init_tiny_model
from storage.engine import make_engine, session_scope
from storage.repositories.agents import get_agent

ROOT = Path(__file__).resolve().parents[2]
REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_endpoint() -> Iterator[tuple[str, list[str]]]:
    """A stand-in for the Hub that answers 404 and records every path asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", asked
    server.shutdown()
    server.server_close()


def cache_model(hub_cache: Path, repo_id: str, model_dir: Path) -> Path:
    """Lay `model_dir` out as huggingface_hub caches a download of `repo_id`'s main."""
    org, name = repo_id.split("/")
    repo = hub_cache / f"models--{org}--{name}"
    snapshot = repo / "snapshots" / REVISION
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    return snapshot


def agent_add(tmp_path: Path, endpoint: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_ENDPOINT": endpoint})
    db = f"sqlite:///{tmp_path / 'fw.db'}"
    return subprocess.run(
        [sys.executable, "-m", "flows", "agent", "add", *args, "--db", db],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_cached_hub_model_is_registered_at_its_snapshot_without_a_download(
    tmp_path: Path, hub_endpoint: tuple[str, list[str]]
) -> None:
    endpoint, asked = hub_endpoint
    model = init_tiny_model(tmp_path / "built", seed=4)
    snapshot = cache_model(tmp_path / "hub", "tinyorg/tiny-model", model)
    done = agent_add(tmp_path, endpoint, "tiny", "--model", "tinyorg/tiny-model")
    assert done.returncode == 0, done.stderr
    assert asked == []
    engine = make_engine(f"sqlite:///{tmp_path / 'fw.db'}")
    with session_scope(engine) as session:
        agent = get_agent(session, "tiny")
    engine.dispose()
    assert Path(agent.base_model) == snapshot
    assert LocalBackend.from_pretrained(Path(agent.base_model)).tokenizer is not None


def test_a_hub_model_not_in_the_cache_is_refused_in_one_line_saying_how_to_get_it(
    tmp_path: Path, hub_endpoint: tuple[str, list[str]]
) -> None:
    endpoint, asked = hub_endpoint
    (tmp_path / "hub").mkdir()
    done = agent_add(tmp_path, endpoint, "absent", "--model", "tinyorg/absent-model")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "hf download tinyorg/absent-model" in line, line
    assert "huggingface-cli download tinyorg/absent-model" in line
    assert "local model directory" in line
    assert asked == []
    assert not (tmp_path / "fw.db").exists()  # refused before the database is opened
