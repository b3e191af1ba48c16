"""Replay and train: completed groups → a staleness-corrected update → a registered new
policy version. Also supervised fine-tuning (warm starts) through the same data path.

Order of effects makes crashes safe: the checkpoint is written to a temporary directory and
renamed into place by the trainer; only then, in one transaction, is the version registered,
the consumed rollouts recorded and the training run closed. A crash before that leaves no
registered version and no consumption, so the same groups are replayed next time. A
checkpoint directory left behind by such a crash is moved aside, never registered.

LoRA adapters are always trained over the agent's base model, so an adapter version can be
served by vLLM next to the base weights; switching an agent from full fine-tuning to LoRA
is refused with a clear error. Unless an update says, it continues its parent's kind, and from
the base model trains an adapter for an agent on a vLLM server (`lineage.lora_for`). An update
whose version the serve step could not put on the agent's server (all weights, no
FW_SERVE_RESTART_COMMAND) is refused before it trains (`serving.check_servable`).

Which weights an update starts from, which AdamW state it continues and which reference its
KL penalty uses are decided in `flows.stages.lineage`.

The promotion gate (flows.stages.promotion) is part of every update: replay leaves out the
validation slice (FW_VALIDATION_FRACTION), the new version is registered a candidate and judged
against its parent before the update returns, and the next update starts from the served
version. Every entrance that trains (the CLI, the flows, the backtest, the demo) goes through
here, so none can skip it; FW_VALIDATION_FRACTION=0 turns it off everywhere.

Question kinds: an update trains on the stored reward `reward_fn`, which scores one kind
(brier and log_score binary, rlcr choice, crps numeric). `kind_rewards` adds rewards of other
kinds, so a mixed-kind agent trains each question on its own kind's reward in one update: the
groups of every reward are merged in replay order (oldest first), and a group's advantage is
taken within the group, on one reward's scale.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import random
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.context import PipelineContext
from flows.stages.lineage import (
    check_update,
    continued_optimizer,
    kl_anchor,
    lora_for,
    model_and_adapter,
    reference_version,
    registered_version,
)
from flows.stages.promotion import (
    GateError,
    GateReport,
    candidate_versions,
    gate_version,
    validation_question_ids,
)
from flows.stages.provisional import with_provisional_groups
from flows.stages.serving import check_servable
from flows.stages.train_options import TrainOptions
from flows.stages.training_lock import one_update_per_agent
from flows.tracking import (
    ReportTo,
    log_update_step,
    log_update_summary,
    log_version_scores,
    open_tracker,
)
from flows.tracking_summary import update_summary
from futureworld.domain import (
    Agent,
    PolicyVersion,
    ReplayBatch,
    ScoredRollout,
    TrainingRun,
    TrainStep,
    Trajectory,
    VersionStatus,
)
from futureworld.rl.config import Estimator, TrainConfig
from futureworld.torch_threads import set_torch_threads
from futureworld.validation import GateOptions
from storage.engine import run_transaction, session_scope
from storage.repositories.agents import list_policy_versions, register_policy_version
from storage.repositories.training import (
    agent_train_steps,
    finish_training_run,
    record_consumption,
    record_train_steps,
    select_replay_batch,
    start_training_run,
)

if TYPE_CHECKING:
    from futureworld.rl.trainer import TrainResult


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
    status: VersionStatus = VersionStatus.PROMOTED
    """The new version's status: promoted (it serves), rejected, or candidate when the gate
    could not judge it."""
    gate: GateReport | None = None
    """The promotion gate's verdict (None: the gate is off, or could not judge)."""


log = logging.getLogger(__name__)

GATE_OFF = "no gate (validation fraction 0)"
"""The reason recorded for an update served without a gate (FW_VALIDATION_FRACTION=0)."""
SUPERVISED = "supervised fine-tuning: served as trained"
"""The reason recorded for a supervised version (a warm start a person chose): not gated."""

STEP_FLUSH_EVERY = 25
"""Per-step metrics are written in batches of this many steps (and at the end)."""

TrainProgress = Callable[[int, int, Mapping[str, float]], None]
"""on_progress(steps done, steps planned, the step's metrics): after every optimiser step of
the update (with `nproc` > 1, after the ranks finish: torchrun reports rank 0's steps then).
An early stop (max_kl_prox) ends before the planned steps."""


