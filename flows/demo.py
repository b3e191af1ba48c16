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
Everything lives under `--out`; a rerun starts afresh.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from flows.demo_report import (
    LearningClaim,
    PanelScore,
    RoundMetrics,
    learning_claim,
    round_metrics,
    write_report,
)
from flows.settings import Settings

LEARNER = "forecaster"
CROWD = "crowd"
PANEL_DAY = 10_000
"""The first world day the evaluation panel is drawn from: far from any day the demo reaches."""
PANEL_QUESTIONS_PER_DAY = 250
"""The panel world poses this many questions a day; a larger panel spans several days."""
CYCLE_HOUR = 12
"""The daily cycle runs at noon (simulated UTC), after the day's questions are posed."""


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
    rl_rollouts_per_step: int = 40
    """Rollouts per optimiser step (gradient accumulation over one-rollout rows)."""
    estimator: str = "dr_grpo"
    min_groups: int = 4
    """Train in a round only when at least this many completed groups are waiting."""
    temperature: float = 1.0
    hidden_size: int = 64
    layers: int = 2

    def __post_init__(self) -> None:
        if self.rounds < 2:
            raise ValueError(f"the demo needs at least 2 rounds to compare, got {self.rounds}")
        if self.questions_per_day < 1 or self.samples < 2 or self.panel_questions < 1:
            raise ValueError("questions_per_day and panel_questions must be >= 1, samples >= 2")


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
    from flows.pipeline import daily_cycle_flow, resolve_and_backfill_flow
    from futureworld.agent.demonstrations import answer_text
    from futureworld.agent.prompts import SYSTEM_PROMPT
    from futureworld.domain import Agent
    from futureworld.policy.tiny import init_tiny_model
    from futureworld.world import SimClock, World, WorldConfig, serve_world, sft_examples
    from storage.engine import make_engine, session_scope, upgrade_database
    from storage.repositories.agents import ensure_agent

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
    examples = [
        replace(e, question=_as_harvested(warm_world, e.question.external_id))
        for e in sft_examples(
            warm_world,
            config.sft_days,
            sharpening=config.sft_sharpening,
            noise_logit=config.sft_noise_logit,
        )
    ]
    # The tokenizer also learns the prompt and the answer strings themselves.
    texts = [SYSTEM_PROMPT, *(f"{e.question.title} {e.question.background}" for e in examples)]
    texts += [answer_text(k / 100) for k in range(101)]
    model_dir = init_tiny_model(
        state / "base-model",
        seed=config.seed,
        hidden_size=config.hidden_size,
        num_layers=config.layers,
        extra_texts=texts,
    )
    settings = Settings(data_dir=state, db_url=f"sqlite:///{state / 'futureworld.db'}")
    engine = make_engine(settings.database_url)
    upgrade_database(engine)
    generation = {
        "temperature": config.temperature,
        "max_turns": 1,
        "max_new_tokens": 12,
        "max_total_tokens": 1024,
        "brief_prompt": True,
        "seed": config.seed,
    }
    with session_scope(engine) as session:
        ensure_agent(
            session,
            Agent(name=LEARNER, base_model=str(model_dir), backend="local", generation=generation),
        )
        ensure_agent(session, Agent(name=CROWD, base_model="crowd", backend="baseline"))
    _warm_start(engine, settings, model_dir, examples, config)

    panel = _panel(panel_world, config.panel_questions)
    panels: list[PanelScore] = []
    overrides = {
        "learning_rate": config.rl_learning_rate,
        "micro_batch_tokens": 1,
        "grad_accum_steps": config.rl_rollouts_per_step,
        "temperature": config.temperature,
    }
    with serve_world(world, clock) as server, _flow_environment(settings, server):
        for r in range(config.rounds):
            report(f"round {r}: daily cycle on {clock.now().date()}", 1 + r, total)
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
            panels.append(_score_panel(engine, settings, panel, r, config))
            clock.advance(days=1)
        report("final resolution and the report", 1 + config.rounds, total)
        clock.advance(days=config.max_horizon_days + 1)
        resolve_and_backfill_flow(as_of=clock.now().isoformat(), db_url=settings.database_url)

    start_day = world.day_start(0).date()

    def round_of(at: datetime) -> int:
        return (at.date() - start_day).days

    metrics = round_metrics(engine, LEARNER, panels, round_of=round_of)
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


