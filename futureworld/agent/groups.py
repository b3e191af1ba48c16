"""A group of rollouts as the rollout engine takes and gives it: the job (a question and the
samples it lacks), a group's failure, a run's stats, and the Trajectories of a finished group
(its final answers parsed in the question kind's format). The scheduling is engine.py's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum

from futureworld.agent.loop import PromptTooLong, Rollout
from futureworld.agent.parsing import ParsedAnswer, parse_final_answer
from futureworld.domain import GenerationSettings, ParseStatus, Question, StopReason, Trajectory
from futureworld.policy.base import PolicyBackend, SamplingParams
from futureworld.policy.streaming import GenerationError


class FailureKind(StrEnum):
    PROMPT_TOO_LONG = "prompt_too_long"
    """The prompt leaves no room for a turn even after the cut rule."""
    GENERATION_ERROR = "generation_error"
    """The backend could not generate one of the group's requests."""


@dataclass(frozen=True, kw_only=True)
class GroupJob:
    """The samples of one question's group still to generate."""

    question: Question
    samples: tuple[int, ...]
    """Sample indices, e.g. (0, …, G − 1), or the missing ones of a partial group."""
    seeds: tuple[int, ...]
    """One rollout seed per sample index."""
    as_of: datetime
    """The forecast's instant; search sees the corpus as of min(as_of, question.close_at)."""

    def __post_init__(self) -> None:
        if self.question.id is None:
            q = self.question
            raise ValueError(f"question {q.source}/{q.external_id} has no id yet")
        if not self.samples or len(self.samples) != len(self.seeds):
            raise ValueError(
                f"question {self.question.id}: {len(self.samples)} samples need as many "
                f"seeds (got {len(self.seeds)}), at least one"
            )


@dataclass(frozen=True)
class GroupFailure:
    job: GroupJob
    kind: FailureKind
    detail: str


@dataclass
class EngineStats:
    """What one `run` did."""

    groups: int = 0
    failed: int = 0
    generated_tokens: int = 0
    requests: int = 0
    tool_calls_shared: int = 0
    """Tool calls answered by an identical call's observation (`engine._ToolCalls`)."""
    cut_prompts: list[tuple[GroupJob, str]] = field(default_factory=list)


OnGroup = Callable[[GroupJob, list[Trajectory]], None]
OnFailure = Callable[[GroupFailure], None]


@dataclass
class GroupInFlight:
    """A started group: its encoded prompt and its rollouts while they run."""

    job: GroupJob
    order: int
    prompt: list[int]
    rollouts: list[Rollout]
    search_as_of: datetime
    started: float
    remaining: int
    failed: bool = False


def sampling_params(
    settings: GenerationSettings, max_new_tokens: int, seed: int, stop: tuple[str, ...]
) -> SamplingParams:
    """The agent's sampling for one request: its temperature and top-p, this budget and seed."""
    return SamplingParams(
        temperature=settings.temperature,
        top_p=settings.top_p,
        max_new_tokens=max_new_tokens,
        seed=seed,
        stop=stop,
    )


def group_trajectories(
    group: GroupInFlight,
    *,
    settings: GenerationSettings,
    stop: tuple[str, ...],
    backend: PolicyBackend,
    agent_id: int,
    policy_version: int,
) -> list[Trajectory]:
    """The Trajectories of a finished group: tokens, turns, the parsed final answer and the
    sampling each rollout was drawn with (`stop`: the question kind's stop strings)."""
    job, prompt = group.job, group.prompt
    total_s = time.perf_counter() - group.started
    question = job.question
    assert question.id is not None
    out = []
    for r in group.rollouts:
        answer = final_answer(r, question)
        recorded = sampling_params(settings, settings.max_new_tokens, r.seed, stop)
        sampling = {
            **recorded.to_dict(),
            "agent": asdict(settings),
            "backend": backend.describe(),
        }
        out.append(
            Trajectory(
                question_id=question.id,
                agent_id=agent_id,
                policy_version=policy_version,
                sample_index=r.index,
                prompt_token_ids=tuple(prompt),
                completion_token_ids=tuple(r.completion),
                loss_mask=tuple(r.mask),
                behaviour_logprobs=tuple(r.logprobs),
                turns=tuple(r.turns),
                p_yes=answer.p_yes,
                choice=answer.choice,
                probabilities=answer.probabilities,
                quantiles=answer.quantiles,
                parse_status=answer.status,
                stop_reason=r.stop or StopReason.MAX_TURNS,
                sampling=sampling,
                timings={"generate_s": r.generate_s, "tool_s": r.tool_s, "total_s": total_s},
                as_of=job.as_of,
            )
        )
    return out


def raise_failure(failure: GroupFailure) -> None:
    """The default of `on_failure`: raise the group's error."""
    if failure.kind is FailureKind.PROMPT_TOO_LONG:
        raise PromptTooLong(failure.detail)
    raise GenerationError(f"question {failure.job.question.id}: {failure.detail}")


def final_answer(rollout: Rollout, question: Question) -> ParsedAnswer:
    """The last turn's answer in the question kind's format; a rollout that did not stop
    by answering has none (MISSING), whatever its last text holds."""
    answer = parse_final_answer(rollout.last_text, question)
    if rollout.stop is not StopReason.ANSWERED and answer.status is ParseStatus.OK:
        return ParsedAnswer(status=ParseStatus.MISSING)
    return answer
