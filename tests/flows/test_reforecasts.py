"""Forecast time and re-forecasts: a live forecast is made as of the run (its prompt and its
search say so, never past the question's close); a question open across several policy
versions is forecast once per agent unless `reforecast_every_days` asks for more, and then
each new group is made as of its own predict."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from transformers import AutoTokenizer

from flows.forecasters import LoopForecaster
from flows.stages.predicting import predict
from futureworld.domain import Agent, GenerationSettings, PolicyVersion, Question, Trajectory
from futureworld.policy.tiny import init_tiny_model
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent, register_policy_version
from storage.repositories.questions import list_questions, upsert_questions
from storage.repositories.rollouts import trajectory_from_row
from storage.tables import PolicyVersionRow, RolloutRow
from tests.flows.conftest import make_context

POSED = datetime(2026, 5, 1, 6, tzinfo=UTC)
GENERATION = GenerationSettings(
    temperature=1.0, max_turns=1, max_new_tokens=8, max_total_tokens=512
)
SAMPLES = 2


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3)


def _setup(engine, model: Path, *, close_days: float = 10) -> int:
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id="long-open",
                    title="Will the long-open event happen?",
                    created_at=POSED,
                    info_cutoff_at=POSED,
                    close_at=POSED + timedelta(days=close_days),
                )
            ],
        )
        agent = ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )
    assert agent.id is not None
    return agent.id


def _new_version(engine, agent_id: int, model: Path) -> None:
    """The next policy version (the same weights: what predict decides does not read them)."""
    with session_scope(engine) as session:
        newest = max(
            session.scalars(
                select(PolicyVersionRow.version).where(PolicyVersionRow.agent_id == agent_id)
            )
        )
        register_policy_version(
            session,
            PolicyVersion(
                agent_id=agent_id,
                version=newest + 1,
                parent_version=newest,
                checkpoint_path=str(model),
            ),
        )


def _groups(engine) -> dict[int, list[tuple[datetime, list[int]]]]:
    """policy version → its rollouts' (as_of, prompt token ids)."""
    with session_scope(engine) as session:
        rows = session.scalars(select(RolloutRow).order_by(RolloutRow.id)).all()
        found: dict[int, list[tuple[datetime, list[int]]]] = {}
        for row in rows:
            t = trajectory_from_row(row)
            assert t.as_of is not None
            found.setdefault(t.policy_version, []).append((t.as_of, list(t.prompt_token_ids)))
    return found


def _cycles(engine, tmp_path: Path, model: Path, agent_id: int, days: int, **settings) -> None:
    """One predict a day at POSED + d days, a new policy version after each."""
    for day in range(days):
        ctx = make_context(engine, tmp_path, as_of=POSED + timedelta(days=day), **settings)
        predict(ctx, "tiny", samples=SAMPLES)
        _new_version(engine, agent_id, model)


def test_a_question_open_across_three_versions_is_forecast_once_by_default(
    engine, tmp_path, tiny_model
):
    agent_id = _setup(engine, tiny_model)
    _cycles(engine, tmp_path, tiny_model, agent_id, days=3)
    groups = _groups(engine)
    assert list(groups) == [0]
    assert len(groups[0]) == SAMPLES


def test_reforecasts_every_two_days_make_a_group_per_due_version_each_as_of_its_own_time(
    engine, tmp_path, tiny_model
):
    agent_id = _setup(engine, tiny_model)
    # Days 0..4, versions 0..4: due on day 0 (new), day 2 and day 4 (two days after the last).
    _cycles(engine, tmp_path, tiny_model, agent_id, days=5, reforecast_every_days=2)
    groups = _groups(engine)
    assert sorted(groups) == [0, 2, 4]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for version, rollouts in groups.items():
        made_at = POSED + timedelta(days=version)
        assert len(rollouts) == SAMPLES
        for as_of, prompt in rollouts:
            assert as_of == made_at
            # The prompt states the instant its search sees the corpus as of.
            assert f"As of: {made_at:%Y-%m-%d %H:%M} UTC" in tokenizer.decode(prompt)


def test_a_forecast_never_searches_past_the_question_close(engine, tmp_path, tiny_model):
    _setup(engine, tiny_model, close_days=1.5)
    closes = POSED + timedelta(days=1.5)
    # A forecaster running after the close (a late worker): its search stops at the close.
    ctx = make_context(engine, tmp_path, as_of=POSED + timedelta(days=3))
    agent = ctx.agent("tiny")
    forecaster = LoopForecaster(ctx, agent, ctx.current_version(agent))
    with session_scope(engine) as session:
        (question,) = list_questions(session)
    groups: list[list[Trajectory]] = []
    forecaster.run(
        [(question, (0, 1))],
        lambda _q, group: groups.append(group),
        lambda _q, kind, detail: pytest.fail(f"{kind}: {detail}"),
        lambda *_: None,
    )
    (group,) = groups
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    for trajectory in group:
        assert trajectory.as_of == POSED + timedelta(days=3)
        text = tokenizer.decode(list(trajectory.prompt_token_ids))
        assert f"As of: {closes:%Y-%m-%d %H:%M} UTC" in text
