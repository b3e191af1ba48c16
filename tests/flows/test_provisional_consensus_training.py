"""`train --estimator provisional_consensus` (and `siop`, which learns before outcomes the same
way) on real rollouts of a tiny model: unresolved groups train on their provisional rewards and
are recorded in the ledger as provisional; when the outcome arrives the provisional rewards are
voided and the real ones replayed; dr_grpo never sees the provisional rewards."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from flows.stages.backfilling import backfill_rewards
from flows.stages.predicting import predict
from flows.stages.provisional import write_provisional_rewards
from flows.stages.training import TrainOptions, replay_and_train
from futureworld.domain import Agent, Outcome, OutcomeStatus, ParseStatus, Question
from futureworld.policy.tiny import init_tiny_model
from futureworld.rl.config import Estimator, TrainConfig
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.tables import ReplayConsumptionRow, RewardRow, RolloutRow
from tests.flows.conftest import CUTOFF, GENERATION, make_context

SAMPLES = 3


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=4)


def _forecast(engine, data_dir: Path, model: Path) -> list[int]:
    """Three questions closing in 5 days, each forecast by a group of three rollouts. A random
    tiny model rarely writes a parseable answer, so the stated forecasts are set to 0.2,
    0.5 and 0.8 by sample (the tokens stay the model's own)."""
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="test",
                    external_id=f"q{i}",
                    title=f"Will event {i} happen?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                    close_at=CUTOFF + timedelta(days=5),
                )
                for i in range(3)
            ],
        )
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )
    predict(make_context(engine, data_dir), "tiny", samples=SAMPLES)
    with session_scope(engine) as session:
        for sample, p in enumerate((0.2, 0.5, 0.8)):
            session.execute(
                update(RolloutRow)
                .where(RolloutRow.sample_index == sample)
                .values(p_yes=p, parse_status=str(ParseStatus.OK))
            )
        return [q.id for q in list_questions(session)]


def _ledger(engine) -> list[tuple[int, int, bool]]:
    """(question, outcome revision, provisional) of every consumption record."""
    with session_scope(engine) as session:
        return sorted(
            session.execute(
                select(
                    RolloutRow.question_id,
                    ReplayConsumptionRow.outcome_revision,
                    ReplayConsumptionRow.provisional,
                ).join(RolloutRow, RolloutRow.id == ReplayConsumptionRow.rollout_id)
            ).all()
        )


@pytest.mark.parametrize("estimator", [Estimator.PROVISIONAL_CONSENSUS, Estimator.SIOP])
def test_provisional_consensus_trains_on_provisional_rewards_then_replays_the_real_ones(
    engine, tiny_model, tmp_path, estimator
):
    consensus = TrainOptions(config=TrainConfig(estimator=estimator, learning_rate=1e-3))
    questions = _forecast(engine, tmp_path, tiny_model)
    day1 = make_context(engine, tmp_path, as_of=CUTOFF + timedelta(days=1))
    assert write_provisional_rewards(day1, "tiny").rewards_written == 3 * SAMPLES
    # Nothing has resolved: dr_grpo has nothing to train on, the consensus has the three groups.
    assert (
        replay_and_train(day1, "tiny", TrainOptions(config=TrainConfig(learning_rate=1e-3))) is None
    )
    report = replay_and_train(day1, "tiny", consensus)
    assert report is not None and (report.groups, report.rollouts) == (3, 3 * SAMPLES)
    assert _ledger(engine) == sorted((q, 0, True) for q in questions for _ in range(SAMPLES))
    # Consumed provisionally: not replayed twice on the same provisional rewards.
    assert replay_and_train(day1, "tiny", consensus) is None

    # The first question resolves on day 2; by day 3 backfill has its real rewards.
    with session_scope(engine) as session:
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=questions[0],
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=1.0,
                    resolved_at=CUTOFF + timedelta(days=2),
                )
            ],
        )
    day3 = make_context(engine, tmp_path, as_of=CUTOFF + timedelta(days=3))
    backfill_rewards(day3)
    assert write_provisional_rewards(day3, "tiny").rewards_voided == SAMPLES
    with session_scope(engine) as session:
        voided = session.scalars(
            select(RolloutRow.question_id)
            .join(RewardRow, RewardRow.rollout_id == RolloutRow.id)
            .where(RewardRow.provisional.is_(True), RewardRow.voided.is_(True))
        ).all()
    assert set(voided) == {questions[0]}
    report = replay_and_train(day3, "tiny", consensus)
    assert report is not None and (report.groups, report.rollouts) == (1, SAMPLES)
    assert _ledger(engine) == sorted(
        [(q, 0, True) for q in questions for _ in range(SAMPLES)]
        + [(questions[0], 1, False)] * SAMPLES
    )