def code_version() -> dict[str, str | None]:
    """The project's version and, in a git checkout, its commit: recorded with every training
    run beside its configuration, so a version says which code trained it."""
    try:
        version: str | None = importlib.metadata.version("futureworld")
    except importlib.metadata.PackageNotFoundError:
        version = None
    root = Path(__file__).resolve().parents[2]
    try:
        commit: str | None = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip() or None  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"version": version, "commit": commit}


def _free_target(target: Path) -> None:
    if target.exists():
        target.rename(target.with_name(f"{target.name}.unregistered-{int(time.time())}"))


def _run_update(
    ctx: PipelineContext,
    agent: Agent,
    current: PolicyVersion,
    items: Sequence[ScoredRollout | Trajectory],
    config: TrainConfig,
    *,
    run_config: dict[str, Any],
    on_registered: Callable[[Any, int], None],
    parent: PolicyVersion | None = None,
    resume_from: Path | None = None,
    nproc: int = 1,
    kl_version: int = 0,
    status: VersionStatus = VersionStatus.PROMOTED,
    status_reason: str = "",
    report_to: ReportTo | None = None,
    judge: Callable[[PolicyVersion], GateReport | None] | None = None,
    on_progress: TrainProgress | None = None,
) -> tuple[TrainingRun, TrainResult, PolicyVersion, GateReport | None]:
    """Trains `parent` (default: `current`, the served version) into the version after the
    agent's newest registered one (a rejected version keeps its number), registered with
    `status`; a KL penalty anchors to version `kl_version` (recorded in the run's config as
    `reference_version`, its checkpoint as `reference`). Its steps and summary go to the
    database and to the tracker (`report_to`, default the settings' FW_REPORT_TO); `judge`
    gates the registered version and its verdict goes to the tracker too (under eval/);
    `on_progress` hears of every step."""
    from futureworld.rl.launch import train

    engine = ctx.engine
    parent = parent or current
    number = ctx.newest_version(agent).version + 1
    model_dir, adapter_dir = model_and_adapter(agent, parent, config.lora)
    reference = None
    if config.kl_coef > 0:
        anchor = reference_version(ctx, agent, current, kl_version, lora=config.lora)
        reference = Path(anchor.checkpoint_path)
    run_config = {
        **run_config,
        "reference": None if reference is None else str(reference),
        "reference_version": None if reference is None else kl_version,
        "code": code_version(),
    }
    run = run_transaction(
        engine,
        lambda session: start_training_run(
            session,
            TrainingRun(
                agent_id=agent.id,
                from_version=parent.version,
                config=run_config,
                made_at=ctx.as_of,
            ),
        ),
        what="train: start run",
    )
    target = ctx.checkpoint_dir(agent, number)
    target.parent.mkdir(parents=True, exist_ok=True)
    _free_target(target)
    with session_scope(engine) as session:
        steps_before = agent_train_steps(session, agent.id)
    tracker = open_tracker(
        ctx.settings, agent.name, f"v{number}-run{run.id}", run_config, report_to=report_to
    )

    pending: list[TrainStep] = []
    done = 0

    def flush_steps() -> None:
        run_transaction(
            engine, lambda session: record_train_steps(session, pending), what="train: steps"
        )
        pending.clear()

    def on_step(step: int, metrics: dict[str, float]) -> None:
        nonlocal done
        # Buffered, so the training loop does not pay a database commit per step.
        pending.append(
            TrainStep(training_run_id=run.id, step=step, loss=metrics["loss"], metrics=metrics)
        )
        if len(pending) >= STEP_FLUSH_EVERY:
            flush_steps()
        # x-axis: the agent's optimiser steps across its updates, so curves continue
        log_update_step(tracker, steps_before + step, metrics)
        done += 1
        if on_progress is not None:
            on_progress(done, int(metrics["steps_planned"]), metrics)

    if nproc == 1:
        # In this process: its torch threads are the cores it may use. torchrun's ranks set
        # their own (futureworld.rl.launch).
        set_torch_threads(override=ctx.settings.torch_threads)
    try:
        result = train(
            model_dir,
            items,
            config,
            target,
            adapter_dir=adapter_dir,
            resume_from=resume_from,
            reference_dir=reference,
            on_step=on_step,
            nproc=nproc,
            torch_threads=ctx.settings.torch_threads,
        )
    except BaseException as error:
        flush_steps()
        tracker.finish(failed=True)
        message = repr(error)[:2000]
        run_transaction(
            engine,
            lambda session: finish_training_run(session, run.id, status="failed", error=message),
            what="train: fail run",
        )
        raise
    flush_steps()
    summary = update_summary(items, config, result)
    log_update_summary(tracker, number, summary)
    beliefless = summary.get("beliefless_multi_turn_fraction", 0.0)
    if beliefless > 0:
        log.warning(
            "%s credits turns by the beliefs elicited after them, but %.0f%% of the multi-turn "
            "rollouts of this update elicited none, so their turns were credited from the 0.5 "
            "prior: sample with the agent's GenerationSettings.elicit_beliefs on",
            config.estimator,
            100 * beliefless,
        )

    def register(session: Any) -> PolicyVersion:
        # Retried on a transient error: the checkpoint is on disk, only the rows are redone.
        version = register_policy_version(
            session,
            PolicyVersion(
                agent_id=agent.id,
                version=number,
                parent_version=parent.version,
                checkpoint_path=str(target),
                checkpoint_sha256=result.checkpoint_sha256,
                training_run_id=run.id,
                status=status,
                status_reason=status_reason,
            ),
        )
        on_registered(session, run.id)
        finish_training_run(
            session,
            run.id,
            status="completed",
            to_version=version.version,
            rollouts_consumed=result.rollouts_used,
            summary=summary,
        )
        return version

    try:
        version = run_transaction(engine, register, what="train: register version")
        verdict = None if judge is None else judge(version)
    except BaseException:
        tracker.finish(failed=True)
        raise
    if verdict is not None:
        log_version_scores(tracker, number, gate_scores(verdict))
    tracker.finish()
    return run, result, version, verdict


