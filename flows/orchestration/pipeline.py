"""Prefect flows of the pipeline: harvest, predict, resolve-and-backfill, replay-and-train,
evaluate, the daily cycle chaining them, and the backtest replaying it over imported history.
Only @flow/@task wrappers live here: each task
calls one stage (flows.stages) with the run's context (flows.context), each flow keys its run
by the as-of date (re-running a day is safe: the stages are idempotent) and publishes
artifacts (flows.orchestration.artifacts). Parameters are typed: strings, numbers, lists and
the pydantic `TrainOptions`.

No flow takes the database URL as a parameter: Prefect stores parameters in its database and
shows them in the UI, and the URL carries the password. Every flow reads it from the
environment of the process that runs it (FW_DB_URL), or from the Prefect Secret block that
FW_DB_URL_SECRET names (`pipeline_settings`).

The harvest and resolve stages judge each source they asked; in the daily cycle a stage whose
source failed completely is a failed stage (the cycle goes on, then fails at the end), and one
whose sources were partial notes it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import date
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from sqlalchemy.exc import OperationalError

from flows.context import PipelineContext, open_context, run_key_for
from flows.orchestration import artifacts
from flows.settings import Settings, parse_as_of
from flows.stages.backfilling import BackfillReport, backfill_rewards
from flows.stages.backtesting import BacktestOptions, BacktestReport, run_backtest
from flows.stages.evaluating import Evaluation, evaluate
from flows.stages.harvesting import HarvestReport, harvest
from flows.stages.predicting import PredictReport, predict
from flows.stages.problems import any_failed
from flows.stages.promotion import version_health, version_lineage
from flows.stages.provisional import ProvisionalReport, write_provisional_rewards
from flows.stages.resolving import ResolveReport, resolve
from flows.stages.serving import ServeReport, serve_current_version
from flows.stages.training import SUPERVISED, TrainOptions, TrainReport, replay_and_train
from futureworld.baselines import Baseline
from futureworld.evaluation import ScoreRow
from futureworld.rewards import RewardFn
from storage.engine import session_scope
from storage.repositories.agents import list_agents

PREDICT_TAG = "futureworld-predict"
"""Tag-based concurrency limit on prediction tasks (`prefect concurrency-limit create`)."""
TRAIN_TAG = "futureworld-train"
"""Tag-based concurrency limit on training tasks: one trainer per accelerator."""
IO_RETRY_DELAYS_S = [10, 60]
DAILY_TRAIN = TrainOptions(min_groups=8)
"""The daily cycle's update: train once eight completed groups wait; a LoRA adapter or all
weights as the agent's serving allows (`lora` unset: an adapter for an agent on a vLLM server)."""


def _run_name(prefix: str) -> Callable[[], str]:
    def name() -> str:
        params = flow_run.parameters or {}
        suffix = f"-{params['agent']}" if params.get("agent") else ""
        return f"{prefix}{suffix}-{run_key_for(parse_as_of(params.get('as_of')))}"

    return name


class CycleFailed(RuntimeError):
    """A daily cycle in which some stage failed; it carries every stage's summary."""

    def __init__(self, message: str, stages: Sequence[artifacts.StageSummary]) -> None:
        super().__init__(message)
        self.stages = list(stages)


def pipeline_settings() -> Settings:
    """The flows' settings: this process's environment (FW_*); when FW_DB_URL is unset and
    FW_DB_URL_SECRET names a Prefect Secret block, the database URL is that secret's value."""
    settings = Settings()
    if settings.db_url is None and settings.db_url_secret:
        from prefect.blocks.system import Secret

        secret = Secret.load(settings.db_url_secret)
        settings = settings.with_db(str(secret.get()))
    return settings


def _open(as_of: str | None) -> Any:
    """The run's context on the configured database (see `pipeline_settings`)."""
    return open_context(pipeline_settings(), as_of=as_of)


def _transient(_task: Any, _task_run: Any, state: Any) -> bool:
    """Retry I/O tasks only on errors another attempt can fix (network, database busy)."""
    error = state.result(raise_on_failure=False)
    return isinstance(error, OSError | OperationalError | TimeoutError)


