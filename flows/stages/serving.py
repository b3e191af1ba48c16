"""Serve: after a version is registered, make the serving side sample from it before the
next predict. Local agents need nothing (predict loads the version's weights or adapter in
its own process). For an agent on a vLLM server (the HTTP backend):

- a LoRA version is loaded into the running server (POST /v1/load_lora_adapter) under its
  served name `{agent}-v{N}`;
- a full checkpoint needs the server's weights replaced. vLLM's documented weight updates
  (sleep level 2 + `collective_rpc("reload_weights")`, and the NCCL/IPC weight-transfer API
  behind VLLM_SERVER_DEV_MODE) push tensors from a live, connected trainer process and keep
  the served name, so a client cannot tell one version from the next; here the trainer is a
  separate process that has exited, leaving a safetensors checkpoint. So the server process
  is restarted on the checkpoint under the version's own name by
  `settings.serve_restart_command` (infra/vllm/restart.sh; {checkpoint}, {served_name} and
  {port} filled in); the checkpoint path must be readable where the server runs.

Either way the step then waits until GET /health answers and GET /v1/models lists the name
(`settings.serve_timeout_s`). Predict's HTTP backend refuses to sample a name the server does
not list, so a skipped or failed serve step stops predict instead of mislabelling rollouts.
Re-running the step is safe: a name the server already lists is left alone (no second
adapter load, no restart), so the step runs before every predict at the cost of one GET.

An update whose version could not be served is refused before it trains (`check_servable`):
a full-weights version of an HTTP agent without a restart command would be registered, fail
here, and leave predict refusing the agent until someone serves it by hand.
"""

from __future__ import annotations

import shlex
import subprocess
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from flows.context import PipelineContext
from flows.stages.lineage import LineageError
from futureworld.domain import Agent, BackendKind, PolicyVersion

if TYPE_CHECKING:  # the HTTP backend loads transformers: only when an agent needs it
    from futureworld.policy.openai_http import OpenAIHttpBackend

RESTART_OUTPUT_TAIL_CHARS = 2000


class ServeAction(StrEnum):
    IN_PROCESS = "in_process"
    """A local agent: predict loads the version itself."""
    ADAPTER_LOADED = "adapter_loaded"
    """A LoRA version loaded into the running server."""
    RESTARTED = "restarted"
    """The server restarted on a full checkpoint."""
    ALREADY_SERVED = "already_served"
    """The server already serves the version (version 0: the model it was started with)."""


@dataclass(frozen=True)
class ServeReport:
    agent: str
    version: int
    action: ServeAction
    served_name: str | None = None
    """The name the server samples the version under (None for local agents)."""
    waited_s: float = 0.0
    """Seconds until the server listed the version."""


class NotServableError(LineageError):
    """An update would register a version the agent's server cannot be made to serve; found
    before any training. A LineageError, so every entrance reports it as the caller's to fix."""


def check_servable(ctx: PipelineContext, agent: Agent, *, lora: bool) -> None:
    """Refuse a full-weights update of an agent on a vLLM server (the HTTP backend) when no
    restart command is configured: the serve step could not put its version on the server.
    A LoRA version is loaded into the running server; a local agent needs no server."""
    if agent.backend is not BackendKind.OPENAI or lora or ctx.settings.serve_restart_command:
        return
    raise NotServableError(
        f"{agent.name} is served by the vLLM server at {agent.base_url}: a full-weights version "
        "needs that server restarted on it, and FW_SERVE_RESTART_COMMAND is not set; set it "
        "(e.g. 'infra/vllm/restart.sh {checkpoint} {served_name}') or train a LoRA adapter "
        "(`futureworld train --lora`, or lora: true in the train options)"
    )


def serve_current_version(ctx: PipelineContext, agent_name: str) -> ServeReport:
    """Make `agent_name`'s serving side sample its served version, its newest promoted one
    (see the module docstring)."""
    agent = ctx.agent(agent_name)
    return serve_version(ctx, agent, ctx.current_version(agent))


def serve_version(ctx: PipelineContext, agent: Agent, version: PolicyVersion) -> ServeReport:
    """Make the agent's serving side able to sample `version`: the serve step for the served
    version, and the promotion gate for a candidate it must forecast with (a full-weights
    candidate restarts the server on it; the serve step before the next predict restarts it
    on the served version if the candidate was rejected)."""
    if agent.backend is not BackendKind.OPENAI:
        return ServeReport(agent.name, version.version, ServeAction.IN_PROCESS)
    from futureworld.policy.openai_http import OpenAIHttpBackend

    spec = ctx.backend_spec(agent, version)
    assert spec.base_url is not None  # BackendSpec refuses an openai spec without one
    name = spec.adapter_name if spec.adapter_dir is not None else None
    name = name or spec.served_model or spec.model_dir.name
    backend = OpenAIHttpBackend.from_tokenizer_dir(
        spec.model_dir, base_url=spec.base_url, model=name
    )
    try:
        if _serves(backend, name):
            action = ServeAction.ALREADY_SERVED
        elif spec.adapter_dir is not None:
            backend.load_adapter(name, spec.adapter_dir)
            action = ServeAction.ADAPTER_LOADED
        elif version.version > 0:
            _restart_server(ctx, spec.model_dir, name, spec.base_url)
            action = ServeAction.RESTARTED
        else:
            action = ServeAction.ALREADY_SERVED
        waited = backend.wait_until_serving(ctx.settings.serve_timeout_s)
    finally:
        backend.close()
    return ServeReport(agent.name, version.version, action, served_name=name, waited_s=waited)


def _serves(backend: OpenAIHttpBackend, name: str) -> bool:
    """Whether the server lists `name` now; a server that does not answer does not."""
    from futureworld.policy.openai_http import BackendError

    try:
        return name in backend.served_models()
    except BackendError:
        return False


def _restart_server(ctx: PipelineContext, checkpoint: object, name: str, base_url: str) -> None:
    command = ctx.settings.serve_restart_command
    if not command:
        raise ValueError(
            f"{name} is a full checkpoint: the vLLM server at {base_url} must be restarted on "
            "it, and FW_SERVE_RESTART_COMMAND is not set (e.g. "
            "'infra/vllm/restart.sh {checkpoint} {served_name}')"
        )
    port = urlparse(base_url).port or 80
    fields = {"checkpoint": str(checkpoint), "served_name": name, "port": str(port)}
    args = [part.format(**fields) for part in shlex.split(command)]
    done = subprocess.run(
        args, capture_output=True, text=True, timeout=ctx.settings.serve_timeout_s, check=False
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-RESTART_OUTPUT_TAIL_CHARS:]
        raise RuntimeError(
            f"restarting the server for {name} failed (exit {done.returncode}): "
            f"{shlex.join(args)}\n{tail}"
        )
