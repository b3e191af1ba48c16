"""Choice and numeric questions through the command line on Postgres and SQLite: the crowd and
uniform baselines forecast them, backfill rewards them, and `evaluate` prints a table per
kind, writes each kind's rows to --json and a PIT histogram next to --plot."""

from __future__ import annotations

import json
from datetime import timedelta

from typer.testing import CliRunner

from flows.cli import app
from futureworld.domain import NumericSpec, Outcome, OutcomeStatus, Question, QuestionKind
from storage.engine import session_scope
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.repositories.rewards import current_rewards
from tests.flows.conftest import CUTOFF

SPEC = NumericSpec(lower=0.0, upper=200.0, unit="units")


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _store(engine) -> None:
    common = {
        "source": "sim",
        "created_at": CUTOFF - timedelta(days=1),
        "info_cutoff_at": CUTOFF,
        "close_at": CUTOFF + timedelta(days=1),
    }
    questions = [
        Question(
            external_id=f"c{i}",
            title=f"Which team wins match {i}?",
            kind=QuestionKind.CHOICE,
            options=("Arden", "Borel", "Calder"),
            extra={"ordered_options": False, "crowd_probabilities": [0.2, 0.6, 0.2]},
            **common,
        )
        for i in range(3)
    ] + [
        Question(
            external_id=f"n{i}",
            title=f"How many units by day {i}?",
            kind=QuestionKind.NUMERIC,
            extra={**SPEC.to_extra(), "crowd_quantiles": [60, 80, 95, 110, 130]},
            **common,
        )
        for i in range(3)
    ]
    outcomes = {"c0": 1.0, "c1": 1.0, "c2": 0.0, "n0": 90.0, "n1": 101.5, "n2": 150.0}
    with session_scope(engine) as session:
        upsert_questions(session, questions)
        stored = list_questions(session)
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=q.id,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=outcomes[q.external_id],
                    resolved_at=CUTOFF + timedelta(days=2),
                )
                for q in stored
            ],
        )


def test_baselines_and_evaluate_per_kind_through_the_cli(engine, db_url: str, tmp_path) -> None:
    _store(engine)
    as_of = CUTOFF.isoformat()
    for baseline in ("crowd", "uniform", "base-rate"):
        cli("predict", "--agent", baseline, "--as-of", as_of, "--db", db_url)
    cli("backfill", "--db", db_url)
    with session_scope(engine) as session:  # 3 questions × 3 baselines per kind
        for reward_fn in ("rlcr", "crps"):
            rewards = sorted(r.value for r in current_rewards(session, reward_fn).values())
            assert len(rewards) == 9 and rewards[:3] == [-1.25] * 3  # base rate: no answer
            assert rewards[3] > -1.25
    report, plot = tmp_path / "scores.json", tmp_path / "reliability.png"
    out = cli("evaluate", "--json", str(report), "--plot", str(plot), "--db", db_url)
    assert "choice questions" in out and "numeric questions" in out
    rows = json.loads(report.read_text())
    assert rows["rows"] == []
    choice = {(r["agent"], r["source"]): r for r in rows["choice_rows"]}
    numeric = {(r["agent"], r["source"]): r for r in rows["numeric_rows"]}
    # The base rate has no forecast of a choice or numeric question.
    assert {agent for agent, _ in choice} == {"crowd", "uniform"} == {a for a, _ in numeric}
    crowd, uniform = choice[("crowd", None)], choice[("uniform", None)]
    assert crowd["n"] == uniform["n"] == 3
    # Crowd: (0.2, 0.6, 0.2) scored against B, B, A; uniform: 1/3 each.
    crowd_brier = (2 * (0.04 + 0.16 + 0.04) + (0.64 + 0.36 + 0.04)) / 3
    assert abs(crowd["brier"] - crowd_brier) < 1e-9
    assert abs(uniform["brier"] - 2 / 3) < 1e-9
    assert numeric[("crowd", None)]["crps_skill_vs_crowd"] == 0.0
    assert numeric[("uniform", None)]["crps"] > numeric[("crowd", None)]["crps"]
    assert sum(numeric[("crowd", None)]["pit_counts"]) == 3
    assert plot.exists() and (tmp_path / "reliability.pit.png").exists()
