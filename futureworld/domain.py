"""The domain: questions, articles, outcomes, trajectories, rewards and policy versions.

Frozen dataclasses with no I/O and no imports of ours. Storage translates them to and
from table rows; flows pass them between stages. All datetimes are tz-aware UTC.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class QuestionKind(StrEnum):
    BINARY = "binary"
    """P(yes) forecast, outcome 1 or 0."""
    CHOICE = "choice"
    """One of `options`, answered with an option index and a confidence (RLCR)."""
    NUMERIC = "numeric"
    """A number, answered with quantiles (CRPS)."""


class QuestionStatus(StrEnum):
    OPEN = "open"
    RESOLVED = "resolved"
    ANNULLED = "annulled"


class OutcomeStatus(StrEnum):
    RESOLVED = "resolved"
    ANNULLED = "annulled"


class StopReason(StrEnum):
    ANSWERED = "answered"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    NO_ACTION = "no_action"
    TOOL_ERROR = "tool_error"


class ParseStatus(StrEnum):
    OK = "ok"
    MISSING = "missing"
    """No answer tag at all."""
    MALFORMED = "malformed"
    """An answer tag whose content is not a number."""
    OUT_OF_RANGE = "out_of_range"
    """A number outside [0, 1]."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def require_utc(value: datetime, name: str) -> datetime:
    """Reject naive datetimes: every instant in the system is tz-aware UTC."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware, got naive {value!r}")
    return value.astimezone(UTC)


@dataclass(frozen=True, kw_only=True)
class Question:
    source: str
    """Where the question comes from: manifold, polymarket, forecastbench:fred, rss, sim …"""
    external_id: str
    """The source's own id; unique together with `source`."""
    title: str
    created_at: datetime
    info_cutoff_at: datetime
    """The agent's search sees nothing published after this instant."""
    kind: QuestionKind = QuestionKind.BINARY
    background: str = ""
    resolution_criteria: str = ""
    url: str = ""
    domain: str = ""
    """Topic area (sports, economics, politics …) for per-domain metrics."""
    close_at: datetime | None = None
    resolve_by: datetime | None = None
    status: QuestionStatus = QuestionStatus.OPEN
    crowd_probability: float | None = None
    """Crowd / market P(yes) at harvest (cut-off) time, if the source has one."""
    options: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    id: int | None = None

    def __post_init__(self) -> None:
        for name in ("created_at", "info_cutoff_at", "close_at", "resolve_by"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, require_utc(value, name))
        if self.crowd_probability is not None and not 0.0 <= self.crowd_probability <= 1.0:
            raise ValueError(
                f"question {self.source}/{self.external_id}: crowd_probability "
                f"{self.crowd_probability} is outside [0, 1]"
            )


@dataclass(frozen=True, kw_only=True)
class Article:
    feed: str
    guid: str
    link: str
    title: str
    published_at: datetime
    fetched_at: datetime
    summary: str = ""
    body: str = ""
    flags: tuple[str, ...] = ()
    """Data-quality flags: date_from_fetch_time, bozo_feed, empty_body …"""
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "published_at", require_utc(self.published_at, "published_at"))
        object.__setattr__(self, "fetched_at", require_utc(self.fetched_at, "fetched_at"))


@dataclass(frozen=True, kw_only=True)
class Outcome:
    question_id: int
    revision: int
    """1 for the first resolution; each change (re-resolution, annulment) adds one."""
    status: OutcomeStatus
    value: float | None
    """1.0/0.0 for binary, the option index for choice, the number for numeric; None if annulled."""
    resolved_at: datetime
    raw: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "resolved_at", require_utc(self.resolved_at, "resolved_at"))
        if self.status is OutcomeStatus.RESOLVED and self.value is None:
            raise ValueError(f"resolved outcome of question {self.question_id} needs a value")


