"""The promotion gate on real databases with real tiny models: a version whose answers never
parse, or that states certainty about everything, is rejected and the agent goes on serving
its parent; a rejected version never samples a rollout; the validation slice never enters a
replay batch; before any outcome it judges health on the open questions, and with none posed
it promotes and says why.

The models are tiny Qwen2 networks whose weights are set by hand (`answering_model`): their
layers add nothing, so each next token depends on the current one only, wired so that any
prompt is answered `<probability>{answer}</probability>`. The broken one is the random tiny
model with its LM head scaled by 100: sampling is then deterministic and never an answer."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine, func, select

from flows.context import PipelineContext
from flows.settings import Settings
from flows.stages.backfilling import backfill_rewards
from flows.stages.predicting import predict
from flows.stages.promotion import (
    NO_VALIDATION_DATA,
    gate_candidates,
    gate_version,
    reject_version,
    validation_question_ids,
)
from flows.stages.train_options import TrainOptions
from flows.stages.training import gate_options, replay_and_train
from futureworld.domain import Agent, PolicyVersion, Question, VersionStatus
from futureworld.policy.tiny import init_tiny_model
from futureworld.rl.config import TrainConfig
from futureworld.validation import DEFAULT_VALIDATION_FRACTION, GateOptions, is_held_out
from storage.engine import make_engine, session_scope
from storage.repositories.agents import (
    ensure_agent,
    get_agent,
    get_policy_version,
    register_policy_version,
    validation_forecasts,
)
from storage.repositories.questions import upsert_questions
from storage.repositories.training import held_out_question_ids, select_replay_batch
from storage.tables import ReplayConsumptionRow, RolloutRow
from tests.flows.conftest import (
    CUTOFF,
    GENERATION,
    RESOLVED_AT,
    make_context,
    resolve_every_question,
)

HELD_OUT = [f"v{i}" for i in range(400) if is_held_out("test", f"v{i}")][:12]
TRAINING = [f"v{i}" for i in range(400) if not is_held_out("test", f"v{i}")][:3]
GATE = GateOptions(samples=2, min_rollouts=48)
"""At least 48 rollouts a version over the 12 held-out questions: 4 each (samples_for)."""


def answering_model(base: Path, out: Path, answer: str) -> Path:
    """The tiny model `base` rewired to answer every prompt with `answer`: attention and MLP
    outputs are zeroed (the residual stream is the token's embedding), each chain token of
    `<probability>{answer}</probability>` has an embedding axis of its own whose LM-head row
    is its successor's, and every other token shares axis 0, whose successor is the opening
    tag. Logit gaps of 80 make sampling at temperature 1 deterministic."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    config = AutoModelForCausalLM.from_pretrained(base, local_files_only=True).config
    config.tie_word_embeddings = False
    model = Qwen2ForCausalLM(config)
    chain = tokenizer.encode(f"<probability>{answer}</probability>", add_special_tokens=False)
    assert len(set(chain)) == len(chain) < config.hidden_size
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed = torch.zeros(config.vocab_size, config.hidden_size)
        embed[:, 0] = 1.0
        head = torch.zeros(config.vocab_size, config.hidden_size)
        head[chain[0], 0] = 10.0
        for k, token in enumerate(chain):
            embed[token] = 0.0
            embed[token, k + 1] = 1.0
            successor = chain[k + 1] if k + 1 < len(chain) else tokenizer.eos_token_id
            head[successor, k + 1] = 10.0
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight = torch.nn.Parameter(head)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def greedy_gibberish_model(base: Path, out: Path) -> Path:
    """The random tiny model with its LM head scaled by 100: deterministic, never answering."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    with torch.no_grad():
        model.lm_head.weight.mul_(100.0)
    model.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(base, local_files_only=True).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gate-models")
    base = init_tiny_model(root / "random", seed=2)
    return {
        "hedging": answering_model(base, root / "hedging", "0.5"),
        "certain": answering_model(base, root / "certain", "1"),
        "leaning": answering_model(base, root / "leaning", "0.9"),
        "gibberish": greedy_gibberish_model(base, root / "gibberish"),
    }


def _questions(engine: Engine, external_ids: list[str], *, at=CUTOFF) -> None:
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id=e,
                    title=f"Will event {e} happen?",
                    created_at=at,
                    info_cutoff_at=at,
                    close_at=at + timedelta(days=2),
                )
                for e in external_ids
            ],
        )


def _agent_with_forecasts(engine: Engine, tmp_path: Path, base: Path) -> PipelineContext:
    """Agent "tiny" (v0 answers 0.5) has forecast every question (12 held out, 3 not) before
    they resolved; the returned context is as of their resolution."""
    with session_scope(engine) as session:
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(base), backend="local", generation=GENERATION),
        )
    _questions(engine, HELD_OUT + TRAINING)
    report = predict(make_context(engine, tmp_path), "tiny", samples=2)
    assert report.questions == 15
    resolve_every_question(engine)
    return make_context(engine, tmp_path, as_of=RESOLVED_AT)


def _register(
    ctx: PipelineContext, checkpoint: Path, *, parent: int = 0, training_run_id: int | None = None
) -> int:
    with session_scope(ctx.engine) as session:
        agent = get_agent(session, "tiny")
        newest = ctx.newest_version(agent).version
        return register_policy_version(
            session,
            PolicyVersion(
                agent_id=agent.id,
                version=newest + 1,
                parent_version=parent,
                checkpoint_path=str(checkpoint),
                status=VersionStatus.CANDIDATE,
                training_run_id=training_run_id,
            ),
        ).version


def _served(ctx: PipelineContext) -> int:
    return ctx.current_version(ctx.agent("tiny")).version


def test_the_gate_rejects_a_broken_version_and_the_agent_serves_its_parent(
    engine: Engine, tmp_path: Path, models: dict[str, Path]
) -> None:
    ctx = _agent_with_forecasts(engine, tmp_path, models["hedging"])
    broken = _register(ctx, models["gibberish"])
    assert _served(ctx) == 0  # a candidate does not serve

    report = gate_version(ctx, "tiny", broken, GATE)
    assert report.status is VersionStatus.REJECTED
    assert report.questions == len(HELD_OUT)
    assert "parse rate 0.00 is more than 0.02 below parent v0's 1.00" in report.reason
    assert report.parse_drop_ci == (1.0, 1.0)  # never parsed vs always: certain at any n
    assert f"lower end of the drop +1.00 > 0 on {len(HELD_OUT)} questions" in report.reason
    assert report.forecast == {"candidate": len(HELD_OUT), "parent": 0}  # v0's rollouts reused
    assert _served(ctx) == 0
    assert ctx.newest_version(ctx.agent("tiny")).version == broken
    with session_scope(engine) as session:
        agent_id = get_agent(session, "tiny").id
        kept = validation_forecasts(session, agent_id, broken)
        assert len(kept) == len(HELD_OUT) and all(s == (None,) * 4 for s in kept.values())
        # gate forecasts are not rollouts: nothing of v1 is stored where replay reads
        v1_rollouts = select(func.count()).where(RolloutRow.policy_version == broken)
        assert session.scalar(v1_rollouts) == 0

    again = gate_version(ctx, "tiny", broken, GATE)  # a re-run reuses what it kept
    assert again.status is VersionStatus.REJECTED and again.forecast == {
        "candidate": 0,
        "parent": 0,
    }

    collapsed = _register(ctx, models["certain"])
    [verdict] = gate_candidates(ctx, "tiny", GATE)  # the one candidate left
    assert verdict.version == collapsed and verdict.status is VersionStatus.REJECTED
    assert "collapsed: 100% of answers within 0.02 of 0 or 1" in verdict.reason
    assert verdict.candidate is not None and verdict.candidate.brier == 0.5
    assert _served(ctx) == 0

    healthy = _register(ctx, models["hedging"])
    passed = gate_version(ctx, "tiny", healthy, GATE)
    assert passed.status is VersionStatus.PROMOTED and passed.reason.startswith("passed")
    assert _served(ctx) == healthy
    served = ctx.current_version(ctx.agent("tiny"))
    assert (served.validation_questions, served.validation_brier) == (len(HELD_OUT), 0.25)
    assert served.validation_parse_rate == 1.0

    reject_version(ctx, "tiny", healthy, "a person saw it misbehave")
    assert _served(ctx) == 0


def test_a_rejected_version_never_samples_a_rollout(
    engine: Engine, tmp_path: Path, models: dict[str, Path]
) -> None:
    ctx = _agent_with_forecasts(engine, tmp_path, models["hedging"])
    broken = _register(ctx, models["gibberish"])
    assert gate_version(ctx, "tiny", broken, GATE).status is VersionStatus.REJECTED
    candidate = _register(ctx, models["certain"])  # not gated yet: no rollout either

    later = RESOLVED_AT + timedelta(days=1)
    _questions(engine, ["new-a", "new-b"], at=later)
    report = predict(make_context(engine, tmp_path, as_of=later), "tiny", samples=2)
    assert (report.policy_version, report.questions, report.rollouts) == (0, 2, 4)
    with session_scope(engine) as session:
        versions = set(session.scalars(select(RolloutRow.policy_version)))
    assert versions == {0} and broken not in versions and candidate not in versions


def _hedging_agent(engine: Engine, models: dict[str, Path]) -> None:
    """Agent "tiny" on the model that answers 0.5, with nothing forecast yet."""
    with session_scope(engine) as session:
        ensure_agent(
            session,
            Agent(
                name="tiny",
                base_model=str(models["hedging"]),
                backend="local",
                generation=GENERATION,
            ),
        )


def test_with_no_validation_question_posed_the_gate_promotes_and_says_so(
    engine: Engine, tmp_path: Path, models: dict[str, Path]
) -> None:
    _hedging_agent(engine, models)
    ctx = make_context(engine, tmp_path)  # nothing posed: nothing to judge
    version = _register(ctx, models["gibberish"])
    report = gate_version(ctx, "tiny", version, GATE)
    assert report.status is VersionStatus.PROMOTED
    assert report.reason.startswith(NO_VALIDATION_DATA)
    assert _served(ctx) == version


def test_before_any_outcome_the_gate_judges_health_on_the_open_questions(
    engine: Engine, tmp_path: Path, models: dict[str, Path]
) -> None:
    """Questions posed but not resolved, held out or not: no Brier yet, but a version that
    cannot answer is rejected by the parse rule, and one that answers passes."""
    _hedging_agent(engine, models)
    _questions(engine, HELD_OUT[:3] + TRAINING)
    ctx = make_context(engine, tmp_path)
    broken = _register(ctx, models["gibberish"])
    report = gate_version(ctx, "tiny", broken, GATE)
    assert report.status is VersionStatus.REJECTED, report.reason
    assert (report.questions, report.health_questions) == (0, 6)
    assert "no resolved question" in report.reason and "parse rate 0.00" in report.reason
    assert _served(ctx) == 0

    healthy = _register(ctx, models["hedging"])
    passed = gate_version(ctx, "tiny", healthy, GATE)
    assert passed.status is VersionStatus.PROMOTED, passed.reason
    assert passed.candidate is not None and passed.candidate.brier is None
    assert _served(ctx) == healthy

    closed = GateOptions(samples=2, min_rollouts=48, max_unresolved=0)
    again = _register(ctx, models["gibberish"], parent=healthy)
    assert gate_version(ctx, "tiny", again, closed).reason.startswith(NO_VALIDATION_DATA)


def test_the_gate_is_sized_by_the_settings_every_update_and_the_cli_read(
    engine: Engine, tmp_path: Path, models: dict[str, Path], monkeypatch
) -> None:
    """FW_GATE_MAX_UNRESOLVED and its siblings size the gate the training stage runs
    (`gate_options`) and `futureworld gate` runs (`Settings.gate`): 6 open questions, at most
    2 judged."""
    monkeypatch.setenv("FW_GATE_MAX_QUESTIONS", "7")
    monkeypatch.setenv("FW_GATE_MAX_UNRESOLVED", "2")
    monkeypatch.setenv("FW_GATE_MAX_TRAINED", "0")
    settings = Settings(data_dir=tmp_path)
    assert (settings.gate().max_questions, settings.gate().max_trained) == (7, 0)
    assert settings.gate(0.25).validation_fraction == 0.25
    assert Settings(data_dir=tmp_path, gate_max_unresolved=0).gate().max_unresolved == 0
    with pytest.raises(ValueError, match="gate_max_questions"):
        Settings(data_dir=tmp_path, gate_max_questions=0)

    _hedging_agent(engine, models)
    _questions(engine, HELD_OUT[:3] + TRAINING)
    ctx = make_context(engine, tmp_path, validation_fraction=0.1, gate_max_unresolved=2)
    options = gate_options(ctx)
    assert options is not None and options.max_unresolved == 2
    report = gate_version(ctx, "tiny", _register(ctx, models["hedging"]), options)
    assert (report.questions, report.health_questions) == (0, 2)
    assert gate_options(make_context(engine, tmp_path, validation_fraction=0.0)) is None


def test_the_validation_set_never_enters_a_replay_batch(
    db_url: str, tmp_path: Path, scored_tiny_agent
) -> None:
    scored_tiny_agent(db_url, tmp_path)  # three scored groups, of questions q0, q1, q2
    engine = make_engine(db_url)
    try:
        ctx = make_context(engine, tmp_path, as_of=RESOLVED_AT)
        fraction = 0.5  # holds out q1 and q2 of source "test", not q0
        held = validation_question_ids(ctx, fraction)
        with session_scope(engine) as session:
            agent_id = get_agent(session, "tiny").id
            assert held == held_out_question_ids(
                session, lambda source, external_id: is_held_out(source, external_id, fraction)
            )
            everything = select_replay_batch(
                session, agent_id, reward_fn="brier", current_version=0, as_of=RESOLVED_AT
            )
            batch = select_replay_batch(
                session,
                agent_id,
                reward_fn="brier",
                current_version=0,
                as_of=RESOLVED_AT,
                exclude_question_ids=held,
            )
        assert len(held) == 2 and len(everything.groups) == 3
        assert len(batch.groups) == 1 and batch.remaining_groups == 0
        replayed = {r.trajectory.question_id for group in batch.groups for r in group}
        assert replayed.isdisjoint(held)
    finally:
        engine.dispose()


def test_every_update_is_gated_before_it_serves_and_the_next_starts_from_the_served_one(
    engine: Engine, tmp_path: Path, models: dict[str, Path]
) -> None:
    """The path that runs: replay_and_train leaves the validation slice out of its batch,
    registers a candidate, gates it, and starts the next update from the served version, on
    the data a rejected version trained on too; a candidate an earlier run left ungated is
    judged before the next update trains."""
    _agent_with_forecasts(engine, tmp_path, models["hedging"])
    backfill_rewards(make_context(engine, tmp_path, as_of=RESOLVED_AT))
    ctx = make_context(
        engine, tmp_path, as_of=RESOLVED_AT, validation_fraction=DEFAULT_VALIDATION_FRACTION
    )
    options = TrainOptions(config=TrainConfig(learning_rate=1e-6))

    first = replay_and_train(ctx, "tiny", options)
    assert first is not None and first.groups == len(TRAINING)  # the held-out 12 are left out
    assert first.gate is not None and first.gate.questions == len(HELD_OUT)
    assert first.status is VersionStatus.PROMOTED and _served(ctx) == first.to_version == 1
    with session_scope(engine) as session:
        trained = set(
            session.scalars(
                select(RolloutRow.question_id).join(
                    ReplayConsumptionRow, ReplayConsumptionRow.rollout_id == RolloutRow.id
                )
            )
        )
    assert trained and trained.isdisjoint(validation_question_ids(ctx, 0.1))

    assert replay_and_train(ctx, "tiny", options) is None  # v1 trained on all there was
    # A rejected version's data never reached a served version: the next update, from the
    # served parent, trains on it again (the rejected run's records stay).
    reject_version(ctx, "tiny", 1, "a person saw it misbehave")
    again = replay_and_train(ctx, "tiny", options)
    assert again is not None and (again.from_version, again.to_version) == (0, 2)
    assert again.groups == first.groups and _served(ctx) == 2
    with session_scope(engine) as session:
        runs = set(session.scalars(select(ReplayConsumptionRow.training_run_id)))
    assert len(runs) == 2

    broken = _register(ctx, models["gibberish"], parent=2)  # a run that died before its gate
    third = replay_and_train(ctx, "tiny", TrainOptions(**{**dict(options), "reuse": True}))
    with session_scope(engine) as session:
        agent_id = get_agent(session, "tiny").id
        left = get_policy_version(session, agent_id, broken)
    assert left.status is VersionStatus.REJECTED and "parse rate" in left.status_reason
    assert third is not None and (third.from_version, third.to_version) == (2, broken + 1)


FITTED = [f"v{i}" for i in range(400) if not is_held_out("test", f"v{i}")][:12]
"""Twelve questions outside the validation slice: what an update trains on."""


def test_the_fit_rule_rejects_a_version_worse_on_its_runs_questions_before_held_out_outcomes(
    engine: Engine, tmp_path: Path, models: dict[str, Path]
) -> None:
    """The path that runs: replay_and_train's gate scores the candidate, paired with its
    parent, on the resolved questions its own training run consumed (the fit rule) while no
    held-out question has resolved; a version of that run that answers them backwards (0.9
    on questions that resolved NO, healthy otherwise) is rejected for it."""
    _hedging_agent(engine, models)
    _questions(engine, FITTED + HELD_OUT[:3])
    predict(make_context(engine, tmp_path), "tiny", samples=2)
    resolve_every_question(engine, external_ids=FITTED, value=0.0)
    backfill_rewards(make_context(engine, tmp_path, as_of=RESOLVED_AT))
    ctx = make_context(
        engine, tmp_path, as_of=RESOLVED_AT, validation_fraction=DEFAULT_VALIDATION_FRACTION
    )
    first = replay_and_train(ctx, "tiny", TrainOptions(config=TrainConfig(learning_rate=1e-6)))
    assert first is not None and first.groups == len(FITTED)
    gate = first.gate
    assert gate is not None and first.status is VersionStatus.PROMOTED, gate
    assert (gate.questions, gate.health_questions, gate.fit_questions) == (0, 3, len(FITTED))
    assert gate.fit_ci == (0.0, 0.0)  # it still answers 0.5, as its parent did
    assert "no resolved question" in gate.reason and "on 12 trained questions" in gate.reason

    backwards = _register(
        ctx, models["leaning"], parent=first.to_version, training_run_id=first.training_run_id
    )
    report = gate_version(ctx, "tiny", backwards, GATE)
    assert report.status is VersionStatus.REJECTED, report.reason
    assert "worse than parent v1 on the 12 questions it was trained on" in report.reason
    assert report.fit_ci == pytest.approx((0.81 - 0.25, 0.81 - 0.25))
    assert report.forecast == {"candidate": 3 + len(FITTED), "parent": 0}  # v1's gate kept both
    assert _served(ctx) == first.to_version
