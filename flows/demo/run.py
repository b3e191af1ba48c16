"""`futureworld demo`: the whole delayed-reward loop on the simulated world, offline, on CPU.

tiny model from a config → SFT warm start on an over-confident (and noisy) reference
forecaster → R rounds of the daily cycle through the Prefect flows (harvest from the world's
RSS feeds and Manifold-compatible API over loopback → resolve → backfill → replay-and-train on
the groups that resolved, stale or not → predict) while the simulated clock advances a day per
round, and after each cycle the round's policy forecasts a fixed held-out panel → per-round
metrics and a report folder.

The defaults were tuned with benchmarks/learning_curve.py so that a 64-wide, 2-layer model
visibly learns on 2 CPU cores: brief prompts (the title states the cue), dr_grpo at lr 1e-3
with 40 rollouts (5 questions) per optimiser step and the AdamW moments carried from version
to version; a group's rollouts share a training row of up to 2048 tokens, so its prompt is
forwarded once (futureworld.rl.batch). The panel is large (2000 questions, one
sample each) because the claim is judged on realised outcomes: calibration is worth a few
hundredths of Brier, and only a big panel, compared pairwise, tells that from luck.
Everything lives under `--out`; a rerun starts afresh. `out/demo.log` gets one line per
round (elapsed time, policy version, the panel's Brier and ECE), written as the round ends,
so progress is visible in a log whether or not anyone watches a terminal.

A round's panels are scored in a worker process while the next round's cycle runs
(flows.demo.rounds): on 2 cores a round costs about the longer of the two rather than their
sum. At most one panel is in flight; its log line is written when it finishes, one cycle
later.

`kinds` (`--kinds binary,choice,numeric`) has the world also pose choice and numeric questions
(`kind_questions_per_day` of each a day): they are harvested, forecast, resolved and rewarded
like the binary ones, the warm start adds the reference's answers to them, each round's
update trains every question on its own kind's reward (brier, rlcr, crps), answers get
`kind_max_new_tokens` tokens, and each round's policy is also scored on a held-out panel per
kind (flows.demo.kinds). Binary questions are always posed; the default (binary only) demo
runs exactly as it did before kinds existed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.context import build_context, open_engine
from flows.demo.kinds import (
    KindClaim,
    KindPanelScore,
    build_kind_panel,
    kind_answer_text,
    kind_claim,
    kind_report,
    kind_warm_start_examples,
    kind_warm_start_trajectories,
)
from flows.demo.panel import (
    CYCLE_HOUR,
    PANEL_QUESTIONS_PER_DAY,
    PanelScore,
    build_panel,
    warm_start_questions,
    warm_start_trajectories,
)
from flows.demo.report import (
    LearningClaim,
    RoundLog,
    RoundMetrics,
    learning_claim,
    round_metrics,
    write_report,
)
from flows.demo.rounds import RoundScores, panel_scorer, round_policy, score_round
from flows.settings import Settings
from flows.stages.training import TrainOptions
from futureworld.domain import Agent, BackendKind, GenerationSettings, QuestionKind
from futureworld.rewards import RewardFn
from futureworld.rl.config import DEFAULT_ESTIMATOR, Estimator
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent

if TYPE_CHECKING:
    from futureworld.world import WorldConfig

LEARNER = "forecaster"
CROWD = "crowd"
WARM_START_VERSION = 1
"""The learner's supervised warm start: the version after its base model (version 0)."""


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
    rl_kl_coef: float = 0.0
    """k3 KL penalty of every RL update to the supervised warm start (`WARM_START_VERSION`);
    0 = off."""
    rl_groups_per_step: int = 5
    """Whole groups per optimiser step: 5 questions × G = 8 = the 40 rollouts a step tuned
    with benchmarks/learning_curve.py (gradients accumulate over the step's rows)."""
    estimator: Estimator = DEFAULT_ESTIMATOR
    min_groups: int = 4
    """Train in a round only when at least this many completed groups are waiting."""
    temperature: float = 1.0
    hidden_size: int = 64
    layers: int = 2
    kinds: tuple[QuestionKind, ...] = (QuestionKind.BINARY,)
    """Question kinds the world poses: binary always, choice and numeric on request."""
    kind_questions_per_day: int = 10
    """Choice and numeric questions the world poses a day, of each kind in `kinds`."""
    kind_panel_questions: int = 300
    """Held-out panel questions per choice or numeric kind, one sample each."""
    kind_max_new_tokens: int = 64
    """A turn's token budget when choice or numeric questions are posed: their answers are
    longer than a probability."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "estimator", Estimator(self.estimator))
        kinds = tuple(QuestionKind(k) for k in self.kinds)
        object.__setattr__(self, "kinds", kinds)
        if QuestionKind.BINARY not in kinds or len(set(kinds)) != len(kinds):
            raise ValueError(f"kinds must name binary and each kind once, got {list(kinds)}")
        if self.extra_kinds and (self.kind_questions_per_day < 1 or self.kind_panel_questions < 1):
            raise ValueError("kind_questions_per_day and kind_panel_questions must be >= 1")
        if self.rounds < 2:
            raise ValueError(f"the demo needs at least 2 rounds to compare, got {self.rounds}")
        if self.questions_per_day < 1 or self.samples < 2 or self.panel_questions < 1:
            raise ValueError("questions_per_day and panel_questions must be >= 1, samples >= 2")

    @property
    def extra_kinds(self) -> tuple[QuestionKind, ...]:
        """The kinds besides binary, in `kinds` order."""
        return tuple(k for k in self.kinds if k is not QuestionKind.BINARY)

    def world_config(self, **values: object) -> WorldConfig:
        """A world posing this demo's kinds (a binary-only world is unchanged by kinds)."""
        from futureworld.world import WorldConfig

        per_day = self.kind_questions_per_day
        return WorldConfig(
            choice_questions_per_day=per_day if QuestionKind.CHOICE in self.kinds else 0,
            numeric_questions_per_day=per_day if QuestionKind.NUMERIC in self.kinds else 0,
            **values,  # type: ignore[arg-type]
        )

    @property
    def generation(self) -> GenerationSettings:
        """The learner's sampling: one brief turn, a short answer."""
        return GenerationSettings(
            temperature=self.temperature,
            max_turns=1,
            max_new_tokens=self.kind_max_new_tokens if self.extra_kinds else 12,
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
            micro_batch_tokens=2048,
            groups_per_step=4,
        )

    @property
    def update(self) -> TrainOptions:
        """Each round's RL update: a group a packed row, `rl_groups_per_step` groups a step."""
        own_reward = {QuestionKind.CHOICE: RewardFn.RLCR, QuestionKind.NUMERIC: RewardFn.CRPS}
        return TrainOptions(
            estimator=self.estimator,
            learning_rate=self.rl_learning_rate,
            micro_batch_tokens=2048,
            groups_per_step=self.rl_groups_per_step,
            temperature=self.temperature,
            min_groups=self.min_groups,
            kind_rewards=tuple(own_reward[k] for k in self.extra_kinds),
            kl_coef=self.rl_kl_coef,
            kl_reference=WARM_START_VERSION,
        )


