"""What one update is told: the replay choices (which groups, how many, which lineage) plus the
trainer's `TrainConfig`, the one definition of every training knob. Every entrance reaches the
same knobs the same way: the CLI by `--set name=value` and `--config FILE.toml`
(`config_with_overrides`), a Prefect `train` parameter and the demo by a `config` object of the
same field names; defaults are TrainConfig's, stated once where each field is declared.

Two TrainConfig fields are not set by callers: `lora` (the update's lineage decides it, from
`TrainOptions.lora`: `flows.stages.lineage.lora_for`) and `device` (the settings' FW_DEVICE).
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from flows.tracking import ReportTo
from futureworld.domain import QuestionKind
from futureworld.rewards import RewardFn, rewards_for_kind
from futureworld.rl.config import Estimator, TrainConfig

DECIDED_FIELDS = frozenset({"lora", "device"})
"""TrainConfig fields an update decides itself (lineage, settings); no caller sets them."""


class TrainConfigError(ValueError):
    """A training configuration a caller gave that is not a valid TrainConfig: the message
    names the field and what was wrong."""


def settable_fields() -> dict[str, Any]:
    """TrainConfig field → its type, for every field a caller may set."""
    hints = get_type_hints(TrainConfig)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(TrainConfig)
        if f.name not in DECIDED_FIELDS
    }


def _parse_value(name: str, text: str, kind: Any) -> Any:
    """`text` as a value of the field's type: JSON first (numbers, true/false, null, lists),
    else the bare string (enum names, module names)."""
    try:
        raw: Any = json.loads(text)
    except json.JSONDecodeError:
        raw = text
    try:
        return TypeAdapter(kind).validate_python(raw)
    except ValidationError:
        if not isinstance(raw, str):  # e.g. "1e-3" read as a float for a str field
            try:
                return TypeAdapter(kind).validate_python(text)
            except ValidationError:
                pass
        raise TrainConfigError(f"{name}={text}: not a valid {_type_name(kind)}") from None


def _type_name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")


def config_with_overrides(
    base: TrainConfig,
    *,
    sets: Iterable[str] = (),
    toml: Path | None = None,
) -> TrainConfig:
    """`base` with the fields of a TOML file (top-level keys, TrainConfig's names), then every
    `name=value` of `sets` (later wins), validated as TrainConfig validates itself."""
    fields = settable_fields()
    changes: dict[str, Any] = {}
    if toml is not None:
        try:
            document = tomllib.loads(toml.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise TrainConfigError(f"{toml}: not a readable TOML file ({error})") from None
        for name, value in document.items():
            _check_name(name, fields, where=f"{toml}: ")
            try:
                changes[name] = TypeAdapter(fields[name]).validate_python(value)
            except ValidationError:
                raise TrainConfigError(
                    f"{toml}: {name} = {value!r} is not a valid {_type_name(fields[name])}"
                ) from None
    for item in sets:
        name, sep, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep:
            raise TrainConfigError(f"--set {item!r}: expected name=value")
        _check_name(name, fields, where="--set ")
        changes[name] = _parse_value(name, text.strip(), fields[name])
    try:
        return dataclasses.replace(base, **changes)
    except (TypeError, ValueError) as error:
        raise TrainConfigError(str(error)) from None


def _check_name(name: str, fields: Mapping[str, Any], *, where: str) -> None:
    if name in DECIDED_FIELDS:
        raise TrainConfigError(
            f"{where}{name}: decided by the update itself "
            + ("(train --lora / TrainOptions.lora)" if name == "lora" else "(FW_DEVICE)")
        )
    if name not in fields:
        raise TrainConfigError(
            f"{where}{name}: not a training setting; TrainConfig has {', '.join(sorted(fields))}"
        )


def _reward_kind(reward_fn: RewardFn) -> QuestionKind:
    return next(kind for kind in QuestionKind if reward_fn in rewards_for_kind(kind))


class TrainOptions(BaseModel):
    """One update's replay choices and its TrainConfig (`config`), from the CLI, a Prefect
    parameter (`train={"max_groups": 64, "config": {"learning_rate": 1e-5}}`) or the demo."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: TrainConfig = TrainConfig()
    """Every training knob (estimator, reward, learning rate, clip bounds, KL …): TrainConfig's
    fields and defaults; `lora` and `device` are decided by the update."""
    kind_rewards: tuple[RewardFn, ...] = ()
    """Rewards of other question kinds also trained on (e.g. rlcr, crps next to brier): each
    question trains on its own kind's reward. At most one reward per kind, in all."""
    lora: bool | None = None
    """Train a LoRA adapter over the base model instead of all weights; None: the parent
    version's kind, and from the base model an adapter for an agent on a vLLM server (served
    without a restart), all weights for a local one (`flows.stages.lineage.lora_for`)."""
    kl_reference: int | None = Field(default=None, ge=0)
    """The registered version the KL penalty (`config.kl_coef`) anchors to: 0, the base
    model, or a later full model such as the supervised warm start. With `kl_trail`: the
    oldest version the trailing anchor may reach. None: `kl_trail`'s version when it is
    given, else 0."""
    kl_trail: int | None = Field(default=None, ge=0)
    """Anchor the KL penalty to the promoted version this many promotions before the
    update's base, found again at every update along the base's parents (versions not
    promoted are skipped; the oldest promoted one when the lineage is shorter:
    `flows.stages.lineage.trailing_reference`), so the anchor trails the policy. 0 anchors to
    the base itself; never older than `kl_reference` when that is given. Not with LoRA (its
    reference is the base model under the adapter)."""
    max_groups: int | None = None
    """Replay at most this many groups (oldest first); the rest wait for the next update."""
    draw_groups: int | None = Field(default=None, ge=1)
    """Train on at most this many of the groups replay selected, drawn at random (seeded by
    the update's as-of day and parent version, so a retry on another day draws anew); the
    rest wait, unconsumed. Bounds an update's size when data piles up, as after a run of
    rejected updates whose data is trained on again (`flows.stages.training.drawn_groups`)."""
    rejection_backoff: float | None = Field(default=None, gt=0, lt=1)
    """Backtrack the step after a rejection: an update whose parent already has k versions
    the gate rejected trains at `config.learning_rate` × backoff^k (a rejected step is
    retried shorter, as a backtracking line search shortens a step its test refused; the
    next promoted version starts again at the full rate). None: every retry at the full
    rate (`flows.stages.training.backed_off`)."""
    min_groups: int = 1
    """Do nothing while fewer completed groups are waiting."""
    reuse: bool = False
    """Also replay groups this lineage trained on before."""
    fresh_optimizer: bool = False
    """Start a new AdamW instead of continuing the newest RL version's moments."""
    nproc: int = 1
    """Training processes on this machine (torchrun, DDP; gloo on CPU, NCCL on GPUs): each
    takes a share of every step's whole groups; the update equals one process's."""
    report_to: ReportTo | None = None
    """The experiment tracker this update logs to (tensorboard, mlflow, wandb, none); None:
    the settings' FW_REPORT_TO (flows.tracking)."""

    @model_validator(mode="after")
    def _check(self) -> TrainOptions:
        decided = [
            name
            for name in DECIDED_FIELDS
            if getattr(self.config, name) != getattr(TrainConfig(), name)
        ]
        if decided:
            raise ValueError(
                f"config.{', config.'.join(sorted(decided))} is decided by the update itself: "
                "use TrainOptions.lora, and FW_DEVICE for the device"
            )
        rewards = self.rewards
        kinds = [_reward_kind(RewardFn(fn)) for fn in rewards]
        if len(set(kinds)) != len(kinds):
            named = ", ".join(f"{fn} ({kind})" for fn, kind in zip(rewards, kinds, strict=True))
            raise ValueError(f"one reward per question kind, got {named}")
        return self

    @property
    def estimator(self) -> Estimator:
        return self.config.estimator

    @property
    def reward_fn(self) -> RewardFn:
        return self.config.reward_fn

    @property
    def rewards(self) -> tuple[RewardFn, ...]:
        """Every reward the update trains on: `config.reward_fn`, then `kind_rewards`."""
        return (self.config.reward_fn, *self.kind_rewards)

    def with_config(self, **changes: Any) -> TrainOptions:
        """These options with some TrainConfig fields changed (validated)."""
        config = dataclasses.replace(self.config, **changes)
        return TrainOptions.model_validate({**dict(self), "config": config})

    def train_config(self, *, device: str | None, lora: bool) -> TrainConfig:
        """The trainer's config of this update: `config`, with `lora` decided (`lora_for`)
        and the settings' device."""
        return dataclasses.replace(self.config, lora=lora, device=device)
