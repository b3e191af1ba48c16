"""One forecaster interface, three implementations: the rollout engine over a generation
backend (many questions' groups in flight at once), the baselines (crowd, base rate,
uniform), and imported outside forecasts (which predict never adds to). The predict stage
claims questions and persists what a forecaster hands back, group by group; it never asks
what kind of agent it is serving. The registry at the bottom maps each `BackendKind` to its
forecaster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from futureworld.agent.engine import GroupFailure, GroupJob, RolloutEngine
from futureworld.agent.loop import rollout_seed
from futureworld.baselines import BASELINES, Baseline, baseline_trajectory
from futureworld.domain import Agent, BackendKind, PolicyVersion, Question, Trajectory
from storage.engine import session_scope
from storage.repositories.questions import resolved_history

if TYPE_CHECKING:
    from flows.context import PipelineContext

Work = tuple[Question, tuple[int, ...]]
"""A claimed question and the sample indices of its group still missing."""
OnGroup = Callable[[Question, list[Trajectory]], None]
OnFailure = Callable[[Question, str, str], None]
"""on_failure(question, kind, detail): the group could not be forecast; the run goes on."""
OnNote = Callable[[Question, str, str], None]
"""on_note(question, kind, detail): something worth recording that did not fail the group."""


class Forecaster(Protocol):
    """Turns a stream of claimed work into complete groups, handed back one at a time."""

    max_samples: int | None
    """At most this many samples per question (None: as many as asked)."""
    claim_batch: int
    """Questions claimed per round trip; claims are taken only as the forecaster pulls work."""

    def run(
        self, work: Iterable[Work], on_group: OnGroup, on_failure: OnFailure, on_note: OnNote
    ) -> None:
        """Forecast every piece of work, calling `on_group` as each group completes."""
        ...


class LoopForecaster:
    """An LLM agent: the research loop through the rollout engine, on the policy version's
    backend. A forecast is made as of the run's instant (`ctx.as_of`: now when live, the
    simulated clock in a backtest) and its search sees the corpus as of then, never past the
    question's close (the engine clamps to `close_at`). Rollout i of a question is
    seeded by a hash of (the agent's seed, question, version, i), so a rerun of a partial
    group reproduces exactly the samples it lacks, whatever else is in the batch."""

    max_samples = None
    claim_batch = 16

    def __init__(self, ctx: PipelineContext, agent: Agent, version: PolicyVersion) -> None:
        assert agent.id is not None
        self._settings = agent.generation
        self._version = version.version
        self._as_of = ctx.as_of
        self._engine = RolloutEngine(
            ctx.backend(agent, version),
            ctx.corpus,
            agent.generation,
            agent_id=agent.id,
            policy_version=version.version,
        )

    def run(
        self, work: Iterable[Work], on_group: OnGroup, on_failure: OnFailure, on_note: OnNote
    ) -> None:
        def jobs() -> Iterator[GroupJob]:
            for question, missing in work:
                assert question.id is not None
                yield GroupJob(
                    question=question,
                    samples=missing,
                    seeds=tuple(
                        rollout_seed(self._settings.seed, question.id, self._version, i)
                        for i in missing
                    ),
                    as_of=self._as_of,
                )

        def failed(failure: GroupFailure) -> None:
            on_failure(failure.job.question, str(failure.kind), failure.detail)

        stats = self._engine.run(jobs(), lambda job, group: on_group(job.question, group), failed)
        for job, cut in stats.cut_prompts:
            on_note(job.question, "prompt_cut", cut)


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
            self._history = resolved_history(session, as_of=ctx.as_of)

    def run(
        self, work: Iterable[Work], on_group: OnGroup, on_failure: OnFailure, on_note: OnNote
    ) -> None:
        for question, missing in work:
            if not missing:
                continue
            try:
                p_yes = self._forecast(question, self._history)
                trajectory = baseline_trajectory(
                    question,
                    p_yes,
                    agent_id=self._agent_id,
                    policy_version=self._version,
                    as_of=self._as_of,
                )
            except Exception as error:  # One question's failure is recorded, not raised.
                on_failure(question, "forecast_error", f"{type(error).__name__}: {error}")
                continue
            on_group(question, [trajectory])


class ImportedForecaster:
    """An outside forecaster (BackendKind.EXTERNAL): its forecasts come only from
    `futureworld import forecasts`, so predict claims and writes nothing for it (claims are
    taken only as a forecaster pulls work, and this one pulls none)."""

    max_samples = 1
    claim_batch = 1

    def __init__(self, ctx: PipelineContext, agent: Agent, version: PolicyVersion) -> None:
        del ctx, agent, version

    def run(
        self, work: Iterable[Work], on_group: OnGroup, on_failure: OnFailure, on_note: OnNote
    ) -> None:
        return None


ForecasterFactory = Callable[["PipelineContext", Agent, PolicyVersion], Forecaster]

FORECASTERS: dict[BackendKind, ForecasterFactory] = {
    BackendKind.LOCAL: LoopForecaster,
    BackendKind.OPENAI: LoopForecaster,
    BackendKind.BASELINE: BaselineForecaster,
    BackendKind.EXTERNAL: ImportedForecaster,
}
