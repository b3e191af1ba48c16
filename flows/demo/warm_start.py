"""The demo's warm start: the tiny model (its tokenizer trained on the demo's texts), the
learner and the crowd registered, and the supervised fine-tune on the reference's
demonstrations (the research reference's rollouts with research on; flows.demo.researcher)."""

from __future__ import annotations

from datetime import datetime

from flows.context import build_context, open_engine
from flows.demo import researcher
from flows.demo.config import CROWD, LEARNER, WARM_START_VERSION, DemoConfig
from flows.demo.kinds import (
    kind_answer_text,
    kind_warm_start_examples,
    kind_warm_start_trajectories,
)
from flows.demo.panel import warm_start_questions, warm_start_trajectories
from flows.settings import Settings
from futureworld.domain import Agent, BackendKind, Trajectory
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent


def warm_start(config: DemoConfig, settings: Settings, *, as_of: datetime) -> list[Trajectory]:
    """The tiny model (its tokenizer trained on the demo's texts), the learner and the crowd
    registered, and the supervised warm start trained (version `WARM_START_VERSION`); returns
    the demonstrations it trained on."""
    from flows.stages.training import supervised_finetune
    from futureworld.agent.demonstrations import answer_text
    from futureworld.agent.prompts import SYSTEM_PROMPT, SYSTEM_PROMPTS
    from futureworld.policy.tiny import init_tiny_model
    from futureworld.world import World

    warm_world = World(
        config.world_config(
            seed=config.seed + 10_000, questions_per_day=config.sft_questions_per_day
        )
    )
    research_questions = []
    if config.research:
        examples = []
        research_questions = researcher.warm_start_questions(
            warm_world, config.research_sft_days + config.research_drill_days
        )
        texts = researcher.tokenizer_texts(
            warm_world,
            [q for q in research_questions if q[0].day < config.research_sft_days],
            config.generation,
            config.researcher,
            seed=config.seed,
        )
    else:
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
    if config.extra_kinds and config.research:
        # The research reference's rollouts of the warm world's choice and numeric questions
        # are among research_questions (researcher.warm_start_questions); their texts too.
        texts += [SYSTEM_PROMPTS[k] for k in config.extra_kinds]
    elif config.extra_kinds:
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
        settings.data_dir / "base-model",
        seed=config.seed,
        hidden_size=config.hidden_size,
        num_layers=config.layers,
        extra_texts=texts,
    )
    engine = open_engine(settings)
    ctx = build_context(settings, engine, as_of=as_of)
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
    if config.research:
        demonstrations = researcher.research_demonstrations(
            tokenizer,
            warm_world,
            research_questions,
            config.generation,
            config.researcher,
            seed=config.seed,
            agent_id=learner.id or 0,
            drills_from_day=config.research_sft_days,
        )
    demonstrations += kind_warm_start_trajectories(
        tokenizer, kind_examples, first_index=len(demonstrations)
    )
    warm = supervised_finetune(ctx, LEARNER, demonstrations, config.warm_start)
    assert warm.to_version == WARM_START_VERSION, warm
    engine.dispose()
    return demonstrations
