"""Replay and train: completed groups → a staleness-corrected update → a registered new
policy version. Also supervised fine-tuning (warm starts) through the same data path.

Order of effects makes crashes safe: the checkpoint is written to a temporary directory and
renamed into place by the trainer; only then, in one transaction, is the version registered,
the consumed rollouts recorded and the training run closed. A crash before that leaves no
registered version and no consumption, so the same groups are replayed next time. A
checkpoint directory left behind by such a crash is moved aside, never registered.

LoRA adapters are always trained over the agent's base model, so an adapter version can be
served by vLLM next to the base weights; switching an agent from full fine-tuning to LoRA
is refused with a clear error.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from flows.settings import Settings
from futureworld.domain import (
    Agent,
    PolicyVersion,
    ScoredRollout,
    TrainingRun,
    TrainStep,
    Trajectory,
)
from futureworld.rewards import DEFAULT_REWARD
from futureworld.rl.config import Estimator, TrainConfig
from futureworld.rl.trainer import TrainResult, train_policy
from storage.engine import session_scope
from storage.repositories.agents import get_agent, latest_policy_version, register_policy_version
from storage.repositories.rollouts import load_trajectories
from storage.repositories.training import (
    finish_training_run,
    record_consumption,
    record_train_steps,
    select_replay_groups,
    start_training_run,
)


@dataclass(frozen=True)
class TrainReport:
    training_run_id: int
    agent: str
    from_version: int
    to_version: int
    groups: int
    rollouts: int
    groups_skipped: int
    remaining_groups: int
    checkpoint_path: str
    steps: list[dict[str, float]] = field(default_factory=list)


STEP_FLUSH_EVERY = 25
"""Per-step metrics are written in batches of this many steps (and at the end)."""


def checkpoint_dir(settings: Settings, agent: Agent, version: int) -> Path:
    return settings.data_dir.resolve() / "checkpoints" / agent.name / f"v{version}"


def _model_and_adapter(
    agent: Agent, current: PolicyVersion, lora: bool
) -> tuple[Path, Path | None]:
    checkpoint = Path(current.checkpoint_path)
    if (checkpoint / "adapter_config.json").is_file():
        if not lora:
            raise ValueError(
                f"{agent.name} v{current.version} is a LoRA adapter; keep training with --lora"
            )
        return Path(agent.base_model), checkpoint
    if lora and current.version > 0:
        raise ValueError(
            f"{agent.name} v{current.version} is a fully fine-tuned model; LoRA adapters are "
            "trained over the base model only (continue without --lora)"
        )
    return checkpoint, None


def _continued_optimizer(current: PolicyVersion, config: TrainConfig) -> Path | None:
    """The current version's checkpoint when its AdamW state should carry into this update.

    RL versions continue one another's moments, as one long-running trainer would: a fresh
    AdamW's first steps are sign-like, lr-sized moves of every weight, which on noisy,
    outcome-driven rewards are mostly noise. The state of a supervised (SFT) update, or of
    a full fine-tune when this is LoRA (or the reverse), does not carry over.
    """
    from futureworld.rl.checkpoints import OPTIMIZER_FILE, load_trainer_state

    checkpoint = Path(current.checkpoint_path)
    if config.estimator is Estimator.SFT or not (checkpoint / OPTIMIZER_FILE).is_file():
        return None
    try:  # refused when missing, or when trained the other way (LoRA vs full)
        trained = load_trainer_state(checkpoint, lora=config.lora)
    except (FileNotFoundError, ValueError):
        return None
    return None if trained["config"]["estimator"] == Estimator.SFT else checkpoint


def _free_target(target: Path) -> None:
    if target.exists():
        target.rename(target.with_name(f"{target.name}.unregistered-{int(time.time())}"))


def _run_update(
    engine: Engine,
    settings: Settings,
    agent: Agent,
    current: PolicyVersion,
    items: Sequence[ScoredRollout | Trajectory],
    config: TrainConfig,
    *,
    run_config: dict[str, Any],
    on_registered: Callable[[Any, int], None],
    resume_from: Path | None = None,
) -> tuple[TrainingRun, TrainResult, PolicyVersion]:
    model_dir, adapter_dir = _model_and_adapter(agent, current, config.lora)
    with session_scope(engine) as session:
        run = start_training_run(
            session,
            TrainingRun(agent_id=agent.id, from_version=current.version, config=run_config),
        )
    target = checkpoint_dir(settings, agent, current.version + 1)
    target.parent.mkdir(parents=True, exist_ok=True)
    _free_target(target)

    pending: list[TrainStep] = []

    def flush_steps() -> None:
        with session_scope(engine) as session:
            record_train_steps(session, pending)
        pending.clear()

    def on_step(step: int, metrics: dict[str, float]) -> None:
        # Buffered, so the training loop does not pay a database commit per step.
        pending.append(
            TrainStep(training_run_id=run.id, step=step, loss=metrics["loss"], metrics=metrics)
        )
        if len(pending) >= STEP_FLUSH_EVERY:
            flush_steps()

    try:
        result = train_policy(
            model_dir,
            items,
            config,
            target,
            adapter_dir=adapter_dir,
            resume_from=resume_from,
            on_step=on_step,
        )
    except BaseException as error:
        flush_steps()
        with session_scope(engine) as session:
            finish_training_run(session, run.id, status="failed", error=repr(error)[:2000])
        raise
    flush_steps()
    with session_scope(engine) as session:
        version = register_policy_version(
            session,
            PolicyVersion(
                agent_id=agent.id,
                version=current.version + 1,
                parent_version=current.version,
                checkpoint_path=str(target),
                checkpoint_sha256=result.checkpoint_sha256,
                training_run_id=run.id,
            ),
        )
        on_registered(session, run.id)
        finish_training_run(
            session,
            run.id,
            status="completed",
            to_version=version.version,
            rollouts_consumed=result.rollouts_used,
        )
    return run, result, version


def train_config(
    settings: Settings, *, estimator: str, lora: bool, overrides: dict[str, Any] | None = None
) -> TrainConfig:
    try:
        chosen = Estimator(estimator)
    except ValueError:
        known = ", ".join(e.value for e in Estimator)
        raise ValueError(f"unknown estimator {estimator!r} (known: {known})") from None
    return TrainConfig(estimator=chosen, lora=lora, device=settings.device, **(overrides or {}))


def replay_and_train(
    engine: Engine,
    settings: Settings,
    agent_name: str,
    *,
    estimator: str = "dr_grpo",
    max_groups: int | None = None,
    lora: bool = False,
    min_groups: int = 1,
    reuse: bool = False,
    config_overrides: dict[str, Any] | None = None,
    resume_from: Path | None = None,
    fresh_optimizer: bool = False,
) -> TrainReport | None:
    """Train `agent_name`'s newest policy on its completed, unconsumed groups (oldest first).

    Returns None, changing nothing, when fewer than `min_groups` groups are ready. The AdamW
    state of the newest version carries over when it was an RL update of the same kind
    (`_continued_optimizer`), unless `fresh_optimizer` or an explicit `resume_from` is given.
    """
    config = train_config(settings, estimator=estimator, lora=lora, overrides=config_overrides)
    with session_scope(engine) as session:
        agent = get_agent(session, agent_name)
        current = latest_policy_version(session, agent.id)
        selection = select_replay_groups(
            session, agent.id, reward_fn=str(DEFAULT_REWARD), max_groups=max_groups, reuse=reuse
        )
        if len(selection.groups) < max(min_groups, 1):
            return None
        items = selection.items
        trajectories = load_trajectories(session, [i.rollout_id for i in items])
    scored = [
        ScoredRollout(
            trajectory=t,
            reward=i.reward,
            outcome_value=i.outcome_value,
            outcome_revision=i.outcome_revision,
            staleness=current.version - t.policy_version,
        )
        for i, t in zip(items, trajectories, strict=True)
    ]
    run_config = {
        "train": _jsonable(config),
        "max_groups": max_groups,
        "reuse": reuse,
        "groups": len(selection.groups),
        "reward_fn": str(DEFAULT_REWARD),
    }

    def consume(session: Any, run_id: int) -> None:
        record_consumption(session, run_id, agent.id, items)

    if resume_from is None and not fresh_optimizer:
        resume_from = _continued_optimizer(current, config)
    run_config["resumed_from"] = None if resume_from is None else str(resume_from)
    run, result, version = _run_update(
        engine,
        settings,
        agent,
        current,
        scored,
        config,
        run_config=run_config,
        on_registered=consume,
        resume_from=resume_from,
    )
    return TrainReport(
        training_run_id=run.id,
        agent=agent.name,
        from_version=current.version,
        to_version=version.version,
        groups=result.groups_used,
        rollouts=result.rollouts_used,
        groups_skipped=selection.skipped_small_groups + result.groups_skipped,
        remaining_groups=selection.remaining_groups,
        checkpoint_path=str(version.checkpoint_path),
        steps=[dict(m) for m in result.metrics],
    )


def supervised_finetune(
    engine: Engine,
    settings: Settings,
    agent_name: str,
    trajectories: Sequence[Trajectory],
    *,
    lora: bool = False,
    config_overrides: dict[str, Any] | None = None,
) -> TrainReport:
    """SFT on given trajectories (warm start, distillation): weight 1 on mask-1 tokens."""
    config = train_config(settings, estimator="sft", lora=lora, overrides=config_overrides)
    with session_scope(engine) as session:
        agent = get_agent(session, agent_name)
        current = latest_policy_version(session, agent.id)
    run_config = {"train": _jsonable(config), "sft_examples": len(trajectories)}
    run, result, version = _run_update(
        engine,
        settings,
        agent,
        current,
        trajectories,
        config,
        run_config=run_config,
        on_registered=lambda session, run_id: None,
    )
    return TrainReport(
        training_run_id=run.id,
        agent=agent.name,
        from_version=current.version,
        to_version=version.version,
        groups=0,
        rollouts=result.rollouts_used,
        groups_skipped=0,
        remaining_groups=0,
        checkpoint_path=str(version.checkpoint_path),
        steps=[dict(m) for m in result.metrics],
    )


def _jsonable(config: TrainConfig) -> dict[str, Any]:
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))
