"""The evaluate stage scores choice and numeric forecasts per kind on Postgres and SQLite;
the kinds' specs round-trip through storage."""

from __future__ import annotations

from datetime import timedelta

import pytest

from flows.stages.evaluating import evaluate
from futureworld import scoring
from futureworld.domain import (
    QUANTILE_LEVELS,
    Agent,
    NumericSpec,
    Outcome,
    OutcomeStatus,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.repositories.rollouts import insert_rollouts
from tests.flows.conftest import CUTOFF, make_context

SPEC = NumericSpec(lower=0.0, upper=50.0, open_upper=True, unit="units")


def _questions() -> list[Question]:
    common = {"created_at": CUTOFF, "info_cutoff_at": CUTOFF, "close_at": CUTOFF + timedelta(1)}
    return [
        Question(
            source="sim",
            external_id="c",
            title="Which team wins?",
            kind=QuestionKind.CHOICE,
            options=("Arden", "Borel", "Calder"),
            extra={"ordered_options": False, "crowd_probabilities": [0.2, 0.5, 0.3]},
            **common,
        ),
        *(
            Question(
                source="sim",
                external_id=f"n{i}",
                title=f"How many units by day {i}?",
                kind=QuestionKind.NUMERIC,
                extra={**SPEC.to_extra(), "crowd_quantiles": [5, 10, 20, 30, 45]},
                **common,
            )
            for i in range(2)
        ),
    ]


def test_question_specs_round_trip_through_storage(engine) -> None:
    with session_scope(engine) as session:
        upsert_questions(session, _questions())
        stored = {q.external_id: q for q in list_questions(session)}
    assert stored["c"].kind is QuestionKind.CHOICE
    assert stored["c"].choice_spec.options == ("Arden", "Borel", "Calder")
    assert stored["c"].crowd_forecast == (0.2, 0.5, 0.3)
    assert stored["n0"].numeric_spec == SPEC
    assert stored["n1"].crowd_forecast == (5.0, 10.0, 20.0, 30.0, 45.0)


def test_evaluate_scores_numeric_rollouts_on_the_unit_axis(engine, tmp_path) -> None:
    with session_scope(engine) as session:
        upsert_questions(session, _questions())
        questions = {q.external_id: q for q in list_questions(session)}
        agent = ensure_agent(session, Agent(name="a", base_model="m", backend="local"))
        answers = [(4.0, 8.0, 12.0, 16.0, 20.0), (10.0, 20.0, 25.0, 30.0, 40.0)]
        rollouts = [
            Trajectory(
                question_id=questions[f"n{i}"].id,
                agent_id=agent.id,
                policy_version=1,
                sample_index=s,
                quantiles=answers[s],
                as_of=CUTOFF,
            )
            for i in range(2)
            for s in range(2)
        ]
        rollouts.append(
            Trajectory(
                question_id=questions["n0"].id,
                agent_id=agent.id,
                policy_version=1,
                sample_index=2,
                parse_status=ParseStatus.NOT_MONOTONE,
            )
        )
        insert_rollouts(session, rollouts)
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=questions["n0"].id,
                    revision=1,
                    status=OutcomeStatus.RESOLVED,
                    value=15.0,
                    resolved_at=CUTOFF + timedelta(days=2),
                ),
                Outcome(
                    question_id=questions["n1"].id,
                    revision=1,
                    status=OutcomeStatus.ANNULLED,
                    value=None,
                    resolved_at=CUTOFF + timedelta(days=2),
                ),
            ],
        )
    evaluation = evaluate(make_context(engine, tmp_path, as_of=CUTOFF + timedelta(days=2)))
    assert evaluation.rows == [] and evaluation.choice_rows == []
    assert len(evaluation.numeric_records) == 2  # parsed answers to the resolved question
    pooled = [r for r in evaluation.numeric_rows if r.source is None]
    (row,) = pooled
    unit = [[v / 50.0 for v in a] for a in answers]
    expected = scoring.crps_from_quantiles(unit, QUANTILE_LEVELS, [0.3, 0.3]).mean()
    assert row.n == 2 and row.crps == pytest.approx(expected)
    assert row.coverage_50 == 0.5 and row.coverage_90 == 1.0
    # 15 has three quantiles of the first answer under it, one of the second
    assert row.pit_counts == (0, 1, 0, 1, 0, 0)
    assert row.crps_skill_vs_crowd is not None


def test_evaluate_counts_questions_and_scores_an_agent_whose_answers_never_parse(
    engine, tmp_path
) -> None:
    """G = 3 rollouts of 2 binary questions: n is 2 questions, each forecast the mean of its
    rollouts with an unparsed one as 0.5; an agent none of whose answers parse is scored at 0.5
    with parse rate 0, not dropped from the table."""
    common = {"created_at": CUTOFF, "info_cutoff_at": CUTOFF, "close_at": CUTOFF + timedelta(1)}
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(source="sim", external_id=f"b{i}", title=f"Will {i}?", **common)
                for i in (0, 1)
            ],
        )
        ids = [q.id for q in sorted(list_questions(session), key=lambda q: q.external_id)]
        agents = [
            ensure_agent(session, Agent(name=name, base_model="m", backend="local"))
            for name in ("mixed", "mute")
        ]
        agents.append(
            ensure_agent(session, Agent(name="uniform", base_model="uniform", backend="baseline"))
        )
        answers = {
            "mixed": [[0.9, 0.6, None], [0.2, None, None]],
            "mute": [[None] * 3] * 2,
            "uniform": [[None], [0.5]],
        }
        insert_rollouts(
            session,
            [
                Trajectory(
                    question_id=question_id,
                    agent_id=agent.id,
                    policy_version=1,
                    sample_index=s,
                    p_yes=p,
                    parse_status=ParseStatus.OK if p is not None else ParseStatus.MISSING,
                    as_of=CUTOFF,
                )
                for agent in agents
                for question_id, group in zip(ids, answers[agent.name], strict=True)
                for s, p in enumerate(group)
            ],
        )
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=question_id,
                    revision=1,
                    status=OutcomeStatus.RESOLVED,
                    value=y,
                    resolved_at=CUTOFF + timedelta(days=2),
                )
                for question_id, y in zip(ids, (1.0, 0.0), strict=True)
            ],
        )
    evaluation = evaluate(make_context(engine, tmp_path, as_of=CUTOFF + timedelta(days=2)))
    rows = {r.agent: r for r in evaluation.rows if r.source is None}
    mixed, mute = rows["mixed"], rows["mute"]
    assert (mixed.n, mixed.samples, mixed.parse_rate) == (2, 6, pytest.approx(3 / 6))
    p0, p1 = (0.9 + 0.6 + 0.5) / 3, (0.2 + 0.5 + 0.5) / 3
    assert mixed.brier == pytest.approx(((p0 - 1) ** 2 + p1**2) / 2)
    assert (mute.n, mute.parse_rate, mute.brier) == (2, 0.0, 0.25)
    # ForecastBench's 5% rule (IMPUTED_CUTOFF_PCT): mixed has 1/3 + 2/3 = 1 of its 2 question
    # forecasts imputed, mute 2 of 2: both flagged and kept; the baseline is exempt.
    assert (mixed.imputed, mixed.imputed_share, mixed.eligibility) == (1, 0.5, "ineligible")
    assert (mute.imputed, mute.eligibility) == (2, "ineligible")
    assert (rows["uniform"].imputed, rows["uniform"].eligibility) == (1, "reference")
    assert {r.question for r in evaluation.records} == {"b0", "b1"}
    assert evaluation.forecastbench is not None and evaluation.forecastbench.rows == []
