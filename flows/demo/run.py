"""`futureworld demo`: the whole delayed-reward loop on the simulated world, offline, on CPU.

tiny model from a config → SFT warm start on an over-confident (and noisy) reference
forecaster → R rounds of the daily cycle through the Prefect flows (harvest from the world's
RSS feeds and Manifold-compatible API over loopback → resolve → backfill → replay-and-train on
the groups that resolved, stale or not → predict) while the simulated clock advances a day per
round, and after each cycle the round's policy forecasts a fixed held-out panel → per-round
metrics and a report folder.

The defaults were tuned with benchmarks/learning_curve.py so that a 64-wide, 2-layer model
visibly learns on 2 CPU cores: brief prompts (the title states the cue), one rollout per
training row, dr_grpo at lr 1e-3 with 40 rollouts (5 questions) per optimiser step and the
AdamW moments carried from version to version. The panel is large (2000 questions, one
sample each) because the claim is judged on realised outcomes: calibration is worth a few
hundredths of Brier, and only a big panel, compared pairwise, tells that from luck.
Everything lives under `--out`; a rerun starts afresh. `out/demo.log` gets one line per
round (elapsed time, policy version, the panel's Brier and ECE), written as the round ends,
so progress is visible in a log whether or not anyone watches a terminal.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from flows.context import PipelineContext, build_context, open_engine
from flows.demo.panel import (
    CYCLE_HOUR,
    PANEL_QUESTIONS_PER_DAY,
    PanelScore,
    build_panel,
    score_panel,
    warm_start_questions,
    warm_start_trajectories,
)
from flows.demo.report import (
    LearningClaim,
    RoundMetrics,
    learning_claim,
    round_metrics,
    write_report,
)
from flows.settings import Settings
from flows.stages.training import TrainOptions
from futureworld.domain import Agent, BackendKind, GenerationSettings
from futureworld.rl.config import DEFAULT_ESTIMATOR, Estimator
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent

LEARNER = "forecaster"
CROWD = "crowd"


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    out_dir: Path = Path("reports/demo")
    """Report folder; the demo's database, model and checkpoints go to `out_dir/state`."""
    rounds: int = 30
    """Simulated days of the daily cycle."""
    questions_per_day: int = 40
    """New questions the world poses each day."""
    samples: int = 8
    """Rollouts per question (the group size G)."""
    seed: int = 0
    max_horizon_days: int = 2
    """Questions resolve 1..this many days after they are posed: rewards arrive with delay,
    and part of every update is trained on rollouts of an older policy version."""
    panel_questions: int = 2000
    """Held-out questions every round's policy forecasts (the same ones, the same outcomes)."""
    panel_samples: int = 1
    """Forecasts per panel question: the outcome noise is per question, so many questions
    with one sample each measure a policy better than fewer questions sampled repeatedly."""
    sft_days: int = 5
    sft_questions_per_day: int = 40
    sft_sharpening: float = 3.0
    """The reference's over-confidence: its log-odds are this multiple of the truth's."""
    sft_noise_logit: float = 1.0
    """Noise on the warm-start targets' log-odds, so the policy keeps spread to explore."""
    sft_epochs: int = 20
    sft_learning_rate: float = 1e-3
    rl_learning_rate: float = 1e-3
    rl_groups_per_step: int = 5
    """Whole groups per optimiser step: 5 questions × G = 8 = the 40 rollouts a step tuned
    with benchmarks/learning_curve.py (gradients accumulate over one-rollout rows)."""
    estimator: Estimator = DEFAULT_ESTIMATOR
    min_groups: int = 4
    """Train in a round only when at least this many completed groups are waiting."""
    temperature: float = 1.0
    hidden_size: int = 64
    layers: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "estimator", Estimator(self.estimator))
        if self.rounds < 2:
            raise ValueError(f"the demo needs at least 2 rounds to compare, got {self.rounds}")
        if self.questions_per_day < 1 or self.samples < 2 or self.panel_questions < 1:
            raise ValueError("questions_per_day and panel_questions must be >= 1, samples >= 2")

    @property
    def generation(self) -> GenerationSettings:
        """The learner's sampling: one brief turn, a short answer."""
        return GenerationSettings(
            temperature=self.temperature,
            max_turns=1,
            max_new_tokens=12,
            max_total_tokens=1024,
            brief_prompt=True,
            seed=self.seed,
        )

    @property
    def warm_start(self) -> TrainOptions:
        return TrainOptions(
            estimator=Estimator.SFT,
            learning_rate=self.sft_learning_rate,
            ppo_epochs=self.sft_epochs,
            micro_batch_tokens=1,
            groups_per_step=4,
        )

    @property
    def update(self) -> TrainOptions:
        """Each round's RL update: one rollout a packed row, `rl_groups_per_step` groups a step."""
        return TrainOptions(
            estimator=self.estimator,
            learning_rate=self.rl_learning_rate,
            micro_batch_tokens=1,
            groups_per_step=self.rl_groups_per_step,
            temperature=self.temperature,
            min_groups=self.min_groups,
        )


@dataclass(frozen=True)
class DemoResult:
    rounds: list[RoundMetrics]
    report: Path
    out_dir: Path
    claim: LearningClaim | None

    @property
    def learned(self) -> bool:
        return self.claim is not None and self.claim.learned


Progress = Callable[[str, int, int], None]
"""progress(step description, completed, total)."""


