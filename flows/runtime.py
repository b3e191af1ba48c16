"""Builds what the stages need at run time — generation backends, corpus, progress bars —
from settings. Nothing here runs at import time."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import fields, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import Engine

from flows.settings import Settings
from flows.stages.predicting import GroupRunner, PredictReport, predict
from futureworld.agent.loop import AgentConfig
from futureworld.domain import Agent, PolicyVersion, Question, Trajectory
from futureworld.policy.base import SamplingParams
from futureworld.policy.loading import BackendKind, BackendSpec, load_backend
from storage.engine import session_scope
from storage.repositories.agents import get_policy_version


def predict_with_progress(
    engine: Engine,
    settings: Settings,
    agent_name: str,
    *,
    samples: int,
    as_of: datetime | None,
    limit: int | None,
) -> PredictReport:
    """Run `predict` with a rich progress bar of questions and rollouts per second."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rollouts]} rollouts · {task.fields[rate]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(f"predict {agent_name}", total=limit, rollouts=0, rate="")
        counts = {"rollouts": 0}

        def on_group(n: int) -> None:
            counts["rollouts"] += n
            progress.advance(task)
            elapsed = progress.tasks[task].elapsed or 1e-9
            done = progress.tasks[task].completed
            progress.update(
                task,
                rollouts=counts["rollouts"],
                rate=f"{done / elapsed:.1f} q/s, {counts['rollouts'] / elapsed:.1f} r/s",
            )

        return predict(
            engine,
            agent_name,
            samples=samples,
            as_of=as_of,
            limit=limit,
            worker=settings.worker_id,
            lease_s=settings.claim_lease_s,
            on_group=on_group,
            runner_factory=runner_factory(settings, engine),
        )


def generation_settings(generation: dict[str, Any]) -> tuple[AgentConfig, SamplingParams]:
    """Split an agent's stored generation settings into the loop's and the sampler's configs;
    an unknown key is an error (it would otherwise be silently ignored)."""
    loop_keys = {f.name for f in fields(AgentConfig)}
    sampling_keys = {f.name for f in fields(SamplingParams)} - {"stop", "max_new_tokens"}
    unknown = set(generation) - loop_keys - sampling_keys - {"served_model"}
    if unknown:
        raise ValueError(f"unknown generation settings {sorted(unknown)}")
    loop = AgentConfig(**{k: v for k, v in generation.items() if k in loop_keys})
    sampling = SamplingParams(**{k: v for k, v in generation.items() if k in sampling_keys})
    return loop, sampling


def backend_spec(settings: Settings, agent: Agent, version: PolicyVersion) -> BackendSpec:
    """Describe the backend of one policy version.

    A checkpoint directory holding `adapter_config.json` is a LoRA adapter over the agent's
    base model; otherwise it is a full model directory (which the HTTP backend cannot load:
    a vLLM server serves adapters next to the base weights it was started with).
    """
    checkpoint = Path(version.checkpoint_path)
    adapter = checkpoint if (checkpoint / "adapter_config.json").is_file() else None
    try:
        kind = BackendKind(agent.backend)
    except ValueError:
        raise ValueError(f"agent {agent.name!r}: unknown backend {agent.backend!r}") from None
    if kind is BackendKind.LOCAL:
        model_dir = Path(agent.base_model) if adapter is not None else checkpoint
        return BackendSpec(
            kind=kind, model_dir=model_dir, adapter_dir=adapter, device=settings.device
        )
    if version.version > 0 and adapter is None:
        raise ValueError(
            f"{agent.name} v{version.version}: the HTTP backend serves LoRA adapters only; "
            "train with --lora or serve the full checkpoint as its own model"
        )
    return BackendSpec(
        kind=kind,
        model_dir=Path(agent.base_model),
        adapter_dir=adapter,
        base_url=agent.base_url,
        served_model=agent.generation.get("served_model"),
        adapter_name=f"{agent.name}-v{version.version}",
    )


def runner_factory(
    settings: Settings, engine: Engine, *, seed: int = 0
) -> Callable[[Agent, int, datetime], GroupRunner]:
    """Builds the group runner of an LLM agent: its policy version's backend, the corpus
    (searched as of min(forecast instant, the question's cut-off)), and the multi-turn loop."""
    from futureworld.agent.loop import run_group
    from storage.search import ArticleCorpus

    def factory(agent: Agent, version_number: int, as_of: datetime) -> GroupRunner:
        with session_scope(engine) as session:
            version = get_policy_version(session, agent.id, version_number)
        backend = load_backend(backend_spec(settings, agent, version))
        loop_config, sampling = generation_settings(agent.generation)
        corpus = ArticleCorpus(engine)

        def run(question: Question, missing: Sequence[int]) -> list[Trajectory]:
            if not missing:
                return []
            # One seed per (question, version, first missing sample): reruns are reproducible.
            group_seed = hash_seed(seed, question.id, version_number, missing[0])
            trajectories = run_group(
                question,
                backend,
                corpus,
                samples=len(missing),
                params=replace(sampling, seed=group_seed),
                agent_id=agent.id,
                policy_version=version_number,
                as_of=question.info_cutoff_at,
                config=loop_config,
            )
            return [replace(t, sample_index=i) for t, i in zip(trajectories, missing, strict=True)]

        return run

    return factory


def hash_seed(*parts: int | None) -> int:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def agent_tokenizer(engine: Engine, agent_name: str) -> tuple[Agent, PolicyVersion, Any]:
    """The agent, its newest policy version and that version's tokenizer (local files only)."""
    from transformers import AutoTokenizer

    from storage.repositories.agents import get_agent, latest_policy_version

    with session_scope(engine) as session:
        agent = get_agent(session, agent_name)
        version = latest_policy_version(session, agent.id)
    source = Path(version.checkpoint_path)
    if not (source / "tokenizer_config.json").is_file():
        source = Path(agent.base_model)
    return agent, version, AutoTokenizer.from_pretrained(source, local_files_only=True)


def sft_trajectories_from_jsonl(
    engine: Engine, settings: Settings, agent_name: str, path: Path
) -> list[Trajectory]:
    """Demonstrations from a JSONL file, tokenized with the agent's tokenizer."""
    from futureworld.agent.demonstrations import demonstration_trajectory, read_demonstrations

    agent, version, tokenizer = agent_tokenizer(engine, agent_name)
    demonstrations = read_demonstrations(path.read_text(encoding="utf-8"), str(path))
    return [
        demonstration_trajectory(
            tokenizer, d, agent_id=agent.id, policy_version=version.version, sample_index=i
        )
        for i, d in enumerate(demonstrations)
    ]


def text_completer(settings: Settings, engine: Engine, agent_name: str) -> Callable[[str], str]:
    """A text-in, text-out completion over an agent's newest policy (the question judge)."""
    from futureworld.agent.prompts import encode_chat
    from storage.repositories.agents import get_agent, latest_policy_version

    with session_scope(engine) as session:
        agent = get_agent(session, agent_name)
        version = latest_policy_version(session, agent.id)
    backend = load_backend(backend_spec(settings, agent, version))
    params = SamplingParams(temperature=0.3, max_new_tokens=256, seed=0)

    def complete(prompt: str) -> str:
        [generation] = backend.generate([encode_chat(backend.tokenizer, prompt)], params)
        return backend.tokenizer.decode(generation.token_ids, skip_special_tokens=True)

    return complete


def configured_judge(settings: Settings, engine: Engine) -> Callable[[str], str] | None:
    return (
        None
        if settings.judge_agent is None
        else text_completer(settings, engine, settings.judge_agent)
    )
