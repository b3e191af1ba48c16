"""`futureworld demo`: the whole delayed-reward loop on the simulated world, offline, on CPU.

tiny model from a config → SFT warm start on an over-confident reference forecaster →
R rounds of the daily cycle through the Prefect flows (harvest from the world's RSS feeds
and Manifold-compatible API over loopback → resolve → backfill → replay-and-train on the
groups that resolved, however stale → predict) while the simulated clock advances a day per
round → a final resolution pass → per-round metrics and a report folder.

Everything lives under `--out` (database, checkpoints, report); a rerun starts afresh.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from flows.demo_report import RoundMetrics, round_metrics, write_report
from flows.settings import Settings

LEARNER = "forecaster"
CROWD = "crowd"


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    out_dir: Path = Path("reports/demo")
    """Report folder; the demo's database, model and checkpoints go to `out_dir/state`."""
    rounds: int = 6
    """Simulated days of the daily cycle."""
    questions_per_day: int = 24
    """New questions the world poses each day."""
    samples: int = 6
    """Rollouts per question (the group size G)."""
    seed: int = 0
    max_horizon_days: int = 2
    """Questions resolve 1..this many days after they are posed: rewards arrive with delay."""
    sft_days: int = 10
    """Days of reference-forecaster demonstrations for the warm start (another world seed)."""
    sft_sharpening: float = 3.0
    """How over-confident the reference is: its log-odds are this multiple of the truth's."""
    sft_epochs: int = 6
    sft_learning_rate: float = 3e-3
    rl_learning_rate: float = 2e-4
    rl_epochs: int = 2
    estimator: str = "dr_grpo"
    min_groups: int = 4
    """Train in a round only when at least this many completed groups are waiting."""
    temperature: float = 1.0
    hidden_size: int = 64
    layers: int = 2
    train_overrides: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rounds < 2:
            raise ValueError(f"the demo needs at least 2 rounds to compare, got {self.rounds}")
        if self.questions_per_day < 1 or self.samples < 2:
            raise ValueError("questions_per_day must be >= 1 and samples >= 2")


@dataclass(frozen=True)
class DemoResult:
    rounds: list[RoundMetrics]
    report: Path
    out_dir: Path


Progress = Callable[[str, int, int], None]
"""progress(step description, completed, total)."""