@one_update_per_agent
def replay_and_train(
    ctx: PipelineContext,
    agent_name: str,
    options: TrainOptions,
    *,
    resume_from: Path | None = None,
    on_progress: TrainProgress | None = None,
) -> TrainReport | None:
    """Train `agent_name`'s newest policy on its completed, unconsumed groups (oldest first),
    on outcomes revealed by `ctx.as_of` only (a past-dated run never trains on its future).

    Returns None, changing nothing, when fewer than `options.min_groups` groups are ready.
    The AdamW state of the newest version carries over when it was an RL update of the same
    kind (`continued_optimizer`), unless `options.fresh_optimizer` or an explicit
    `resume_from` is given. `resume_from` must be a registered checkpoint of the agent: the
    update trains from it and records it as the new version's parent. `on_progress` hears of
    every optimiser step (`TrainProgress`).
    """
    agent = ctx.agent(agent_name)
    gate = gate_options(ctx)
    if gate is not None:
        _gate_left_candidates(ctx, agent.name, gate)
    current = ctx.current_version(agent)
    parent = (
        current if resume_from is None else registered_version(ctx, agent, current, resume_from)
    )
    lora = lora_for(agent, parent, options.lora)
    kl_version = kl_anchor(
        ctx, agent, parent, kl_reference=options.kl_reference, kl_trail=options.kl_trail, lora=lora
    )
    check_update(agent, current, kl_reference=kl_version, lora=lora)
    check_servable(ctx, agent, lora=lora)
    config = options.train_config(device=ctx.settings.device, lora=lora)
    retries = rejected_children(ctx, agent, parent.version)
    config = backed_off(config, options.rejection_backoff, retries)
    held_out = (
        frozenset() if gate is None else validation_question_ids(ctx, gate.validation_fraction)
    )
    with session_scope(ctx.engine) as session:
        batches = [
            select_replay_batch(
                session,
                agent.id,
                reward_fn=str(reward_fn),
                current_version=parent.version,
                max_groups=options.max_groups,
                reuse=options.reuse,
                as_of=ctx.as_of,
                exclude_question_ids=held_out,
            )
            for reward_fn in options.rewards
        ]
        batch = _merged_replay_batch(batches, options.max_groups)
        if options.estimator.learns_before_outcomes:
            # Unresolved groups too, on their provisional rewards (flows.stages.provisional).
            batch = with_provisional_groups(
                session,
                batch,
                agent.id,
                reward_fns=[str(fn) for fn in options.rewards],
                current_version=parent.version,
                as_of=ctx.as_of,
                max_groups=options.max_groups,
                reuse=options.reuse,
                exclude_question_ids=held_out,
            )
    if len(batch.groups) < max(options.min_groups, 1):
        return None
    if options.draw_groups is not None:
        batch = drawn_groups(batch, options.draw_groups, seed=_draw_seed(ctx, parent.version))
    rollouts = batch.rollouts
    run_config = {
        "train": config.to_json(),
        "max_groups": options.max_groups,
        "draw_groups": options.draw_groups,
        "reuse": options.reuse,
        "groups": len(batch.groups),
        "reward_fn": str(config.reward_fn),
        "kind_rewards": [str(fn) for fn in options.kind_rewards],
        "validation_fraction": 0.0 if gate is None else gate.validation_fraction,
        "kl_trail": options.kl_trail,
        "rejection_backoff": options.rejection_backoff,
        "rejected_from_parent": retries,
    }

    def consume(session: Any, run_id: int) -> None:
        record_consumption(session, run_id, agent.id, rollouts)

    if resume_from is None and not options.fresh_optimizer:
        resume_from = continued_optimizer(current, config)
    run_config["resumed_from"] = None if resume_from is None else str(resume_from)
    run, result, version, verdict = _run_update(
        ctx,
        agent,
        current,
        rollouts,
        config,
        run_config=run_config,
        on_registered=consume,
        parent=parent,
        resume_from=resume_from,
        nproc=options.nproc,
        kl_version=kl_version,
        status=VersionStatus.PROMOTED if gate is None else VersionStatus.CANDIDATE,
        status_reason=GATE_OFF if gate is None else "",
        report_to=options.report_to,
        judge=None if gate is None else lambda v: _gate(ctx, agent.name, v.version, gate),
        on_progress=on_progress,
    )
    return TrainReport(
        training_run_id=run.id,
        agent=agent.name,
        from_version=parent.version,
        to_version=version.version,
        groups=result.groups_used,
        rollouts=result.rollouts_used,
        groups_skipped=batch.skipped_small_groups + result.groups_skipped,
        remaining_groups=batch.remaining_groups,
        checkpoint_path=str(version.checkpoint_path),
        steps=[dict(m) for m in result.metrics],
        status=version.status if verdict is None else verdict.status,
        gate=verdict,
    )


