"""Prefect flows of the pipeline: harvest, predict, resolve-and-backfill, replay-and-train,
evaluate and the daily cycle chaining them. Each task wraps one stage call (flows.stages);
each flow builds its engine from Settings, keys its run by the as-of date (re-running a day
is safe: the stages are idempotent) and publishes artifacts (flows.artifacts)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from flows import artifacts
from flows.settings import Settings, parse_as_of

PREDICT_TAG = "futureworld-predict"
"""Tag-based concurrency limit on prediction tasks (`prefect concurrency-limit create`)."""
TRAIN_TAG = "futureworld-train"
"""Tag-based concurrency limit on training tasks: one trainer per accelerator."""
IO_RETRY_DELAYS_S = [10, 60]


@dataclass(frozen=True, kw_only=True)
class FlowContext:
    """What every flow run needs: settings, an engine on the migrated database, its as-of."""

    settings: Settings
    engine: Engine
    as_of: datetime
    """The run's instant (tz-aware UTC)."""
    run_key: str
    """The as-of date (YYYY-MM-DD): names the run and keys its pipeline events."""


def run_key_for(as_of: datetime) -> str:
    return as_of.date().isoformat()


def _run_name(prefix: str) -> Callable[[], str]:
    def name() -> str:
        params = flow_run.parameters or {}
        suffix = f"-{params['agent']}" if params.get("agent") else ""
        return f"{prefix}{suffix}-{run_key_for(parse_as_of(params.get('as_of')))}"

    return name


@contextmanager
def flow_context(as_of: str | None, db_url: str | None) -> Iterator[FlowContext]:
    from storage.engine import make_engine, upgrade_database

    settings = Settings().with_db(db_url)
    engine = make_engine(settings.database_url)
    try:
        upgrade_database(engine)
        moment = parse_as_of(as_of)
        yield FlowContext(
            settings=settings, engine=engine, as_of=moment, run_key=run_key_for(moment)
        )
    finally:
        engine.dispose()


def _transient(_task: Any, _task_run: Any, state: Any) -> bool:
    """Retry I/O tasks only on errors another attempt can fix (network, database busy)."""
    error = state.result(raise_on_failure=False)
    return isinstance(error, OSError | OperationalError | TimeoutError)


# ── tasks: one stage call each ───────────────────────────────────────────────────────────


@task(
    name="harvest",
    retries=2,
    retry_delay_seconds=IO_RETRY_DELAYS_S,
    retry_condition_fn=_transient,
    cache_policy=NO_CACHE,
)
def harvest_task(
    ctx: FlowContext, sources: Sequence[str] | None, feeds: Sequence[str] | None
) -> Any:
    from flows.stages.harvesting import harvest

    return harvest(
        ctx.engine, ctx.settings, sources=sources, feeds=feeds, now=ctx.as_of, run_key=ctx.run_key
    )


@task(
    name="resolve",
    retries=2,
    retry_delay_seconds=IO_RETRY_DELAYS_S,
    retry_condition_fn=_transient,
    cache_policy=NO_CACHE,
)
def resolve_task(ctx: FlowContext) -> Any:
    from flows.runtime import configured_judge
    from flows.stages.harvesting import resolve

    return resolve(
        ctx.engine,
        ctx.settings,
        now=ctx.as_of,
        run_key=ctx.run_key,
        judge=configured_judge(ctx.settings, ctx.engine),
    )


@task(name="backfill-rewards", cache_policy=NO_CACHE)
def backfill_task(ctx: FlowContext) -> Any:
    from flows.stages.scoring import backfill_rewards

    return backfill_rewards(ctx.engine)


@task(name="predict", task_run_name="predict-{agent}", tags=[PREDICT_TAG], cache_policy=NO_CACHE)
def predict_task(ctx: FlowContext, agent: str, samples: int, limit: int | None) -> Any:
    from flows.stages.predicting import predict
    from storage.engine import session_scope
    from storage.repositories.agents import get_agent

    with session_scope(ctx.engine) as session:
        backend = get_agent(session, agent).backend
    factory = None if backend == "baseline" else _runner_factory(ctx)
    return predict(
        ctx.engine,
        agent,
        samples=samples,
        as_of=ctx.as_of,
        limit=limit,
        worker=ctx.settings.worker_id,
        lease_s=ctx.settings.claim_lease_s,
        runner_factory=factory,
    )


def _runner_factory(ctx: FlowContext) -> Any:
    from flows.runtime import runner_factory

    return runner_factory(ctx.settings, ctx.engine)


@task(
    name="replay-and-train", task_run_name="train-{agent}", tags=[TRAIN_TAG], cache_policy=NO_CACHE
)
def train_task(
    ctx: FlowContext,
    agent: str,
    estimator: str,
    max_groups: int | None,
    lora: bool,
    min_groups: int,
    train_overrides: dict[str, Any] | None = None,
) -> Any:
    from flows.stages.training import replay_and_train

    return replay_and_train(
        ctx.engine,
        ctx.settings,
        agent,
        estimator=estimator,
        max_groups=max_groups,
        lora=lora,
        min_groups=min_groups,
        config_overrides=train_overrides,
    )


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate_task(ctx: FlowContext, agents: Sequence[str] | None) -> list[Any]:
    from flows.stages.scoring import forecast_records

    return forecast_records(ctx.engine, list(agents) if agents else None)


# ── publishing ───────────────────────────────────────────────────────────────────────────


def _publish_evaluation(ctx: FlowContext, records: list[Any]) -> list[Any]:
    from futureworld.evaluation import score_forecasts

    rows = score_forecasts(records)
    artifacts.publish_scores(
        rows, records, reports_dir=ctx.settings.data_dir / "reports", run_key=ctx.run_key
    )
    return rows


