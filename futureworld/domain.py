"""The domain: questions, articles, outcomes, trajectories, rewards and policy versions.

Frozen dataclasses with no I/O and no imports of ours. Storage translates them to and
from table rows; flows pass them between stages. All datetimes are tz-aware UTC.

Question kinds. A choice question's options live in `Question.options` (labelled A, B, C …
in prompts and answers) and whether they are ordered in `extra["ordered_options"]`; a numeric
question's range lives in `extra["numeric"]` (`NumericSpec.to_extra`). Both are validated when
the Question is built, so a bad spec fails at harvest, naming the question, and storage keeps
them in its existing `options`/`extra` JSON columns (no migration). Date questions are numeric
questions on a time axis: values are POSIX seconds (UTC).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any


class QuestionKind(StrEnum):
    BINARY = "binary"
    """P(yes) forecast, outcome 1 or 0."""
    CHOICE = "choice"
    """Multiple choice: exactly one of `options` happens. Answered with a probability per
    option; the outcome is the option's index. The stored value stays "choice" (the platforms'
    "multiple_choice" / "MULTIPLE_CHOICE" are accepted as aliases when read)."""
    NUMERIC = "numeric"
    """A number (or a date on a time axis) in a `NumericSpec` range, answered with quantiles at
    `QUANTILE_LEVELS` (CRPS); the outcome is the number."""

    @classmethod
    def _missing_(cls, value: object) -> QuestionKind | None:
        if isinstance(value, str) and value.lower().replace("-", "_") == "multiple_choice":
            return cls.CHOICE
        return None


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
    """A probability outside [0, 1], or a quantile beyond a closed bound of the range."""
    WRONG_FORMAT = "wrong_format"
    """A complete answer tag of another question kind (e.g. <probability> on a choice question)."""
    UNKNOWN_OPTION = "unknown_option"
    """A choice answer names a label that is not one of the question's options."""
    DUPLICATE = "duplicate"
    """A choice answer gives one option twice, or a quantile answer one level twice."""
    BAD_SUM = "bad_sum"
    """Choice probabilities whose sum is further than CHOICE_SUM_TOLERANCE from 1."""
    WRONG_LEVELS = "wrong_levels"
    """A quantile answer whose levels are not exactly QUANTILE_LEVELS."""
    NOT_MONOTONE = "not_monotone"
    """Quantile values that decrease as the level rises."""


QUANTILE_LEVELS: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95)
"""The levels every numeric answer gives, so [q25, q75] and [q5, q95] are the 50% and 90%
central intervals. Fixed system-wide: one format for the model to learn and one CRPS."""

CHOICE_SUM_TOLERANCE = 0.1
"""Choice probabilities summing to within this of 1 are divided by their sum; further off,
the answer is BAD_SUM (a vector summing to 2.7 is not a distribution the agent meant)."""

MAX_CHOICE_OPTIONS = 26
"""Options are labelled A … Z."""


def option_label(index: int) -> str:
    """The letter an option is shown and answered with: 0 → A, 1 → B …"""
    if not 0 <= index < MAX_CHOICE_OPTIONS:
        raise ValueError(f"option index {index} is outside [0, {MAX_CHOICE_OPTIONS})")
    return chr(ord("A") + index)


@dataclass(frozen=True, kw_only=True)
class BinarySpec:
    """A binary question's spec: it has no options, and its crowd forecast is the question's
    `crowd_probability`, not an entry of its extra."""

    @classmethod
    def of(cls, options: tuple[str, ...], extra: dict[str, Any]) -> BinarySpec:
        """The spec of a question with these options and extra; ValueError if it has options."""
        if options:
            raise ValueError(f"a binary question has no options, got {options}")
        return cls()

    def crowd(self, extra: dict[str, Any]) -> None:
        return None