def run_demo(config: DemoConfig, progress: Progress | None = None) -> DemoResult:
    from flows.orchestration.pipeline import daily_cycle_flow, resolve_and_backfill_flow
    from flows.stages.training import supervised_finetune
    from futureworld.agent.demonstrations import answer_text
    from futureworld.agent.prompts import SYSTEM_PROMPT
    from futureworld.policy.tiny import init_tiny_model
    from futureworld.world import SimClock, World, WorldConfig, serve_world

    report = progress or (lambda _step, _done, _total: None)
    total = config.rounds + 3
    out_dir = config.out_dir.resolve()
    state = out_dir / "state"
    if state.exists():
        shutil.rmtree(state)
    state.mkdir(parents=True)
    world = World(
        WorldConfig(
            seed=config.seed,
            questions_per_day=config.questions_per_day,
            max_horizon_days=config.max_horizon_days,
        )
    )
    panel_world = World(
        WorldConfig(
            seed=config.seed,
            questions_per_day=min(config.panel_questions, PANEL_QUESTIONS_PER_DAY),
            cancel_rate=0.0,
        )
    )
    clock = SimClock(world.day_start(0) + timedelta(hours=CYCLE_HOUR))

    report("tiny model and SFT warm start", 0, total)
    warm_world = World(
        WorldConfig(seed=config.seed + 10_000, questions_per_day=config.sft_questions_per_day)
    )
    examples = warm_start_questions(
        warm_world,
        config.sft_days,
        sharpening=config.sft_sharpening,
        noise_logit=config.sft_noise_logit,
    )
    # The tokenizer also learns the prompt and the answer strings themselves.
    texts = [SYSTEM_PROMPT, *(f"{q.title} {q.background}" for q, _ in examples)]
    texts += [answer_text(k / 100) for k in range(101)]
    model_dir = init_tiny_model(
        state / "base-model",
        seed=config.seed,
        hidden_size=config.hidden_size,
        num_layers=config.layers,
        extra_texts=texts,
    )
    settings = Settings(data_dir=state, db_url=f"sqlite:///{state / 'futureworld.db'}")
    engine = open_engine(settings)
    ctx = build_context(settings, engine, as_of=clock.now())
    with session_scope(engine) as session:
        learner = ensure_agent(
            session,
            Agent(
                name=LEARNER,
                base_model=str(model_dir),
                backend=BackendKind.LOCAL,
                generation=config.generation,
            ),
        )
        ensure_agent(session, Agent(name=CROWD, base_model=CROWD, backend=BackendKind.BASELINE))
    tokenizer = ctx.tokenizer(learner, ctx.current_version(learner))
    supervised_finetune(
        ctx, LEARNER, warm_start_trajectories(tokenizer, examples), config.warm_start
    )

    panel = build_panel(panel_world, config.panel_questions)
    panels: list[PanelScore] = []
    round_log = _RoundLog(out_dir / "demo.log")
    with serve_world(world, clock) as server, _flow_environment(settings, server):
        for r in range(config.rounds):
            report(f"round {r}: daily cycle on {clock.now().date()}", 1 + r, total)
            daily_cycle_flow(
                as_of=clock.now().isoformat(),
                sources=["manifold"],
                feeds=[server.feed_urls["all"]],
                samples=config.samples,
                train=config.update,
            )
            panels.append(_score_panel(ctx, panel, r, config))
            round_log.write(panels[-1])
            clock.advance(days=1)
        report("final resolution and the report", 1 + config.rounds, total)
        clock.advance(days=config.max_horizon_days + 1)
        resolve_and_backfill_flow(as_of=clock.now().isoformat())

    start_day = world.day_start(0).date()

    def round_of(at: datetime) -> int:
        return (at.date() - start_day).days

    metrics = round_metrics(ctx, LEARNER, panels, round_of=round_of)
    header = (
        f"# FutureWorld demo\n\nseed {config.seed}; {config.rounds} rounds; "
        f"{config.questions_per_day} questions/day, G = {config.samples}, horizons 1–"
        f"{config.max_horizon_days} days; estimator {config.estimator}. Each round's policy is "
        f"scored on the same held-out panel of {config.panel_questions} questions × "
        f"{config.panel_samples} sample{'s' if config.panel_samples > 1 else ''}; the true-p "
        "Brier is the floor."
    )
    claim = learning_claim(panels)
    path = write_report(out_dir, metrics, panels, claim, header=header)
    engine.dispose()
    report("done", total, total)
    return DemoResult(rounds=metrics, report=path, out_dir=out_dir, claim=claim)


class _RoundLog:
    """One line per round, appended and flushed as the round ends."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._started = time.perf_counter()
        path.write_text("")

    def write(self, score: PanelScore) -> None:
        from futureworld.scoring import brier, expected_calibration_error

        line = (
            f"{time.perf_counter() - self._started:8.1f}s  round {score.round:>3}  "
            f"version {score.policy_version:>3}  panel Brier {brier(score.p_yes, score.y):.4f}  "
            f"ECE {expected_calibration_error(score.p_yes, score.y):.4f}  "
            f"parsed {score.parse_rate:.2f}"
        )
        with self._path.open("a") as log:
            log.write(line + "\n")


def _score_panel(ctx: PipelineContext, panel, round_no: int, config: DemoConfig) -> PanelScore:
    """The round's newest policy forecasts the held-out panel."""
    learner = ctx.agent(LEARNER)
    version = ctx.current_version(learner)
    return score_panel(
        ctx.backend(learner, version),
        learner.generation,
        panel,
        round_no=round_no,
        policy_version=version.version,
        samples=config.panel_samples,
        seed=config.seed,
    )


@contextmanager
def _flow_environment(settings: Settings, server: Any) -> Iterator[None]:
    """The Prefect flows build their settings from the environment: point them at the demo's
    database and world for the duration of the rounds, then put the environment back."""
    values = {
        "FW_DATA_DIR": str(settings.data_dir),
        "FW_DB_URL": settings.database_url,
        "FW_MANIFOLD_BASE_URL": server.manifold_base_url,
    }
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