class BackendKind(StrEnum):
    """What answers an agent's questions."""

    LOCAL = "local"
    """A transformers model in this process (CPU or one GPU)."""
    OPENAI = "openai"
    """A vLLM OpenAI-compatible server over HTTP (infra/vllm)."""
    BASELINE = "baseline"
    """A reference forecaster without a model: crowd, base rate, uniform."""

    @property
    def generates(self) -> bool:
        """Whether the kind samples tokens from a policy (and can be trained)."""
        return self is not BackendKind.BASELINE


@dataclass(frozen=True, kw_only=True)
class GenerationSettings:
    """How an LLM agent samples and how long its research loop may run. Stored with the
    agent; the loop and the sampler read it (baselines ignore it)."""

    temperature: float = 1.0
    """Softmax temperature T > 0; behaviour log-probs are taken at this temperature."""
    top_p: float = 1.0
    """Nucleus mass; 1.0 means no truncation, so μ is exactly softmax(logits / T)."""
    seed: int = 0
    """Base of the per-group seeds: a group's seed hashes (seed, question, version, sample)."""
    max_turns: int = 4
    """Assistant turns per rollout; a rollout still acting after the last one stops max_turns."""
    max_new_tokens: int = 256
    """Generated tokens per assistant turn."""
    max_observation_tokens: int = 512
    """Tool observation content beyond this is cut in the middle, with a marker."""
    max_total_tokens: int = 4096
    """Prompt + completion; a rollout that would exceed it stops max_tokens."""
    search_k: int = 5
    """Results per search."""
    elicit_beliefs: bool = False
    """After each tool turn, sample a short side answer (not added to the context)."""
    belief_max_new_tokens: int = 8
    """Token budget of that side answer."""
    observation_role: str = "user"
    """Chat role observations are framed as; "user" works with every chat template."""
    brief_prompt: bool = False
    """Leave background and resolution criteria out of the prompt (short prompts, tiny models)."""

    def __post_init__(self) -> None:
        if not self.temperature > 0.0:
            raise ValueError(f"GenerationSettings.temperature must be > 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"GenerationSettings.top_p must be in (0, 1], got {self.top_p}")
        for name in (
            "max_turns",
            "max_new_tokens",
            "max_observation_tokens",
            "search_k",
            "belief_max_new_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"GenerationSettings.{name} must be >= 1, got {getattr(self, name)}"
                )
        if self.max_total_tokens <= self.max_new_tokens:
            raise ValueError(
                f"GenerationSettings.max_total_tokens ({self.max_total_tokens}) must exceed "
                f"max_new_tokens ({self.max_new_tokens})"
            )


@dataclass(frozen=True, kw_only=True)
class Agent:
    name: str
    base_model: str
    """A local model directory, or a baseline's name for the non-LLM agents."""
    backend: BackendKind
    base_url: str | None = None
    """openai only: the server root, e.g. http://127.0.0.1:8000."""
    served_model: str | None = None
    """openai only: the base model's name on the server; default: the model directory's name."""
    generation: GenerationSettings = field(
        default_factory=GenerationSettings, hash=False, compare=False
    )
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "backend", BackendKind(self.backend))


@dataclass(frozen=True, kw_only=True)
class PolicyVersion:
    agent_id: int
    version: int
    checkpoint_path: str
    checkpoint_sha256: str = ""
    parent_version: int | None = None
    training_run_id: int | None = None
    created_at: datetime = field(default_factory=utc_now)
    id: int | None = None


@dataclass(frozen=True, kw_only=True)
class Turn:
    index: int
    role: str
    """assistant (generated, loss mask 1) or tool (observation, mask 0)."""
    text: str
    token_start: int = 0
    """Offset into the rollout's completion tokens; [token_start, token_end)."""
    token_end: int = 0
    tool_name: str | None = None
    tool_args: str | None = None
    tool_result_ids: tuple[int, ...] = ()
    belief: float | None = None
    """P(yes) elicited after this turn by a side generation, for turn-level credit."""