def _crowd_values(
    extra: dict[str, Any], key: str, size: int, admits: Callable[[list[Any]], bool], shape: str
) -> tuple[float, ...] | None:
    """extra[key] as `size` finite floats that `admits` accepts, None if absent; ValueError
    naming the key and the expected `shape` otherwise."""
    values = extra.get(key)
    if values is None:
        return None
    ok = isinstance(values, list | tuple) and len(values) == size
    ok = ok and all(isinstance(v, int | float) and math.isfinite(v) for v in values)
    if not (ok and admits(list(values))):
        raise ValueError(f"extra[{key!r}] must be {size} {shape}, got {values!r}")
    return tuple(float(v) for v in values)


@dataclass(frozen=True, kw_only=True)
class ChoiceSpec:
    """A multiple-choice question's options; exactly one of them is the outcome."""

    options: tuple[str, ...]
    """2 to 26 distinct, non-empty option texts, in the platform's order."""
    ordered: bool = False
    """The options lie on a scale (e.g. ranges of a number): the ranked probability score
    applies. Stored as extra["ordered_options"]."""

    def __post_init__(self) -> None:
        options = tuple(self.options)
        object.__setattr__(self, "options", options)
        if not 2 <= len(options) <= MAX_CHOICE_OPTIONS:
            raise ValueError(f"a choice question needs 2 to 26 options, got {len(options)}")
        if any(not str(o).strip() for o in options):
            raise ValueError(f"choice options must be non-empty texts, got {list(options)}")
        if len(set(options)) != len(options):
            raise ValueError(f"choice options must be distinct, got {list(options)}")

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(option_label(i) for i in range(len(self.options)))

    def to_extra(self) -> dict[str, Any]:
        return {"ordered_options": self.ordered}

    @classmethod
    def of(cls, options: tuple[str, ...], extra: dict[str, Any]) -> ChoiceSpec:
        """The spec of a question with these options and extra["ordered_options"]."""
        ordered = extra.get("ordered_options", False)
        if not isinstance(ordered, bool):
            raise ValueError(f'extra["ordered_options"] must be true or false, got {ordered!r}')
        return cls(options=options, ordered=ordered)

    def crowd(self, extra: dict[str, Any]) -> tuple[float, ...] | None:
        """extra["crowd_probabilities"]: one probability per option, or None."""
        return _crowd_values(
            extra,
            "crowd_probabilities",
            len(self.options),
            lambda values: all(0.0 <= v <= 1.0 for v in values),
            "probabilities",
        )


