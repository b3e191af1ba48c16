"""The composition root: settings → engine, clock (as-of and run key), generation backends,
corpus and question judge. Every entrance (the CLI, the Prefect flows, the
timers, the demo, the benchmarks) builds its `PipelineContext` here and nowhere else; the
stages (flows.stages) take one and never build their own dependencies.

Nothing here runs at import time: an engine, a backend or the judge is built when asked for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine

from flows.settings import Settings, parse_as_of
from futureworld.baselines import Baseline
from futureworld.domain import Agent, BackendKind, PolicyVersion
from futureworld.policy.base import PolicyBackend, SamplingParams, is_lora_adapter
from futureworld.sources.http import HttpConfig
from futureworld.sources.platforms import SourceName
from futureworld.sources.question_judge import Complete
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.agents import (
    ensure_agent,
    get_agent,
    latest_policy_version,
    served_policy_version,
)

if TYPE_CHECKING:  # torch and transformers load when a backend is built, not at start-up
    from futureworld.policy.loading import BackendSpec
    from storage.search import ArticleCorpus


def run_key_for(as_of: datetime) -> str:
    """A run's key: its as-of date (YYYY-MM-DD). It names the run and keys its events, so
    re-running a day is recognisable (the stages are idempotent)."""
    return as_of.date().isoformat()


def served_name(agent: Agent, version: PolicyVersion) -> str:
    """The name a vLLM server samples a policy version under (v > 0: adapter or checkpoint)."""
    return f"{agent.name}-v{version.version}"


def hash_seed(*parts: int | None) -> int:
    """A 32-bit seed from parts (a group's seed: base seed, question, version, sample)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


@dataclass(frozen=True, kw_only=True)
class PipelineContext:
    """What a stage needs: settings, an engine on the migrated database, the run's instant."""

    settings: Settings
    engine: Engine
    as_of: datetime
    """The run's instant (tz-aware UTC): live, now; in a replay or the demo, the clock."""
    run_key: str
    """Names the run and keys its pipeline events (default: the as-of date)."""
    judge_override: Complete | None = field(default=None, repr=False)
    """A judge given directly (a scripted one in tests); else FW_JUDGE_AGENT's model."""

    @cached_property
    def http(self) -> HttpConfig:
        return HttpConfig(
            timeout_s=self.settings.http_timeout_s,
            max_retries=self.settings.http_max_retries,
            user_agent=self.settings.user_agent,
            default_rate_per_s=self.settings.http_rate_per_s,
        )

    def source_base_url(self, source: SourceName) -> str:
        return str(getattr(self.settings, f"{source.value}_base_url"))

    def source_token(self, source: SourceName) -> str | None:
        secret = self.settings.metaculus_token if source is SourceName.METACULUS else None
        return secret.get_secret_value() if secret is not None else None

    @cached_property
    def corpus(self) -> ArticleCorpus:
        from storage.search import ArticleCorpus

        return ArticleCorpus(self.engine)

    @cached_property
    def judge(self) -> Complete | None:
        """The question judge: a text completion over FW_JUDGE_AGENT's newest policy, or None
        (generated questions then wait for `futureworld resolve --manual`)."""
        if self.judge_override is not None:
            return self.judge_override
        if self.settings.judge_agent is None:
            return None
        return self.text_completer(self.settings.judge_agent)

    def at(self, as_of: datetime, *, run_key: str | None = None) -> PipelineContext:
        """The same wiring at another instant (a simulated clock, a backtest day)."""
        return PipelineContext(
            settings=self.settings,
            engine=self.engine,
            as_of=as_of,
            run_key=run_key or run_key_for(as_of),
            judge_override=self.judge_override,
        )

    def agent(self, name: str) -> Agent:
        """A registered agent; the built-in baselines (crowd, base-rate, uniform) register
        themselves on first use, so they run on a fresh database without `agent add`."""
        with session_scope(self.engine) as session:
            try:
                return get_agent(session, name)
            except LookupError:
                if name not in {b.value for b in Baseline}:
                    raise
                return ensure_agent(
                    session, Agent(name=name, base_model=name, backend=BackendKind.BASELINE)
                )

    def current_version(self, agent: Agent) -> PolicyVersion:
        """The agent's served version, its newest promoted one (ARCHITECTURE §9b): what predict
        samples, the judge and the server use, and the version the next update starts from. A
        candidate or rejected version is never it."""
        with session_scope(self.engine) as session:
            return served_policy_version(session, agent.id)

    def newest_version(self, agent: Agent) -> PolicyVersion:
        """The agent's newest registered version, whatever its status: an update registers
        its version as the one after it (and writes its checkpoint under that number)."""
        with session_scope(self.engine) as session:
            return latest_policy_version(session, agent.id)

    def backend_spec(self, agent: Agent, version: PolicyVersion) -> BackendSpec:
        """How to sample one policy version. A LoRA adapter is served over the agent's base
        model; a full checkpoint is its own model directory (over HTTP: the server restarted
        on it under the version's served name, `served_name`)."""
        from futureworld.policy.loading import BackendSpec

        checkpoint = Path(version.checkpoint_path)
        adapter = checkpoint if is_lora_adapter(checkpoint) else None
        if agent.backend is BackendKind.LOCAL:
            return BackendSpec(
                kind=agent.backend,
                model_dir=Path(agent.base_model) if adapter is not None else checkpoint,
                adapter_dir=adapter,
                device=self.settings.device,
                torch_threads=self.settings.torch_threads,
            )
        if version.version > 0 and adapter is None:
            # a full checkpoint is served by a server restarted on it (flows.stages.serving)
            return BackendSpec(
                kind=agent.backend,
                model_dir=checkpoint,
                base_url=agent.base_url,
                served_model=served_name(agent, version),
            )
        return BackendSpec(
            kind=agent.backend,
            model_dir=Path(agent.base_model),
            adapter_dir=adapter,
            base_url=agent.base_url,
            served_model=agent.served_model,
            adapter_name=served_name(agent, version),
        )

    def backend(self, agent: Agent, version: PolicyVersion) -> PolicyBackend:
        from futureworld.policy.loading import load_backend

        return load_backend(self.backend_spec(agent, version))

    def tokenizer(self, agent: Agent, version: PolicyVersion) -> Any:
        """A policy version's tokenizer (local files only): its checkpoint's, else the base's."""
        from transformers import AutoTokenizer

        source = Path(version.checkpoint_path)
        if not (source / "tokenizer_config.json").is_file():
            source = Path(agent.base_model)
        return AutoTokenizer.from_pretrained(source, local_files_only=True)

    def text_completer(self, agent_name: str) -> Complete:
        """A text-in, text-out completion over an agent's served policy (the question judge)."""
        from futureworld.agent.prompts import encode_chat

        agent = self.agent(agent_name)
        backend = self.backend(agent, self.current_version(agent))
        params = SamplingParams(temperature=0.3, max_new_tokens=256, seed=0)

        def complete(prompt: str) -> str:
            [generation] = backend.generate([encode_chat(backend.tokenizer, prompt)], params)
            return backend.tokenizer.decode(generation.token_ids, skip_special_tokens=True)

        return complete

    def checkpoint_dir(self, agent: Agent, version: int) -> Path:
        return self.settings.data_dir.resolve() / "checkpoints" / agent.name / f"v{version}"

    @property
    def reports_dir(self) -> Path:
        return self.settings.data_dir / "reports"


def build_context(
    settings: Settings,
    engine: Engine,
    *,
    as_of: str | datetime | None = None,
    run_key: str | None = None,
    judge: Complete | None = None,
) -> PipelineContext:
    """A context on an engine the caller owns (already migrated)."""
    moment = parse_as_of(as_of)
    return PipelineContext(
        settings=settings,
        engine=engine,
        as_of=moment,
        run_key=run_key or run_key_for(moment),
        judge_override=judge,
    )


def open_engine(settings: Settings) -> Engine:
    """The engine of the configured database, migrated to head."""
    engine = make_engine(settings.database_url)
    upgrade_database(engine)
    return engine


@contextmanager
def open_context(
    settings: Settings | None = None,
    *,
    db_url: str | None = None,
    as_of: str | datetime | None = None,
    run_key: str | None = None,
) -> Iterator[PipelineContext]:
    """A context with its own engine on the migrated database, disposed on exit.

    `settings` defaults to the environment's (FW_*); `db_url` overrides its database.
    """
    settings = (settings or Settings()).with_db(db_url)
    engine = open_engine(settings)
    try:
        yield build_context(settings, engine, as_of=as_of, run_key=run_key)
    finally:
        engine.dispose()