GroupKey = tuple[int, int, int]
"""(question, agent, policy version): one group of rollouts."""
MIN_GROUP_SIZE = 2
"""A group needs this many scored rollouts to carry a baseline (and to be trained on)."""


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    """One rollout: the exact tokens the behaviour policy saw and produced.

    `completion_token_ids` holds everything after the prompt: generated tokens (mask 1,
    with their behaviour log-probs) and tool observations (mask 0, log-prob 0.0).
    Baseline agents write one turn and no tokens.
    """

    question_id: int
    agent_id: int
    policy_version: int
    sample_index: int
    prompt_token_ids: tuple[int, ...] = ()
    completion_token_ids: tuple[int, ...] = ()
    loss_mask: tuple[int, ...] = ()
    behaviour_logprobs: tuple[float, ...] = ()
    turns: tuple[Turn, ...] = ()
    p_yes: float | None = None
    """The final answer (binary), or the confidence in `choice` (choice questions)."""
    choice: int | None = None
    quantiles: tuple[float, ...] = ()
    parse_status: ParseStatus = ParseStatus.OK
    stop_reason: StopReason = StopReason.ANSWERED
    sampling: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    timings: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    created_at: datetime = field(default_factory=utc_now)
    as_of: datetime | None = None
    """The simulated or real instant the forecast was made at."""
    id: int | None = None

    def __post_init__(self) -> None:
        n = len(self.completion_token_ids)
        if len(self.loss_mask) != n or len(self.behaviour_logprobs) != n:
            raise ValueError(
                f"rollout q{self.question_id} s{self.sample_index}: completion has {n} tokens "
                f"but loss_mask {len(self.loss_mask)} and logprobs {len(self.behaviour_logprobs)}"
            )

    @property
    def group_key(self) -> GroupKey:
        """(question, agent, policy version): the G rollouts that share an advantage baseline."""
        return (self.question_id, self.agent_id, self.policy_version)

    @property
    def idempotency_key(self) -> str:
        return f"q{self.question_id}-a{self.agent_id}-v{self.policy_version}-s{self.sample_index}"


@dataclass(frozen=True, kw_only=True)
class Reward:
    rollout_id: int
    reward_fn: str
    outcome_revision: int
    value: float
    """Higher is better."""
    components: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    voided: bool = False
    """Set when a later annulment voids the outcome: kept for audit, never trained on."""
    provisional: bool = False
    """A label-free stand-in reward (siop) computed before the outcome exists."""
    created_at: datetime = field(default_factory=utc_now)
    id: int | None = None


@dataclass(frozen=True, kw_only=True)
class ScoredRollout:
    """A rollout with the reward it is trained on: what replay hands to the trainer."""

    trajectory: Trajectory
    reward: float
    outcome_value: float | None
    outcome_revision: int
    staleness: int = 0
    """Policy versions between the behaviour policy and the one being trained."""


@dataclass(frozen=True, kw_only=True)
class ReplayBatch:
    """What replay hands the trainer: whole groups of scored rollouts, oldest group first."""

    groups: tuple[tuple[ScoredRollout, ...], ...] = ()
    skipped_small_groups: int = 0
    """Groups with fewer than MIN_GROUP_SIZE scored rollouts."""
    remaining_groups: int = 0
    """Eligible groups left for a later update by a group limit."""

    @property
    def rollouts(self) -> list[ScoredRollout]:
        return [rollout for group in self.groups for rollout in group]


@dataclass(frozen=True, kw_only=True)
class TrainingRun:
    agent_id: int
    from_version: int
    config: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    to_version: int | None = None
    status: str = "running"
    rollouts_consumed: int = 0
    started_at: datetime = field(default_factory=utc_now)
    finished_at: datetime | None = None
    id: int | None = None


@dataclass(frozen=True, kw_only=True)
class TrainStep:
    training_run_id: int
    step: int
    loss: float
    metrics: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    """clip_fraction, kl_behaviour, chi2, rejected_fraction, staleness_mean, entropy, grad_norm,
    tokens_per_s …"""
    id: int | None = None