@dataclass(frozen=True)
class DemoResult:
    rounds: list[RoundMetrics]
    report: Path
    out_dir: Path
    claim: LearningClaim | None
    kind_scores: dict[QuestionKind, list[KindPanelScore]] = field(default_factory=dict)
    """Each extra kind's panel score per round."""
    kind_claims: dict[QuestionKind, KindClaim | None] = field(default_factory=dict)

    @property
    def learned(self) -> bool:
        return self.claim is not None and self.claim.learned


Progress = Callable[[str, int, int], None]
"""progress(step description, completed, total)."""


def run_demo(config: DemoConfig, progress: Progress | None = None) -> DemoResult:
    from flows.orchestration.pipeline import daily_cycle_flow, resolve_and_backfill_flow
    from flows.stages.training import supervised_finetune
    from futureworld.agent.demonstrations import answer_text
    from futureworld.agent.prompts import SYSTEM_PROMPT, SYSTEM_PROMPTS
    from futureworld.policy.tiny import init_tiny_model
    from futureworld.world import SimClock, World, serve_world

    report = progress or (lambda _step, _done, _total: None)
    total = config.rounds + 3
    out_dir = config.out_dir.resolve()
    state = out_dir / "state"
    if state.exists():
        shutil.rmtree(state)
    state.mkdir(parents=True)
    world = World(
        config.world_config(
            seed=config.seed,
            questions_per_day=config.questions_per_day,
            max_horizon_days=config.max_horizon_days,
        )
    )
    panel_world = World(
        config.world_config(
            seed=config.seed,
            questions_per_day=min(config.panel_questions, PANEL_QUESTIONS_PER_DAY),
            cancel_rate=0.0,
        )
    )
    clock = SimClock(world.day_start(0) + timedelta(hours=CYCLE_HOUR))

    report("tiny model and SFT warm start", 0, total)
    warm_world = World(
        config.world_config(
            seed=config.seed + 10_000, questions_per_day=config.sft_questions_per_day
        )
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
    kind_examples = []
    if config.extra_kinds:
        kind_examples = kind_warm_start_examples(
            warm_world,
            config.sft_days,
            sharpening=config.sft_sharpening,
            noise_logit=config.sft_noise_logit,
        )
        texts += [SYSTEM_PROMPTS[k] for k in config.extra_kinds]
        texts += [f"{e.question.title} {e.question.background}" for e in kind_examples]
        texts += [kind_answer_text(e) for e in kind_examples]
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
    demonstrations = warm_start_trajectories(tokenizer, examples)
    demonstrations += kind_warm_start_trajectories(
        tokenizer, kind_examples, first_index=len(demonstrations)
    )
    warm = supervised_finetune(ctx, LEARNER, demonstrations, config.warm_start)
    assert warm.to_version == WARM_START_VERSION, warm

    panel = build_panel(panel_world, config.panel_questions)
    panels: list[PanelScore] = []
    kind_panels = {
        kind: build_kind_panel(panel_world, kind, config.kind_panel_questions)
        for kind in config.extra_kinds
    }
    kind_scores: dict[QuestionKind, list[KindPanelScore]] = {k: [] for k in kind_panels}
    round_log = RoundLog(out_dir / "demo.log")

    def record(scores: RoundScores) -> None:
        panels.append(scores[0])
        for kind, score in scores[1].items():
            kind_scores[kind].append(score)
        round_log.write(scores[0], list(scores[1].values()))

    with (
        serve_world(world, clock) as server,
        _flow_environment(settings, server),
        panel_scorer() as scorer,
    ):
        scoring: Future | None = None
        for r in range(config.rounds):
            report(f"round {r}: daily cycle on {clock.now().date()}", 1 + r, total)
            daily_cycle_flow(
                as_of=clock.now().isoformat(),
                sources=["manifold"],
                feeds=[server.feed_urls["all"]],
                samples=config.samples,
                train=config.update,
            )
            # The round's policy is scored while the next cycle runs (one panel in flight:
            # each round waits for the previous round's scores).
            policy = round_policy(ctx, LEARNER)
            if scoring is not None:
                record(scoring.result())
            scoring = scorer.submit(score_round, policy, panel, kind_panels, r, config)
            clock.advance(days=1)
        if scoring is not None:
            record(scoring.result())
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
    kind_claims = {kind: kind_claim(scores) for kind, scores in kind_scores.items()}
    extra_markdown, extra_json = kind_report(kind_scores, kind_claims, out_dir)
    path = write_report(
        out_dir,
        metrics,
        panels,
        claim,
        header=header,
        extra_markdown=extra_markdown,
        extra_json=extra_json,
    )
    engine.dispose()
    report("done", total, total)
    return DemoResult(
        rounds=metrics,
        report=path,
        out_dir=out_dir,
        claim=claim,
        kind_scores=kind_scores,
        kind_claims=kind_claims,
    )


@contextmanager
def _flow_environment(settings: Settings, server: Any) -> Iterator[None]:
    """The Prefect flows build their settings from the environment: point them at the demo's
    database and world for the duration of the rounds, then put the environment back."""
    values = {
        "FW_DATA_DIR": str(settings.data_dir),
        "FW_DB_URL": settings.database_url,
        "FW_MANIFOLD_BASE_URL": server.manifold_base_url,
        "FW_HTTP_RATE_PER_S": "0",  # the world is on loopback: no politeness delay
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
