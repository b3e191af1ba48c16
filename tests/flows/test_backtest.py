"""The backtest replays history without leaking the future: a tiny LLM agent over six
simulated days of a made-up history, training every day; no forecast is of a question whose
outcome the clock has revealed, no reward exists before its outcome's resolution time, no
update trains on an outcome resolved after its clock, and a re-resolution later than the
clock is not seen. Questions without a crowd probability are paired with the base rate, and
the report counts what was paired with which and what was left out."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, select

from flows.stages.backtesting import (
    BacktestOptions,
    BacktestRound,
    Coverage,
    LeftOut,
    pair_forecasts,
    run_backtest,
)
from flows.stages.training import TrainOptions
from futureworld.domain import Agent, Outcome, OutcomeStatus, Question, QuestionKind
from futureworld.policy.tiny import init_tiny_model
from futureworld.rl.config import TrainConfig
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
        train=TrainOptions(config=TrainConfig(learning_rate=1e-4)),
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


def dataset(engine: Engine) -> None:
    """Questions without a crowd probability: binary ones of a dataset source (d0 posed on day
    0, d1 on day 2, d2 and d3 on day 4; one resolved before the backtest seeds its base rate;
    d0 is flipped long after the end, d3 resolves after it) and a choice question."""
    posed = {"old": -10, "d0": 0, "d1": 2, "d2": 4, "d3": 4}
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                *(
                    Question(
                        source="dataset",
                        external_id=name,
                        title=f"Will series {name} rise?",
                        created_at=DAY0 + timedelta(days=day),
                        info_cutoff_at=DAY0 + timedelta(days=day),
                    )
                    for name, day in posed.items()
                ),
                Question(
                    source="dataset",
                    external_id="c0",
                    title="Which way will it go?",
                    kind=QuestionKind.CHOICE,
                    options=("up", "flat", "down"),
                    created_at=DAY0,
                    info_cutoff_at=DAY0,
                ),
            ],
        )
        ids = {q.external_id: q.id for q in list_questions(session, source="dataset")}
        resolved = {  # value, days after DAY0 (at 06:00)
            "old": (0.0, -5),
            "d0": (1.0, 1),
            "d1": (0.0, 3),
            "d2": (1.0, 5),
            "d3": (1.0, 30),
            "c0": (2.0, 1),
        }
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=ids[name],
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=value,
                    resolved_at=DAY0 + timedelta(days=day, hours=6),
                )
                for name, (value, day) in resolved.items()
            ],
        )
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=ids["d0"],
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=0.0,
                    resolved_at=DAY0 + timedelta(days=60),
                )
            ],
        )


def test_questions_without_a_crowd_are_scored_against_the_base_rate_and_counted(
    engine: Engine, tmp_path: Path
) -> None:
    history(engine)
    dataset(engine)
    ctx = make_context(engine, tmp_path)
    options = BacktestOptions(agent="uniform", start=date(2025, 3, 1), end=date(2025, 3, 7))
    assert (options.reference, options.fallback_reference) == ("crowd", "base-rate")
    report = run_backtest(ctx, options, out_dir=tmp_path / "report")

    # The base rate of the dataset source at each cut-off, from the outcomes revealed by the
    # clock that forecast it, (yes + 1) / (n + 2): d0 sees old (NO); d1 sees old and d0 (YES,
    # not yet flipped); d2 sees old, d0 and d1 (NO).
    base = {"d0": (0 + 1) / (1 + 2), "d1": (1 + 1) / (2 + 2), "d2": (1 + 1) / (3 + 2)}
    y = {"d0": 1.0, "d1": 0.0, "d2": 1.0}
    crowd = {i: 0.3 + 0.05 * i for i in range(12)}
    markets = {r: [i for i in range(12) if i % 3 == r] for r in range(3)}
    fallback_of_round = {0: ["d0"], 2: ["d1"], 4: ["d2"]}
    rounds = report.rounds
    assert [r.forecasts for r in rounds] == [6, 4, 5, 0, 2, 0, 0]  # d0 and c0 on day 0
    for r in rounds:
        ids = markets.get(r.round, [])
        names = fallback_of_round.get(r.round, [])
        assert (r.n, r.against_reference, r.against_fallback) == (
            len(ids) + len(names),
            len(ids),
            len(names),
        )
        if r.n == 0:
            assert r.brier is None
            continue
        errors = [(crowd[i] - i % 2) ** 2 for i in ids] + [(base[d] - y[d]) ** 2 for d in names]
        assert r.brier == 0.25  # uniform: 0.5 on every question
        assert abs(r.reference_brier - sum(errors) / len(errors)) < 1e-12
    assert rounds[0].left_out == LeftOut(not_binary=1)  # c0
    assert rounds[4].left_out == LeftOut(unresolved=1)  # d3 resolves after the last clock

    # 12 markets and old, d0, d1, d2, c0 resolved by the last clock; old never open.
    assert report.coverage == Coverage(
        resolved=17, against_reference=12, against_fallback=3, not_forecast=1, not_binary=1
    )
    metrics = json.loads((tmp_path / "report" / "metrics.json").read_text())
    assert (metrics["reference"], metrics["fallback_reference"]) == ("crowd", "base-rate")
    assert metrics["coverage"]["against_fallback"] == 3
    assert metrics["rounds"][4]["left_out"]["unresolved"] == 1
    text = (tmp_path / "report" / "report.md").read_text()
    assert "is paired with base-rate's forecast instead" in text
    assert "of 17 questions resolved by the last clock, 15 were scored (12 against crowd, 3" in text
    assert "| vs crowd | vs base-rate |" in text
    assert "| 4 | 2025-03-05 | 0 | 2 | — | 1 | 0 | 1 |" in text


def test_without_a_fallback_questions_without_a_reference_are_counted_not_scored() -> None:
    outcomes = {1: 1.0, 2: 0.0, 3: 1.0, 4: 0.0}
    rows = [(1, 0.6), (1, None), (2, 0.3), (3, None), (5, 0.5), (4, 0.2)]
    after, left_out, why = pair_forecasts(rows, outcomes, binary={1, 2, 3}, paired={1: 0.5, 3: 0.5})
    assert after == [(1, 0.6, 1.0)]
    assert left_out == LeftOut(
        unresolved=1, not_binary=1, no_reference=1, no_answer=1, unparsed_rollouts=2
    )
    assert why == {1: "scored", 2: "no_reference", 3: "no_answer", 5: "unresolved", 4: "not_binary"}


def test_the_backtest_command_states_its_fallback_and_what_it_left_out(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from flows.cli import app

    history(engine)
    dataset(engine)
    args = ["backtest", "--agent", "uniform", "--from", "2025-03-01", "--to", "2025-03-07"]
    folder = tmp_path / "report"
    result = CliRunner().invoke(
        app,
        [*args, "--fallback-reference", "none", "--out", str(folder), "--db", db_url],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    # Without a fallback the three resolved dataset binaries have no reference forecast.
    assert "scored 12 of 17 resolved questions; left out: 1 never forecast, 1 not binary, 3 " in (
        " ".join(result.output.split())
    )
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["fallback_reference"] is None and metrics["coverage"]["no_reference"] == 3
    assert "is left out (no fallback reference)" in (folder / "report.md").read_text()