@dataclass(frozen=True, kw_only=True)
class NumericSpec:
    """A numeric question's range. Stored as extra["numeric"] (`to_extra` / `from_extra`).

    Bounds are closed unless open: a closed bound is where the outcome is clipped (it cannot
    fall beyond it), an open one only marks where the platform's range ends. Scores and the
    reward are computed on the unit axis `normalise(x)`, so CRPS is in units of the range.
    """

    lower: float
    upper: float
    open_lower: bool = False
    open_upper: bool = False
    log_scale: bool = False
    """Positions are taken on ln x (requires lower > 0): for quantities spanning magnitudes."""
    unit: str = ""
    """Shown in the prompt: "units", "USD", "%" …"""
    time_axis: bool = False
    """A date question: values are POSIX seconds (UTC), shown and answered as YYYY-MM-DD."""

    def __post_init__(self) -> None:
        for name in ("lower", "upper"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"numeric range {name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"numeric range {name} must be finite, got {value}")
            object.__setattr__(self, name, float(value))
        if not self.lower < self.upper:
            raise ValueError(f"numeric range needs lower < upper, got [{self.lower}, {self.upper}]")
        if self.log_scale and self.lower <= 0.0:
            raise ValueError(f"a log-scale range needs lower > 0, got {self.lower}")
        if self.log_scale and self.time_axis:
            raise ValueError("a date question cannot have a log scale")

    def normalise(self, value: float) -> float:
        """The position of `value` on the unit axis: 0 at lower, 1 at upper (beyond for open
        bounds); on ln x for a log scale. Raises for x <= 0 on a log scale."""
        if self.log_scale:
            if value <= 0.0:
                raise ValueError(f"{value} has no position on a log scale")
            lo, hi = math.log(self.lower), math.log(self.upper)
            return (math.log(value) - lo) / (hi - lo)
        return (value - self.lower) / (self.upper - self.lower)

    def admits(self, value: float) -> bool:
        """Whether `value` can be the outcome or a quantile: finite, not beyond a closed bound,
        and > 0 on a log scale."""
        if not math.isfinite(value) or (self.log_scale and value <= 0.0):
            return False
        if not self.open_lower and value < self.lower:
            return False
        return self.open_upper or value <= self.upper

    def to_extra(self) -> dict[str, Any]:
        return {"numeric": asdict(self)}

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> NumericSpec:
        """The spec stored in a question's extra; ValueError naming what is wrong."""
        data = extra.get("numeric")
        if not isinstance(data, dict):
            raise ValueError('a numeric question needs extra["numeric"] with its range')
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f'extra["numeric"] has unknown fields {sorted(unknown)}')
        try:
            return cls(**data)
        except TypeError as error:
            raise ValueError(f'extra["numeric"] is incomplete: {error}') from None

    @classmethod
    def of(cls, options: tuple[str, ...], extra: dict[str, Any]) -> NumericSpec:
        """The spec stored in a question's extra (its options are not read)."""
        return cls.from_extra(extra)

    def crowd(self, extra: dict[str, Any]) -> tuple[float, ...] | None:
        """extra["crowd_quantiles"]: non-decreasing values at QUANTILE_LEVELS, or None."""
        return _crowd_values(
            extra,
            "crowd_quantiles",
            len(QUANTILE_LEVELS),
            lambda values: all(a <= b for a, b in itertools.pairwise(values)),
            "non-decreasing quantiles",
        )


KindSpec = BinarySpec | ChoiceSpec | NumericSpec

KIND_SPECS: dict[QuestionKind, type[BinarySpec] | type[ChoiceSpec] | type[NumericSpec]] = {
    QuestionKind.BINARY: BinarySpec,
    QuestionKind.CHOICE: ChoiceSpec,
    QuestionKind.NUMERIC: NumericSpec,
}
"""Each kind's spec: what a question of the kind holds in its options and extra, validated
when the Question is built, and where its crowd forecast is."""


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
    """Crowd / market P(yes) at harvest (cut-off) time, if the source has one (binary)."""
    options: tuple[str, ...] = ()
    """Choice questions: the option texts (see ChoiceSpec)."""
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """Source-specific data, plus the kind's spec: "ordered_options" (choice), "numeric"
    (NumericSpec), and the crowd's forecast of a non-binary question when the source has one:
    "crowd_probabilities" (choice, one per option) or "crowd_quantiles" (numeric, at
    QUANTILE_LEVELS)."""
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", QuestionKind(self.kind))
        object.__setattr__(self, "options", tuple(self.options))
        for name in ("created_at", "info_cutoff_at", "close_at", "resolve_by"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, require_utc(value, name))
        if self.crowd_probability is not None and not 0.0 <= self.crowd_probability <= 1.0:
            raise ValueError(
                f"question {self.source}/{self.external_id}: crowd_probability "
                f"{self.crowd_probability} is outside [0, 1]"
            )
        try:
            self.crowd_forecast  # noqa: B018 - validates the kind's spec and crowd forecast
        except ValueError as error:
            raise ValueError(f"question {self.source}/{self.external_id}: {error}") from None

    @property
    def spec(self) -> KindSpec:
        """The kind's spec (KIND_SPECS) of the question's options and extra."""
        return KIND_SPECS[self.kind].of(self.options, self.extra)

    @property
    def choice_spec(self) -> ChoiceSpec:
        """The options of a choice question; ValueError for other kinds."""
        if KIND_SPECS[self.kind] is not ChoiceSpec:
            raise ValueError(f"a {self.kind} question has no choice spec")
        return ChoiceSpec.of(self.options, self.extra)

    @property
    def numeric_spec(self) -> NumericSpec:
        """The range of a numeric question; ValueError for other kinds."""
        if KIND_SPECS[self.kind] is not NumericSpec:
            raise ValueError(f"a {self.kind} question has no numeric spec")
        return NumericSpec.of(self.options, self.extra)

    @property
    def crowd_forecast(self) -> tuple[float, ...] | None:
        """The crowd's forecast of a non-binary question (after validating the kind's spec):
        per-option probabilities (choice) or quantiles at QUANTILE_LEVELS (numeric); None when
        the source has none, and for binary questions (see crowd_probability)."""
        return self.spec.crowd(self.extra)


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
    EXTERNAL = "external"
    """An outside forecaster's forecasts, read from a file (`futureworld import forecasts`):
    read-only, scored beside the others; nothing here forecasts or trains for it."""

    @property
    def generates(self) -> bool:
        """Whether the kind samples tokens from a policy (and can be trained)."""
        return self not in (BackendKind.BASELINE, BackendKind.EXTERNAL)


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