def gate_options(ctx: PipelineContext) -> GateOptions | None:
    """The promotion gate every update passes through, on the settings' validation slice and
    sizes (FW_GATE_*); None when FW_VALIDATION_FRACTION is 0 (no gate: an update serves once
    registered)."""
    return None if ctx.settings.validation_fraction <= 0 else ctx.settings.gate()


def _gate(ctx: PipelineContext, agent_name: str, version: int, gate: GateOptions):
    """The gate's verdict on a new version; None, the version left a candidate (never
    served; the next update's first act is to judge it again), when it could not judge."""
    try:
        return gate_version(ctx, agent_name, version, gate)
    except GateError as error:
        log.warning("%s", error)
        return None


def gate_scores(report: GateReport) -> dict[str, float]:
    """The gate's verdict as tracker scalars: the candidate's validation Brier (with resolved
    questions) and parse rate, its parent's, the questions scored and forecast and whether it
    was promoted (1) or rejected (0)."""
    scores = {
        "validation/questions": float(report.questions),
        "validation/health_questions": float(report.health_questions),
        "validation/promoted": float(report.status is VersionStatus.PROMOTED),
    }
    for side, health in (("", report.candidate), ("parent_", report.parent)):
        if health is not None:
            if health.brier is not None:
                scores[f"validation/{side}brier"] = health.brier
            scores[f"validation/{side}parse_rate"] = health.parse_rate
    return scores


def _gate_left_candidates(ctx: PipelineContext, agent_name: str, gate: GateOptions) -> None:
    """Judge the candidates an earlier run registered and did not gate (it crashed or the gate
    could not judge), so the update starts from the version that should serve."""
    for version in candidate_versions(ctx, agent_name):
        _gate(ctx, agent_name, version, gate)


def rejected_children(ctx: PipelineContext, agent: Agent, version: int) -> int:
    """How many of the agent's versions trained from `version` the gate (or a person)
    rejected: the failed attempts at the step this update takes again."""
    with session_scope(ctx.engine) as session:
        versions = list_policy_versions(session, agent.id or 0)
    return sum(v.parent_version == version and v.status is VersionStatus.REJECTED for v in versions)


