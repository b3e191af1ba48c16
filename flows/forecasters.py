"""One forecaster interface, two implementations: the multi-turn LLM loop over a generation
backend, and the baselines (crowd, base rate, uniform). The predict stage claims questions
and persists what a forecaster returns; it never asks what kind of agent it is serving.
The registry at the bottom maps each `BackendKind` to its forecaster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from futureworld.agent.loop import run_group
from futureworld.baselines import BASELINES, Baseline, baseline_trajectory
from futureworld.domain import Agent, BackendKind, PolicyVersion, Question, Trajectory
from storage.engine import session_scope
from storage.repositories.questions import resolved_history

if TYPE_CHECKING:
    from flows.context import PipelineContext


class Forecaster(Protocol):
    """Answers one question's missing samples with trajectories ready to persist."""

    max_samples: int | None
    """At most this many samples per question (None: as many as asked)."""
    claim_batch: int
    """Questions claimed at a time: what a crash may lose, against claim round trips."""

    def forecast(self, question: Question, missing: Sequence[int]) -> list[Trajectory]:
        """Trajectories for the sample indices `missing` of `question`'s group."""
        ...


class LoopForecaster:
    """An LLM agent: G rollouts of the research loop per question, on the policy version's
    backend, searching the corpus as of the question's cut-off. Each group's seed is a hash
    of (the agent's seed, question, version, first missing sample), so reruns reproduce it."""

    max_samples = None
    claim_batch = 1

    def __init__(self, ctx: PipelineContext, agent: Agent, version: PolicyVersion) -> None:
        assert agent.id is not None
        self._agent_id = agent.id
        self._version = version.version
        self._settings = agent.generation
        self._backend = ctx.backend(agent, version)
        self._corpus = ctx.corpus

    def forecast(self, question: Question, missing: Sequence[int]) -> list[Trajectory]:
        from flows.context import hash_seed

        if not missing:
            return []
        trajectories = run_group(
            question,
            self._backend,
            self._corpus,
            samples=len(missing),
            settings=self._settings,
            seed=hash_seed(self._settings.seed, question.id, self._version, missing[0]),
            agent_id=self._agent_id,
            policy_version=self._version,
            as_of=question.info_cutoff_at,
        )
        return [replace(t, sample_index=i) for t, i in zip(trajectories, missing, strict=True)]


class BaselineForecaster:
    """A reference forecaster: one token-free answer per question, instantly."""

    max_samples = 1
    claim_batch = 1000

    def __init__(self, ctx: PipelineContext, agent: Agent, version: PolicyVersion) -> None:
        try:
            self._forecast = BASELINES[Baseline(agent.base_model)]
        except ValueError:
            known = ", ".join(b.value for b in Baseline)
            raise ValueError(
                f"agent {agent.name!r}: unknown baseline {agent.base_model!r} ({known})"
            ) from None
        assert agent.id is not None
        self._agent_id = agent.id
        self._version = version.version
        self._as_of = ctx.as_of
        with session_scope(ctx.engine) as session:
            self._history = resolved_history(session)

    def forecast(self, question: Question, missing: Sequence[int]) -> list[Trajectory]:
        if not missing:
            return []
        p_yes = self._forecast(question, self._history)
        return [
            baseline_trajectory(
                question,
                p_yes,
                agent_id=self._agent_id,
                policy_version=self._version,
                as_of=self._as_of,
            )
        ]


ForecasterFactory = Callable[["PipelineContext", Agent, PolicyVersion], Forecaster]

FORECASTERS: dict[BackendKind, ForecasterFactory] = {
    BackendKind.LOCAL: LoopForecaster,
    BackendKind.OPENAI: LoopForecaster,
    BackendKind.BASELINE: BaselineForecaster,
}