class VersionStatus(StrEnum):
    """Whether a registered policy version may serve (ARCHITECTURE §9b). An agent serves its
    newest promoted version: that version samples its rollouts and is the next update's base."""

    CANDIDATE = "candidate"
    """Registered by an update, not yet through the promotion gate: it samples no rollout."""
    PROMOTED = "promoted"
    """May serve: the base model (version 0), a version that passed the gate, or one a person
    promoted."""
    REJECTED = "rejected"
    """Failed the gate or a person rejected it: kept, with its reason, and never served."""


@dataclass(frozen=True, kw_only=True)
class PolicyVersion:
    agent_id: int
    version: int
    checkpoint_path: str
    checkpoint_sha256: str = ""
    parent_version: int | None = None
    training_run_id: int | None = None
    created_at: datetime = field(default_factory=utc_now)
    status: VersionStatus = VersionStatus.PROMOTED
    """An update that goes through the promotion gate registers its version as CANDIDATE; the
    default is for what is registered without a gate (the base model, a person's checkpoint)."""
    status_reason: str = ""
    """Why the version has its status: the gate's verdict, or a person's words."""
    validation_questions: int = 0
    """Held-out validation questions its gate scored it on (0: not gated or no data)."""
    validation_brier: float | None = None
    """Its Brier on those questions (each question's forecast the mean of its rollouts)."""
    validation_parse_rate: float | None = None
    """Share of its rollouts on those questions whose answer parsed."""
    id: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", VersionStatus(self.status))
        require_utc(self.created_at, "created_at")


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
    """Choice questions: the most probable option (lowest index on ties), RLCR's answer."""
    quantiles: tuple[float, ...] = ()
    """Numeric questions: the values at QUANTILE_LEVELS, non-decreasing."""
    probabilities: tuple[float, ...] = ()
    """Choice questions: P(option i) for every option, normalised to sum to 1."""
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
    """A label-free stand-in reward (provisional_consensus) computed before the outcome exists."""
    created_at: datetime = field(default_factory=utc_now)
    """Wall-clock time of the write."""
    made_at: datetime | None = None
    """The pipeline's instant of the write (the run's as-of: in a backtest, simulated time)."""
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
    consensus: float | None = None
    """The pseudo-outcome ŷ a provisional reward was computed with (None for a real one)."""


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
    """Wall-clock start."""
    finished_at: datetime | None = None
    made_at: datetime | None = None
    """The pipeline's instant of the run (its as-of: in a backtest, simulated time)."""
    summary: dict[str, float] = field(default_factory=dict, hash=False, compare=False)
    """The update's health once it completed: groups, reward spread, the share of groups
    whose answers are all identical, parse rate, mean answer length, advantage spread …"""
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