def _said(label: str, report: Any) -> Any:
    """Log what a stage did in one line (its report's counts) to the Prefect run logger, so
    a task run's Logs tab says more than its final state; returns the report."""
    counts = artifacts.report_counts(report)
    text = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts.items())
    get_run_logger().info("%s: %s", label, text or ("nothing to do" if report is None else "done"))
    return report


PROGRESS_INTERVAL_S = 1.0
"""Least time between two updates of a stage's progress artifact before it is done. Each
update is a call to the Prefect API from the thread that completed the unit (predict's
writer, the update's step loop), with a client built for it; unthrottled (once per whole
percent) they took 111 s of a 19-minute research demo's main process."""


class StageProgress:
    """A stage's progress as a Prefect progress artifact (0–100 %), created when the stage
    knows its total and updated as units complete: at most once per whole percent and per
    `PROGRESS_INTERVAL_S`, and always at 100 %."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.total = 0
        self.done = 0
        self._id: Any = None
        self._shown = -1
        self._shown_at = 0.0

    def start(self, total: int) -> None:
        self.total = total
        if total > 0:
            self._id = create_progress_artifact(0.0, description=self.description)
            self._shown, self._shown_at = 0, time.monotonic()

    def advance(self) -> None:
        self.done += 1
        if self._id is not None:
            self._show(min(99, int(100 * self.done / self.total)))

    def reach(self, done: int, total: int) -> None:
        """`done` of `total` units complete: for a stage that learns its total as it goes
        (an update's planned optimiser steps come with its first step)."""
        if self._id is None:
            self.start(total)
        self.total, self.done = total, done
        if self._id is not None:
            self._show(min(99, int(100 * done / total)))

    def finish(self) -> None:
        """The stage returned: its work is done (a total counts what it might have had to do,
        e.g. groups another worker completed first)."""
        if self._id is not None:
            self._show(100)

    def _show(self, percent: int) -> None:
        now = time.monotonic()
        if percent > self._shown and (
            percent == 100 or now - self._shown_at >= PROGRESS_INTERVAL_S
        ):
            update_progress_artifact(self._id, float(percent))
            self._shown, self._shown_at = percent, now


# ── tasks: one stage call each ───────────────────────────────────────────────────────────


@task(
    name="harvest",
    retries=2,
    retry_delay_seconds=IO_RETRY_DELAYS_S,
    retry_condition_fn=_transient,
    cache_policy=NO_CACHE,
)
def harvest_task(
    ctx: PipelineContext, sources: Sequence[str] | None, feeds: Sequence[str] | None
) -> HarvestReport:
    return _said("harvest", harvest(ctx, sources=sources, feeds=feeds))


@task(
    name="resolve",
    retries=2,
    retry_delay_seconds=IO_RETRY_DELAYS_S,
    retry_condition_fn=_transient,
    cache_policy=NO_CACHE,
)
def resolve_task(ctx: PipelineContext) -> ResolveReport:
    return _said("resolve", resolve(ctx))


@task(name="backfill-rewards", cache_policy=NO_CACHE)
def backfill_task(ctx: PipelineContext) -> BackfillReport:
    return _said("backfill", backfill_rewards(ctx))


@task(name="predict", task_run_name="predict-{agent}", tags=[PREDICT_TAG], cache_policy=NO_CACHE)
def predict_task(
    ctx: PipelineContext, agent: str, samples: int, limit: int | None
) -> PredictReport:
    progress = StageProgress(f"predict {agent}: questions forecast")
    report = predict(
        ctx,
        agent,
        samples=samples,
        limit=limit,
        on_group=lambda _n: progress.advance(),
        on_total=progress.start,
    )
    progress.finish()
    return _said(f"predict {agent}", report)


@task(name="provisional-rewards", task_run_name="provisional-{agent}", cache_policy=NO_CACHE)
def provisional_task(ctx: PipelineContext, agent: str, reward_fn: RewardFn) -> ProvisionalReport:
    return _said(f"provisional {agent}", write_provisional_rewards(ctx, agent, reward_fn=reward_fn))


@task(
    name="replay-and-train", task_run_name="train-{agent}", tags=[TRAIN_TAG], cache_policy=NO_CACHE
)
def train_task(ctx: PipelineContext, agent: str, options: TrainOptions) -> TrainReport | None:
    progress = StageProgress(f"train {agent}: optimiser steps done")
    report = replay_and_train(
        ctx, agent, options, on_progress=lambda done, total, _m: progress.reach(done, total)
    )
    progress.finish()
    return _said(f"train {agent}", report)


@task(
    name="serve",
    task_run_name="serve-{agent}",
    retries=2,
    retry_delay_seconds=IO_RETRY_DELAYS_S,
    retry_condition_fn=_transient,
    cache_policy=NO_CACHE,
)
def serve_task(ctx: PipelineContext, agent: str) -> ServeReport:
    report = serve_current_version(ctx, agent)
    get_run_logger().info("serve %s: v%d %s", agent, report.version, report.action)
    return report


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(
    ctx: PipelineContext, agents: Sequence[str] | None, round: str | None = None
) -> Evaluation:
    return evaluate(ctx, agents, round=None if round is None else date.fromisoformat(round))


@task(name="backtest", task_run_name="backtest-{agent}", tags=[TRAIN_TAG], cache_policy=NO_CACHE)
def backtest_task(ctx: PipelineContext, agent: str, options: BacktestOptions) -> BacktestReport:
    progress = StageProgress(f"backtest {agent}: simulated days done")
    progress.start(len(options.clocks()))
    report = run_backtest(
        ctx,
        options,
        out_dir=ctx.reports_dir / f"backtest-{agent}",
        on_round=lambda _round: progress.advance(),
    )
    progress.finish()
    return _said(f"backtest {agent}", report)


# ── publishing ───────────────────────────────────────────────────────────────────────────


def _publish_evaluation(ctx: PipelineContext, evaluation: Evaluation) -> set[str]:
    """The scores' artifacts, and the dashboard of every generating agent scored (returned)."""
    artifacts.publish_scores(
        evaluation.rows, evaluation.records, reports_dir=ctx.reports_dir, run_key=ctx.run_key
    )
    scored = {r.agent for r in evaluation.rows if r.agent is not None}
    dashboards = {name for name in scored if ctx.agent(name).backend.generates}
    for name in sorted(dashboards):
        _publish_dashboard(ctx, name, evaluation.rows)
    return dashboards


def _publish_dashboard(
    ctx: PipelineContext, agent: str, scores: Sequence[ScoreRow] | None = None
) -> None:
    """The agent's run dashboard (artifacts.publish_dashboard): after an update with the gate's
    and the updates' figures, after an evaluate also with each version's live scores and the
    references: the crowd's Brier, the base model's (v0) and the warm start's (a supervised
    version) where evaluate scored them."""
    live = {} if scores is None else artifacts.live_scores(scores, agent)
    versions = version_lineage(ctx, agent)
    references: dict[str, float] = {}
    crowd = artifacts.live_scores(scores or (), Baseline.CROWD.value)
    if crowd:  # the crowd baseline has one version
        references["crowd"] = crowd[min(crowd)]["brier"]
    if 0 in live:
        references["base v0"] = live[0]["brier"]
    warm = [v.version for v in versions if v.status_reason == SUPERVISED and v.version in live]
    if warm:
        references[f"warm start v{warm[-1]}"] = live[warm[-1]]["brier"]
    rows = artifacts.dashboard_rows(versions, version_health(ctx, agent), live)
    artifacts.publish_dashboard(
        agent, rows, references=references, reports_dir=ctx.reports_dir, run_key=ctx.run_key
    )


def _publish_training(
    ctx: PipelineContext, agent: str, report: TrainReport | None, *, dashboard: bool = True
) -> None:
    """The update's training curves and, unless `dashboard` is off (a daily cycle publishes
    each dashboard once, after its evaluate), the agent's dashboard."""
    if report is None:
        return
    title = (
        f"{agent}: v{report.from_version} → v{report.to_version} "
        f"({report.groups} groups, {report.rollouts} rollouts) {ctx.run_key}"
    )
    artifacts.publish_training(
        agent, list(report.steps), reports_dir=ctx.reports_dir, run_key=ctx.run_key, title=title
    )
    if dashboard:
        _publish_dashboard(ctx, agent)
    if report.gate is not None:
        verdict = f"{report.status} ({report.gate.reason})"
        get_run_logger().info("%s v%d: %s", agent, report.to_version, verdict)


# ── flows ────────────────────────────────────────────────────────────────────────────────


@flow(name="harvest", flow_run_name=_run_name("harvest"))
def harvest_flow(
    as_of: str | None = None,
    sources: list[str] | None = None,
    feeds: list[str] | None = None,
) -> HarvestReport:
    """Harvest open questions from `sources` and articles from `feeds` (default: settings)."""
    with _open(as_of) as ctx:
        report = harvest_task(ctx, sources, feeds)
        artifacts.publish_cycle_summary(
            ctx.run_key,
            [artifacts.summarise("harvest", report)],
            key=artifacts.HARVEST_SUMMARY_KEY,
        )
        return report


@flow(name="predict", flow_run_name=_run_name("predict"))
def predict_flow(
    agent: str,
    as_of: str | None = None,
    samples: int = 1,
    limit: int | None = None,
) -> PredictReport:
    """Forecast every question open at `as_of` that the agent's current policy has not."""
    with _open(as_of) as ctx:
        return predict_task(ctx, agent, samples, limit)


@flow(name="resolve-and-backfill", flow_run_name=_run_name("resolve-and-backfill"))
def resolve_and_backfill_flow(as_of: str | None = None) -> tuple[ResolveReport, BackfillReport]:
    """Record outcomes of questions past their close, then score their rollouts once."""
    with _open(as_of) as ctx:
        resolved = resolve_task(ctx)
        backfilled = backfill_task(ctx)
        return resolved, backfilled


@flow(name="replay-and-train", flow_run_name=_run_name("replay-and-train"))
def replay_and_train_flow(
    agent: str,
    as_of: str | None = None,
    train: TrainOptions = TrainOptions(),
) -> TrainReport | None:
    """Replay the agent's completed groups into one staleness-corrected update (on
    `train.nproc` processes) and register the new policy version, then make the agent's
    server sample its newest version; trains nothing while fewer than `train.min_groups`
    groups are complete. `train.lora` unset trains an adapter for an agent on a vLLM server,
    which the serve step loads without a restart (flows.stages.lineage.lora_for)."""
    with _open(as_of) as ctx:
        report = train_task(ctx, agent, train)
        if report is None:
            get_run_logger().info("%s: fewer than %d completed groups", agent, train.min_groups)
        _publish_training(ctx, agent, report)
        serve_task(ctx, agent)  # the next predict samples the new version (flows.stages.serving)
        return report


@flow(name="evaluate", flow_run_name=_run_name("evaluate"))
def evaluate_flow(
    as_of: str | None = None, agents: list[str] | None = None, round: str | None = None
) -> list[dict[str, Any]]:
    """Score every agent and policy version side by side, per source and overall (`round`,
    YYYY-MM-DD: only the forecasts of that ForecastBench round's questions)."""
    with _open(as_of) as ctx:
        evaluation = evaluate_task(ctx, agents, round)
        _publish_evaluation(ctx, evaluation)
        return [row.as_dict() for row in evaluation.rows]


@flow(name="daily-cycle", flow_run_name=_run_name("daily-cycle"))
def daily_cycle_flow(
    as_of: str | None = None,
    sources: list[str] | None = None,
    feeds: list[str] | None = None,
    samples: int = 4,
    limit: int | None = None,
    train: TrainOptions = DAILY_TRAIN,
) -> list[artifacts.StageSummary]:
    """harvest → resolve → backfill → per agent: train (agents with a trainable policy and ≥
    `train.min_groups` completed groups), serve the newest version, then predict, then
    (estimator provisional_consensus only) the provisional rewards of its unresolved groups
    → evaluate all agents. A failing stage is recorded in the summary artifact and the cycle
    goes on; the run fails at the end if any stage did. The dashboard of each generating
    agent that was scored or updated is published once, after evaluate: with its live scores,
    or without them where evaluate scored none of its forecasts (a plot costs ~1 s: one after
    the update as well, replaced minutes later, took 19 s of a 19-minute research demo's main
    thread)."""
    with _open(as_of) as ctx:
        stages: list[artifacts.StageSummary] = []
        _step(stages, "harvest", harvest_task, ctx, sources, feeds)
        _step(stages, "resolve", resolve_task, ctx)
        _step(stages, "backfill", backfill_task, ctx)
        with session_scope(ctx.engine) as session:
            agents = list_agents(session)
        trained: set[str] = set()
        for agent in agents:
            if agent.backend.generates:
                report = _step(
                    stages,
                    f"train {agent.name}",
                    train_task,
                    ctx,
                    agent.name,
                    train,
                    skipped=f"fewer than {train.min_groups} completed groups",
                )
                _publish_training(ctx, agent.name, report, dashboard=False)
                if report is not None:
                    trained.add(agent.name)
                _step(stages, f"serve {agent.name}", serve_task, ctx, agent.name, counted=False)
            _step(stages, f"predict {agent.name}", predict_task, ctx, agent.name, samples, limit)
            if agent.backend.generates and train.estimator.learns_before_outcomes:
                _step(
                    stages,
                    f"provisional {agent.name}",
                    provisional_task,
                    ctx,
                    agent.name,
                    train.reward_fn,
                )
        evaluation = _step(stages, "evaluate", evaluate_task, ctx, None, counted=False)
        if evaluation is not None:
            trained -= _publish_evaluation(ctx, evaluation)
            stages[-1] = artifacts.StageSummary(
                stage="evaluate",
                counts={"forecasts_scored": len(evaluation.records), "rows": len(evaluation.rows)},
            )
        for name in sorted(trained):  # updated, not scored: its dashboard after the update
            _publish_dashboard(ctx, name)
        artifacts.publish_cycle_summary(ctx.run_key, stages)
        failed = [s.stage for s in stages if s.failed is not None]
        if failed:
            raise CycleFailed(
                f"daily cycle {ctx.run_key}: stages failed: {', '.join(failed)}", stages
            )
        return stages


def _step(
    stages: list[artifacts.StageSummary],
    label: str,
    fn: Any,
    *args: Any,
    skipped: str = "",
    counted: bool = True,
) -> Any:
    """Run one task, record what it did (or why it failed) and go on either way."""
    state = fn(*args, return_state=True)
    if not state.is_completed():
        error = state.result(raise_on_failure=False)
        why = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
        get_run_logger().error("%s failed: %s", label, why)
        stages.append(artifacts.StageSummary(stage=label, failed=why))
        return None
    result = state.result()
    verdict = getattr(result, "verdict", None)
    note = skipped if result is None else (verdict or "")
    summary = artifacts.summarise(label, result if counted else None, note=note)
    if any_failed(getattr(result, "sources", {})):
        summary = replace(summary, failed=verdict, note="")
    stages.append(summary)
    return result


def _backtest_run_name() -> str:
    params = flow_run.parameters or {}
    return f"backtest-{params.get('agent')}-{params.get('start')}-{params.get('end')}"


@flow(name="backtest", flow_run_name=_backtest_run_name)
def backtest_flow(
    agent: str,
    start: str,
    end: str,
    step_days: int = 1,
    train_every: int = 1,
    samples: int = 1,
    limit: int | None = None,
    reference: str = "crowd",
    train: TrainOptions = TrainOptions(),
    round: str | None = None,
) -> list[dict[str, Any]]:
    """Replay the daily cycle over imported history from `start` to `end` (YYYY-MM-DD) with a
    simulated clock (flows.stages.backtesting); the report folder goes under the reports
    directory (backtest-AGENT), and the per-round table is the flow's result. `round`
    (YYYY-MM-DD): only that ForecastBench round's questions are forecast and scored."""
    options = BacktestOptions(
        agent=agent,
        start=date.fromisoformat(start),
        end=date.fromisoformat(end),
        step_days=step_days,
        train_every=train_every,
        samples=samples,
        limit=limit,
        reference=reference,
        train=train,
        round=None if round is None else date.fromisoformat(round),
    )
    with _open(start) as ctx:
        report = backtest_task(ctx, agent, options)
        return [
            {"round": r.round, "clock": r.clock.isoformat(), "n": r.n, "brier": r.brier,
             "reference_brier": r.reference_brier, "difference": r.difference}
            for r in report.rounds
        ]  # fmt: skip


FLOWS = {
    "harvest": harvest_flow,
    "predict": predict_flow,
    "resolve-and-backfill": resolve_and_backfill_flow,
    "replay-and-train": replay_and_train_flow,
    "evaluate": evaluate_flow,
    "daily-cycle": daily_cycle_flow,
    "backtest": backtest_flow,
}
"""Every flow by its Prefect name (deployments and `serve` use these)."""