def _warm_start(engine, settings, model_dir, examples, config) -> None:
    from transformers import AutoTokenizer

    from flows.stages.training import supervised_finetune
    from futureworld.agent.demonstrations import (
        Demonstration,
        answer_text,
        demonstration_trajectory,
    )

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    trajectories = [
        demonstration_trajectory(
            tokenizer,
            Demonstration(question=e.question, completion=answer_text(e.target_p_yes)),
            agent_id=0,
            policy_version=0,
            sample_index=i,
            brief=True,
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
            "micro_batch_tokens": 1,
            "grad_accum_steps": 4,
        },
    )


def _as_harvested(world, external_id: str):
    """The question exactly as the demo's harvest sees it: the world's Manifold market parsed
    by the Manifold adapter at the cycle's hour of its day (same prompt, same as-of)."""
    from futureworld.sources.manifold import market_to_question
    from futureworld.world.payloads import lite_market

    sim = world.question(external_id)
    at = world.day_start(sim.day) + timedelta(hours=CYCLE_HOUR)
    return market_to_question(lite_market(sim, None, now=at, base_url="http://world"), now=at)


def _panel(world, n: int) -> list[tuple]:
    """(question with a placeholder id, outcome, true p) of the held-out panel: the first `n`
    questions posed from PANEL_DAY on."""
    out: list[tuple] = []
    day = PANEL_DAY
    while len(out) < n:
        far = world.day_start(day + 30)
        for sim in world.questions_posed_on(day)[: n - len(out)]:
            resolution = world.resolution_as_of(sim.external_id, far)
            question = replace(_as_harvested(world, sim.external_id), id=-(len(out) + 1))
            out.append((question, resolution.value, sim.p_yes))
        day += 1
    return out


PANEL_BATCH = 250
"""Panel prompts sampled together in one batched generate call."""


def _score_panel(engine, settings, panel, round_no, config) -> PanelScore:
    """The round's newest policy forecasts the panel (in memory: never stored, never trained).

    The panel is answered in one turn, as the demo's agent answers (max_turns 1, brief
    prompt), but across questions in batches of PANEL_BATCH prompts rather than one agent
    loop per question: the same prompts, sampler and answer parsing, many times faster.
    """
    from flows.runtime import backend_spec, generation_settings
    from futureworld.agent.parsing import (
        ACTION_STOP_STRINGS,
        ActionKind,
        parse_action,
        parse_number,
    )
    from futureworld.agent.prompts import encode_prompt
    from futureworld.domain import ParseStatus
    from futureworld.policy.loading import load_backend
    from storage.engine import session_scope
    from storage.repositories.agents import get_agent, latest_policy_version

    with session_scope(engine) as session:
        agent = get_agent(session, LEARNER)
        version = latest_policy_version(session, agent.id)
    backend = load_backend(backend_spec(settings, agent, version))
    loop_config, sampling = generation_settings(agent.generation)
    if loop_config.max_turns != 1:
        raise ValueError(f"the demo panel is answered in one turn, not {loop_config.max_turns}")
    tokenizer = backend.tokenizer
    asked = [
        (n, question, outcome, p_true)
        for n, (question, outcome, p_true) in enumerate(panel)
        for _ in range(config.panel_samples)
    ]
    p, y, truth, index, unparsed = [], [], [], [], 0
    for start in range(0, len(asked), PANEL_BATCH):
        chunk = asked[start : start + PANEL_BATCH]
        prompts = [
            encode_prompt(tokenizer, q, as_of=q.info_cutoff_at, brief=loop_config.brief_prompt)
            for _, q, _, _ in chunk
        ]
        params = replace(
            sampling,
            max_new_tokens=loop_config.max_new_tokens,
            stop=ACTION_STOP_STRINGS,
            seed=config.seed * 7919 + start,
        )
        for (n, _, outcome, p_true), generation in zip(
            chunk, backend.generate(prompts, params), strict=True
        ):
            text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
            action = parse_action(text)
            p_yes, status = parse_number(action.argument)
            if action.kind is not ActionKind.ANSWER or status is not ParseStatus.OK:
                unparsed += 1
                continue
            p.append(p_yes)
            y.append(outcome)
            truth.append(p_true)
            index.append(n)
    return PanelScore(
        round=round_no,
        policy_version=version.version,
        p_yes=tuple(p),
        y=tuple(y),
        p_true=tuple(truth),
        question=tuple(index),
        unparsed=unparsed,
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