def run_demo(config: DemoConfig, progress: Progress | None = None) -> DemoResult:
    from flows.pipeline import daily_cycle_flow, resolve_and_backfill_flow
    from flows.stages.training import supervised_finetune
    from futureworld.agent.demonstrations import (
        Demonstration,
        answer_text,
        demonstration_trajectory,
    )
    from futureworld.domain import Agent
    from futureworld.policy.tiny import init_tiny_model
    from futureworld.world import SimClock, World, WorldConfig, serve_world, sft_examples
    from storage.engine import make_engine, session_scope, upgrade_database
    from storage.repositories.agents import ensure_agent

    report = progress or (lambda _step, _done, _total: None)
    total = config.rounds + 4
    out_dir = config.out_dir.resolve()
    state = out_dir / "state"
    if state.exists():
        shutil.rmtree(state)
    state.mkdir(parents=True)
    world_config = WorldConfig(
        seed=config.seed,
        questions_per_day=config.questions_per_day,
        max_horizon_days=config.max_horizon_days,
        cancel_rate=0.02,
    )
    world = World(world_config)
    clock = SimClock(world.day_start(0) + timedelta(hours=12))

    report("building the tiny model", 0, total)
    warm_world = World(WorldConfig(seed=config.seed + 10_000, questions_per_day=24))
    examples = sft_examples(warm_world, config.sft_days, sharpening=config.sft_sharpening)
    model_dir = init_tiny_model(
        state / "base-model",
        seed=config.seed,
        hidden_size=config.hidden_size,
        num_layers=config.layers,
        extra_texts=[e.question.title for e in examples[:200]],
    )
    with serve_world(world, clock) as server:
        settings = Settings(
            data_dir=state,
            db_url=f"sqlite:///{state / 'futureworld.db'}",
            manifold_base_url=server.manifold_base_url,
        )
        _export(settings)
        engine = make_engine(settings.database_url)
        upgrade_database(engine)
        generation = {
            "temperature": config.temperature,
            "max_turns": 1,
            "max_new_tokens": 12,
            "max_total_tokens": 1024,
        }
        with session_scope(engine) as session:
            ensure_agent(
                session,
                Agent(
                    name=LEARNER, base_model=str(model_dir), backend="local", generation=generation
                ),
            )
            ensure_agent(session, Agent(name=CROWD, base_model="crowd", backend="baseline"))

        report("SFT warm start on the over-confident reference", 1, total)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        trajectories = [
            demonstration_trajectory(
                tokenizer,
                Demonstration(question=e.question, completion=answer_text(e.target_p_yes)),
                agent_id=0,
                policy_version=0,
                sample_index=i,
            )
            for i, e in enumerate(examples)
        ]
        supervised_finetune(
            engine,
            settings,
            LEARNER,
            trajectories,
            config_overrides={
                "learning_rate": config.sft_learning_rate,
                "ppo_epochs": config.sft_epochs,
            },
        )

        overrides = {
            "learning_rate": config.rl_learning_rate,
            "ppo_epochs": config.rl_epochs,
            **config.train_overrides,
        }
        for r in range(config.rounds):
            report(f"round {r}: daily cycle on {clock.now().date()}", 2 + r, total)
            daily_cycle_flow(
                as_of=clock.now().isoformat(),
                db_url=settings.database_url,
                sources=["manifold"],
                feeds=[server.feed_urls["all"]],
                samples=config.samples,
                estimator=config.estimator,
                min_groups=config.min_groups,
                train_overrides=overrides,
            )
            clock.advance(days=1)
        report("final resolution of the last rounds' questions", 2 + config.rounds, total)
        clock.advance(days=config.max_horizon_days + 1)
        resolve_and_backfill_flow(as_of=clock.now().isoformat(), db_url=settings.database_url)

    report("scoring rounds and writing the report", 3 + config.rounds, total)
    start_day = world.day_start(0).date()

    def round_of(at: datetime) -> int:
        return (at.date() - start_day).days

    metrics = round_metrics(engine, round_of=round_of, true_probability=world.true_probability)
    reliability = _first_last_reliability(engine, round_of, config.rounds)
    header = (
        f"# FutureWorld demo\n\nseed {config.seed}, {config.rounds} rounds, "
        f"{config.questions_per_day} questions/day, G = {config.samples}, "
        f"estimator {config.estimator}; forecasts are scored per round of the day they "
        "were made. The true-p Brier is the floor."
    )
    path = write_report(out_dir, metrics, agent=LEARNER, reliability=reliability, header=header)
    engine.dispose()
    report("done", total, total)
    return DemoResult(rounds=metrics, report=path, out_dir=out_dir)


def _export(settings: Settings) -> None:
    """The Prefect flows build their settings from the environment: point them at the demo."""
    os.environ["FW_DATA_DIR"] = str(settings.data_dir)
    os.environ["FW_DB_URL"] = settings.database_url
    os.environ["FW_MANIFOLD_BASE_URL"] = settings.manifold_base_url


def _first_last_reliability(engine, round_of, rounds):
    from futureworld.domain import OutcomeStatus
    from storage.engine import session_scope
    from storage.repositories.agents import get_agent
    from storage.repositories.questions import latest_outcomes
    from storage.repositories.rollouts import rollouts_for

    groups: dict[str, tuple[list[float], list[float]]] = {}
    with session_scope(engine) as session:
        outcomes = latest_outcomes(session)
        for t in rollouts_for(session, agent_id=get_agent(session, LEARNER).id):
            outcome = outcomes.get(t.question_id)
            if t.p_yes is None or t.as_of is None or outcome is None:
                continue
            if outcome.status is not OutcomeStatus.RESOLVED:
                continue
            r = round_of(t.as_of)
            if r in (0, rounds - 1):
                p, y = groups.setdefault(f"round {r}", ([], []))
                p.append(t.p_yes)
                y.append(float(outcome.value))
    return groups