def _publish_training(ctx: FlowContext, agent: str, report: Any) -> None:
    if report is None:
        return
    title = (
        f"{agent}: v{report.from_version} → v{report.to_version} "
        f"({report.groups} groups, {report.rollouts} rollouts) {ctx.run_key}"
    )
    artifacts.publish_training(
        agent,
        list(report.steps),
        reports_dir=ctx.settings.data_dir / "reports",
        run_key=ctx.run_key,
        title=title,
    )


# ── flows ────────────────────────────────────────────────────────────────────────────────


@flow(name="harvest", flow_run_name=_run_name("harvest"))
def harvest_flow(
    as_of: str | None = None,
    db_url: str | None = None,
    sources: list[str] | None = None,
    feeds: list[str] | None = None,
) -> Any:
    """Harvest open questions from `sources` and articles from `feeds` (default: settings)."""
    with flow_context(as_of, db_url) as ctx:
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
    db_url: str | None = None,
    samples: int = 1,
    limit: int | None = None,
) -> Any:
    """Forecast every question open at `as_of` that the agent's current policy has not."""
    with flow_context(as_of, db_url) as ctx:
        return predict_task(ctx, agent, samples, limit)


@flow(name="resolve-and-backfill", flow_run_name=_run_name("resolve-and-backfill"))
def resolve_and_backfill_flow(as_of: str | None = None, db_url: str | None = None) -> Any:
    """Record outcomes of questions past their close, then score their rollouts once."""
    with flow_context(as_of, db_url) as ctx:
        resolved = resolve_task(ctx)
        backfilled = backfill_task(ctx)
        return resolved, backfilled


@flow(name="replay-and-train", flow_run_name=_run_name("replay-and-train"))
def replay_and_train_flow(
    agent: str,
    as_of: str | None = None,
    db_url: str | None = None,
    estimator: str = "dr_grpo",
    max_groups: int | None = None,
    lora: bool = False,
    min_groups: int = 1,
) -> Any:
    """Replay the agent's completed groups into one staleness-corrected update and register
    the new policy version; does nothing while fewer than `min_groups` groups are complete."""
    with flow_context(as_of, db_url) as ctx:
        report = train_task(ctx, agent, estimator, max_groups, lora, min_groups)
        if report is None:
            get_run_logger().info("%s: fewer than %d completed groups", agent, min_groups)
        _publish_training(ctx, agent, report)
        return report


@flow(name="evaluate", flow_run_name=_run_name("evaluate"))
def evaluate_flow(
    as_of: str | None = None, db_url: str | None = None, agents: list[str] | None = None
) -> list[dict[str, Any]]:
    """Score every agent and policy version side by side, per source and overall."""
    with flow_context(as_of, db_url) as ctx:
        return [row.as_dict() for row in _publish_evaluation(ctx, evaluate_task(ctx, agents))]


@flow(name="daily-cycle", flow_run_name=_run_name("daily-cycle"))
def daily_cycle_flow(
    as_of: str | None = None,
    db_url: str | None = None,
    sources: list[str] | None = None,
    feeds: list[str] | None = None,
    samples: int = 4,
    limit: int | None = None,
    estimator: str = "dr_grpo",
    min_groups: int = 8,
    lora: bool = False,
    train_overrides: dict[str, Any] | None = None,
) -> list[artifacts.StageSummary]:
    """harvest → resolve → backfill → per agent: train (LLM agents with ≥ `min_groups`
    completed groups), then predict → evaluate all agents. A failing stage is recorded in
    the summary artifact and the cycle goes on; the run fails at the end if any stage did."""
    from storage.engine import session_scope
    from storage.repositories.agents import list_agents

    with flow_context(as_of, db_url) as ctx:
        stages: list[artifacts.StageSummary] = []
        _step(stages, "harvest", harvest_task, ctx, sources, feeds)
        _step(stages, "resolve", resolve_task, ctx)
        _step(stages, "backfill", backfill_task, ctx)
        with session_scope(ctx.engine) as session:
            agents = list_agents(session)
        for agent in agents:
            if agent.backend != "baseline":
                report = _step(
                    stages,
                    f"train {agent.name}",
                    train_task,
                    ctx,
                    agent.name,
                    estimator,
                    None,
                    lora,
                    min_groups,
                    train_overrides,
                    skipped=f"fewer than {min_groups} completed groups",
                )
                _publish_training(ctx, agent.name, report)
            _step(stages, f"predict {agent.name}", predict_task, ctx, agent.name, samples, limit)
        records = _step(stages, "evaluate", evaluate_task, ctx, None, counted=False)
        if records is not None:
            rows = _publish_evaluation(ctx, records)
            stages[-1] = artifacts.StageSummary(
                stage="evaluate", counts={"forecasts_scored": len(records), "rows": len(rows)}
            )
        artifacts.publish_cycle_summary(ctx.run_key, stages)
        failed = [s.stage for s in stages if s.failed is not None]
        if failed:
            raise RuntimeError(f"daily cycle {ctx.run_key}: stages failed: {', '.join(failed)}")
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
    note = skipped if result is None else ""
    stages.append(artifacts.summarise(label, result if counted else None, note=note))
    return result


FLOWS = {
    "harvest": harvest_flow,
    "predict": predict_flow,
    "resolve-and-backfill": resolve_and_backfill_flow,
    "replay-and-train": replay_and_train_flow,
    "evaluate": evaluate_flow,
    "daily-cycle": daily_cycle_flow,
}
"""Every flow by its Prefect name (deployments and `serve` use these)."""
