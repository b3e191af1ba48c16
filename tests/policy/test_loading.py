from __future__ import annotations

from pathlib import Path

import pytest

from futureworld.policy.base import SamplingParams
from futureworld.policy.loading import BACKEND_LOADERS, BackendKind, BackendSpec, load_backend
from futureworld.policy.local import LocalBackend
from tests.policy.completions_server import ServerState, serve_completions


def test_every_generating_backend_kind_has_a_loader():
    assert set(BACKEND_LOADERS) == {kind for kind in BackendKind if kind.generates}


def test_a_baseline_has_no_generation_backend(tiny_model_dir: Path):
    with pytest.raises(ValueError, match="no generation backend"):
        BackendSpec(kind=BackendKind.BASELINE, model_dir=tiny_model_dir)


def test_local_spec_loads_a_local_backend(tiny_model_dir: Path):
    backend = load_backend(BackendSpec(kind="local", model_dir=tiny_model_dir))
    assert isinstance(backend, LocalBackend)


def test_openai_spec_registers_the_adapter_and_samples_from_it(
    tiny_backend: LocalBackend, tiny_model_dir: Path
):
    state = ServerState(backend=tiny_backend, served_name=tiny_model_dir.name)
    with serve_completions(state) as url:
        spec = BackendSpec(
            kind=BackendKind.OPENAI,
            model_dir=tiny_model_dir,
            adapter_dir=Path("/checkpoints/agent1/v4"),
            base_url=url,
        )
        backend = load_backend(spec)
        backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=3, seed=0))
    assert state.adapters == {"v4": "/checkpoints/agent1/v4"}
    assert state.requests[-1][1]["model"] == "v4"


def test_openai_spec_without_url_is_rejected(tiny_model_dir: Path):
    with pytest.raises(ValueError, match="base_url"):
        BackendSpec(kind=BackendKind.OPENAI, model_dir=tiny_model_dir)
