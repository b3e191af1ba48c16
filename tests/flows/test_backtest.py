"""The backtest replays history without leaking the future: a tiny LLM agent over six
simulated days of a made-up history, training every day; no forecast is of a question whose
outcome the clock has revealed, no reward exists before its outcome's resolution time, no
update trains on an outcome resolved after its clock, and a re-resolution later than the
clock is not seen."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, select

from flows.stages.backtesting import BacktestOptions, BacktestRound, run_backtest
from flows.stages.training import TrainOptions
from futureworld.domain import Agent, Outcome, OutcomeStatus, Question
from futureworld.policy.tiny import init_tiny_model
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.tables import OutcomeRow, ReplayConsumptionRow, RewardRow, RolloutRow, TrainingRunRow
from tests.flows.conftest import GENERATION, make_context

DAY0 = datetime(2025, 3, 1, tzinfo=UTC)


def history(engine: Engine) -> None:
    """Twelve questions posed on days 0–2, resolving one to three days later; question 0 is
    re-resolved (flipped) long after the backtest ends."""
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="history",
                    external_id=f"h{i}",
                    title=f"Will event {i} happen?",
                    created_at=DAY0 + timedelta(days=i % 3),
                    info_cutoff_at=DAY0 + timedelta(days=i % 3),
                    crowd_probability=0.3 + 0.05 * i,
                )
                for i in range(12)
            ],
        )
        questions = list_questions(session, source="history")
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=q.id,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=float(i % 2),
                    resolved_at=q.info_cutoff_at + timedelta(days=1 + i % 3, hours=6),
                )
                for i, q in enumerate(questions)
            ],
        )
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=questions[0].id,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=1.0,
                    resolved_at=DAY0 + timedelta(days=60),
                )
            ],
        )


def test_backtest_trains_and_forecasts_only_on_what_the_clock_reveals(
    engine: Engine, tmp_path: Path
) -> None:
    history(engine)
    ctx = make_context(engine, tmp_path)
    model = init_tiny_model(tmp_path / "tiny-model", seed=3)
    with session_scope(engine) as session:
        ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )
    seen: list[tuple[BacktestRound, int]] = []

    def on_round(r: BacktestRound) -> None:
        with session_scope(engine) as session:
            future_rewards = session.execute(
                select(RewardRow.id)
                .join(RolloutRow, RolloutRow.id == RewardRow.rollout_id)
                .join(
                    OutcomeRow,
                    (OutcomeRow.question_id == RolloutRow.question_id)
                    & (OutcomeRow.revision == RewardRow.outcome_revision),
                )
                .where(OutcomeRow.resolved_at > r.clock)
            ).all()
        seen.append((r, len(future_rewards)))

    options = BacktestOptions(
        agent="tiny",
        start=date(2025, 3, 1),
        end=date(2025, 3, 6),
        samples=2,
        train=TrainOptions(learning_rate=1e-4),
    )
    report = run_backtest(ctx, options, out_dir=tmp_path / "report", on_round=on_round)

    assert [n for _, n in seen] == [0] * 6  # no reward ever precedes its outcome
    trained = [r for r in report.rounds if r.training_run_id is not None]
    assert trained, "some round trains on what resolved before it"
    with session_scope(engine) as session:
        for r in trained:
            consumed = session.execute(
                select(OutcomeRow.resolved_at, OutcomeRow.revision)
                .join(RolloutRow, RolloutRow.question_id == OutcomeRow.question_id)
                .join(
                    ReplayConsumptionRow,
                    (ReplayConsumptionRow.rollout_id == RolloutRow.id)
                    & (ReplayConsumptionRow.outcome_revision == OutcomeRow.revision),
                )
                .where(ReplayConsumptionRow.training_run_id == r.training_run_id)
            ).all()
            assert consumed and all(at <= r.clock for at, _ in consumed)
            assert all(revision == 1 for _, revision in consumed)  # the flip is not seen yet
        assert (
            session.scalar(select(TrainingRunRow.id).where(TrainingRunRow.status != "completed"))
            is None
        )
        rollouts = session.execute(
            select(RolloutRow.id, RolloutRow.question_id, RolloutRow.policy_version)
        ).all()
        outcomes = session.execute(select(OutcomeRow.question_id, OutcomeRow.resolved_at)).all()
    first_resolution = {}
    for question_id, at in outcomes:
        first_resolution[question_id] = min(at, first_resolution.get(question_id, at))
    # Each version forecast at its own round's clock: never after the question resolved.
    clock_of_version = {}
    for r in report.rounds:
        clock_of_version.setdefault(r.policy_version, r.clock)
    for _, question_id, version in rollouts:
        assert clock_of_version[version] < first_resolution[question_id]

    assert {"metrics.json", "report.md", "brier_by_round.png"} <= {
        p.name for p in (tmp_path / "report").iterdir()
    }


def test_backtest_rounds_are_paired_with_the_crowd_on_the_same_questions(
    engine: Engine, tmp_path: Path
) -> None:
    history(engine)
    ctx = make_context(engine, tmp_path)
    options = BacktestOptions(agent="uniform", start=date(2025, 3, 1), end=date(2025, 3, 7))
    report = run_backtest(ctx, options, out_dir=tmp_path / "report")
    # Questions are posed on days 0-2 (four a day) and forecast on the day they are posed;
    # scored against the outcomes revealed by the last day (the last resolve on day 5 at
    # 06:00, the flip of question 0 long after).
    assert [r.forecasts for r in report.rounds] == [4, 4, 4, 0, 0, 0, 0]
    scored = report.rounds[:3]
    crowd = {i: 0.3 + 0.05 * i for i in range(12)}
    for r in scored:
        ids = [i for i in range(12) if i % 3 == r.round]
        assert r.n == 4 and r.brier == 0.25
        expected = sum((crowd[i] - i % 2) ** 2 for i in ids) / 4
        assert abs(r.reference_brier - expected) < 1e-12
        assert abs(r.difference - (0.25 - expected)) < 1e-12
        lo, hi = r.difference_ci
        assert lo <= r.difference <= hi
    assert all(r.brier is None for r in report.rounds[3:])
    text = (tmp_path / "report" / "report.md").read_text()
    assert "| 0 | 2025-03-01 | 0 | 4 |" in text


def test_backtest_flow_runs_the_stage_and_writes_its_report(
    prefect_harness, engine: Engine, db_url: str, tmp_path: Path, monkeypatch
) -> None:
    from flows.orchestration.pipeline import backtest_flow

    history(engine)
    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FW_DB_URL", db_url)
    rounds = backtest_flow(agent="uniform", start="2025-03-01", end="2025-03-07", step_days=2)
    assert [r["clock"][:10] for r in rounds] == [
        "2025-03-01",
        "2025-03-03",
        "2025-03-05",
        "2025-03-07",
    ]
    # Day 1 is not simulated: its questions are forecast on day 2, with day 2's own.
    assert [r["n"] for r in rounds] == [4, 8, 0, 0] and rounds[1]["brier"] == 0.25
    assert (tmp_path / "reports" / "backtest-uniform" / "report.md").is_file()