def backed_off(config: TrainConfig, backoff: float | None, retries: int) -> TrainConfig:
    """`config` with its learning rate × backoff^retries (`TrainOptions.rejection_backoff`);
    unchanged without a backoff or a rejected attempt."""
    if backoff is None or retries == 0:
        return config
    return dataclasses.replace(config, learning_rate=config.learning_rate * backoff**retries)


def drawn_groups(batch: ReplayBatch, n: int, *, seed: int) -> ReplayBatch:
    """`n` of the batch's groups drawn at random without replacement by `seed`, kept in the
    batch's order (oldest first); the others are left for a later update (counted in
    remaining_groups). A batch of at most `n` groups is returned as it is."""
    if len(batch.groups) <= n:
        return batch
    chosen = sorted(random.Random(seed).sample(range(len(batch.groups)), n))
    return ReplayBatch(
        groups=tuple(batch.groups[i] for i in chosen),
        skipped_small_groups=batch.skipped_small_groups,
        remaining_groups=batch.remaining_groups + len(batch.groups) - n,
    )


def _draw_seed(ctx: PipelineContext, parent_version: int) -> int:
    """The update's draw: its as-of day and parent, so the same update re-run draws the same
    groups and a retry from the same parent on another day draws others."""
    return ctx.as_of.date().toordinal() * 100_003 + parent_version


def _merged_replay_batch(batches: Sequence[ReplayBatch], max_groups: int | None) -> ReplayBatch:
    """One batch of the groups of several rewards (each of its own question kind, so no group
    is in two), oldest group first, cut at `max_groups`."""
    if len(batches) == 1:
        return batches[0]
    groups = sorted(
        (group for batch in batches for group in batch.groups),
        key=lambda g: (g[0].trajectory.created_at, g[0].trajectory.id or 0),
    )
    chosen = groups if max_groups is None else groups[:max_groups]
    return ReplayBatch(
        groups=tuple(chosen),
        skipped_small_groups=sum(b.skipped_small_groups for b in batches),
        remaining_groups=sum(b.remaining_groups for b in batches) + len(groups) - len(chosen),
    )


@one_update_per_agent
def supervised_finetune(
    ctx: PipelineContext,
    agent_name: str,
    trajectories: Sequence[Trajectory],
    options: TrainOptions,
    *,
    on_progress: TrainProgress | None = None,
) -> TrainReport:
    """SFT on given trajectories (warm start, distillation): weight 1 on mask-1 tokens;
    `on_progress` hears of every optimiser step."""
    agent = ctx.agent(agent_name)
    current = ctx.current_version(agent)
    lora = lora_for(agent, current, options.lora)
    kl_version = kl_anchor(
        ctx, agent, current, kl_reference=options.kl_reference, kl_trail=options.kl_trail, lora=lora
    )
    check_update(agent, current, kl_reference=kl_version, lora=lora)
    check_servable(ctx, agent, lora=lora)
    config = options.with_config(estimator=Estimator.SFT).train_config(
        device=ctx.settings.device, lora=lora
    )
    run_config = {"train": config.to_json(), "sft_examples": len(trajectories)}
    run, result, version, _ = _run_update(
        ctx,
        agent,
        current,
        trajectories,
        config,
        run_config=run_config,
        on_registered=lambda session, run_id: None,
        nproc=options.nproc,
        kl_version=kl_version,
        status_reason=SUPERVISED,
        report_to=options.report_to,
        on_progress=on_progress,
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


def sft_trajectories_from_jsonl(
    ctx: PipelineContext, agent_name: str, path: Path
) -> list[Trajectory]:
    """Demonstrations from a JSONL file, tokenized with the agent's newest tokenizer."""
    from futureworld.agent.demonstrations import demonstration_trajectory, read_demonstrations

    agent = ctx.agent(agent_name)
    version = ctx.current_version(agent)
    tokenizer = ctx.tokenizer(agent, version)
    demonstrations = read_demonstrations(path.read_text(encoding="utf-8"), str(path))
    return [
        demonstration_trajectory(
            tokenizer, d, agent_id=agent.id, policy_version=version.version, sample_index=i
        )
        for i, d in enumerate(demonstrations)
    ]
