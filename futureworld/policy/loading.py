"""Building a backend from a description: which kind, which model, which adapter.

Flows call `load_backend` with what an agent's policy version records; the registry at the
bottom maps each generating `BackendKind` (not the baselines) to its loader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from futureworld.domain import BackendKind
from futureworld.policy.base import PolicyBackend
from futureworld.policy.local import LocalBackend
from futureworld.policy.openai_http import OpenAIHttpBackend


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """Everything needed to sample from one policy version."""

    kind: BackendKind
    """Which backend; see `BackendKind`."""
    model_dir: Path
    """The base model directory (local: the weights; openai: the tokenizer)."""
    adapter_dir: Path | None = None
    """The policy version's LoRA adapter; None samples the base model."""
    device: str = "cpu"
    """local only: torch device."""
    torch_threads: int | None = None
    """local only: torch intra-op threads of the process sampling; None: the cores it may use
    (futureworld.torch_threads)."""
    base_url: str | None = None
    """openai only: the server root, e.g. http://127.0.0.1:8000."""
    served_model: str | None = None
    """openai only: the base model's served name; defaults to model_dir's name."""
    adapter_name: str | None = None
    """openai only: the name the adapter is registered under; defaults to adapter_dir's name."""
    timeout_s: float = 300.0
    """openai only: per-request timeout."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", BackendKind(self.kind))
        if not self.kind.generates:
            raise ValueError(f"a {self.kind} agent has no generation backend")
        if self.kind is BackendKind.OPENAI and not self.base_url:
            raise ValueError("an openai backend needs base_url")


def cached_model_dir(repo_id: str, *, cache_dir: Path | None = None) -> Path | None:
    """The snapshot of Hugging Face Hub model `repo_id` (ORG/NAME, its `main` revision) in
    the local Hub cache (`cache_dir`, default huggingface_hub's own: HF_HUB_CACHE), or None
    when it is not there. Never downloads."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True))
    except (HFValidationError, LocalEntryNotFoundError):
        return None


def _load_local(spec: BackendSpec) -> PolicyBackend:
    return LocalBackend.from_pretrained(
        spec.model_dir, spec.adapter_dir, device=spec.device, torch_threads=spec.torch_threads
    )


def _load_openai(spec: BackendSpec) -> PolicyBackend:
    assert spec.base_url is not None  # checked in BackendSpec.__post_init__
    backend = OpenAIHttpBackend.from_tokenizer_dir(
        spec.model_dir,
        base_url=spec.base_url,
        model=spec.served_model or Path(spec.model_dir).name,
        timeout_s=spec.timeout_s,
    )
    if spec.adapter_dir is None:
        return backend
    name = spec.adapter_name or Path(spec.adapter_dir).name
    backend.load_adapter(name, spec.adapter_dir)
    return backend.with_model(name)


def load_backend(spec: BackendSpec) -> PolicyBackend:
    """The backend `spec` describes, ready to generate."""
    return BACKEND_LOADERS[spec.kind](spec)


BACKEND_LOADERS: dict[BackendKind, Callable[[BackendSpec], PolicyBackend]] = {
    BackendKind.LOCAL: _load_local,
    BackendKind.OPENAI: _load_openai,
}
