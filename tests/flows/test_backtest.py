"""The backtest replays history without leaking the future: a tiny LLM agent over six
simulated days of a made-up history, training every day; no forecast is of a question whose
outcome the clock has revealed, no reward exists before its outcome's resolution time, no
update trains on an outcome resolved after its clock, and a re-resolution later than the
clock is not seen. Rounds are scored per question (the mean of its G rollouts, an unparsed one
counted as 0.5), questions without a crowd probability are paired with the base rate, and the
report counts what was paired with which and what was left out."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from matplotlib.dates import date2num
from sqlalchemy import Engine, select

from flows.stages.backtest_report import brier_by_day_figure
from flows.stages.backtesting import (
    BacktestOptions,
    BacktestRound,
    Coverage,
    LeftOut,
    left_out_of,
    question_reasons,
    run_backtest,
)
from flows.stages.training import TrainOptions
from futureworld.domain import (
    Agent,
    Outcome,
    OutcomeStatus,
    ParseStatus,
    Question,
    QuestionKind,
    Trajectory,
)
from futureworld.policy.tiny import init_tiny_model
from futureworld.rl.config import TrainConfig
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.repositories.rollouts import insert_rollouts
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
    outcomes = {1, 2, 3, 4}
    why = question_reasons({1, 2, 3, 4, 5}, outcomes, binary={1, 2, 3}, paired={1, 3})
    # 3 is scored though none of its rollouts may have parsed: that is imputation, not absence.
    assert why == {1: "scored", 2: "no_reference", 3: "scored", 5: "unresolved", 4: "not_binary"}
    assert left_out_of(why) == LeftOut(unresolved=1, not_binary=1, no_reference=1)


def test_a_round_scores_questions_with_an_unparsed_rollout_counted_as_a_half(
    engine: Engine, tmp_path: Path
) -> None:
    history(engine)
    ctx = make_context(engine, tmp_path)
    model = init_tiny_model(tmp_path / "tiny-model", seed=3)
    # G = 4 rollouts of each question posed on day 0, as a run of that day wrote them (a re-run
    # finds them complete and scores them); None: the answer did not parse.
    answers = {
        "h0": [0.2, 0.4, None, 0.2],  # y = 0: p = (0.2 + 0.4 + 0.5 + 0.2) / 4 = 0.325
        "h3": [0.9, None, None, 0.7],  # y = 1: p = (0.9 + 0.5 + 0.5 + 0.7) / 4 = 0.65
        "h6": [0.1, 0.1, 0.1, 0.1],  # y = 0: p = 0.1
        "h9": [None, None, None, None],  # y = 1: p = 0.5, scored, not dropped
    }
    with session_scope(engine) as session:
        tiny = ensure_agent(
            session,
            Agent(name="tiny", base_model=str(model), backend="local", generation=GENERATION),
        )
        ids = {q.external_id: q.id for q in list_questions(session, source="history")}
        insert_rollouts(
            session,
            [
                Trajectory(
                    question_id=ids[name],
                    agent_id=tiny.id,
                    policy_version=0,
                    sample_index=i,
                    p_yes=p,
                    parse_status=ParseStatus.OK if p is not None else ParseStatus.MISSING,
                    as_of=DAY0,
                )
                for name, ps in answers.items()
                for i, p in enumerate(ps)
            ],
        )
    # Day 6 forecasts nothing (every question has resolved by then) and reveals every outcome.
    options = BacktestOptions(
        agent="tiny", start=date(2025, 3, 1), end=date(2025, 3, 7), step_days=6, samples=4,
        train_every=0,
    )  # fmt: skip
    report = run_backtest(ctx, options, out_dir=tmp_path / "report")

    first = report.rounds[0]
    assert first.forecasts == 0  # nothing new to generate: the groups are complete
    # n counts questions (4), not rollouts (16) nor parsed rollouts (9).
    assert (first.n, first.rollouts, first.against_reference) == (4, 16, 4)
    assert first.parse_rate == 9 / 16
    # Brier = (0.325² + 0.35² + 0.1² + 0.5²) / 4 = (0.105625 + 0.1225 + 0.01 + 0.25) / 4
    assert abs(first.brier - 0.12203125) < 1e-12
    # Per rollout, imputed included: (0.49 + 0.60 + 0.04 + 1.00) / 16 = 0.133125.
    assert abs(first.sample_brier - 0.133125) < 1e-12
    # The crowd on the same questions: (0.3² + 0.55² + 0.6² + 0.25²) / 4 = 0.20375.
    assert abs(first.reference_brier - 0.20375) < 1e-12
    assert abs(first.difference - (0.12203125 - 0.20375)) < 1e-12
    lo, hi = first.difference_ci
    assert lo <= first.difference <= hi
    assert report.rounds[1].n == 0 and report.rounds[1].brier is None
    text = (tmp_path / "report" / "report.md").read_text()
    row = "| 0 | 2025-03-01 | 0 | 0 | — | 4 | 4 | 0 | 0.562 of 16 | 0.1220 | 0.1331 | 0.2038 |"
    assert row in text
    assert "an unparsed rollout counting as 0.5" in text

    figure = brier_by_day_figure(options, report.rounds)
    [ax] = figure.axes
    [bars] = ax.containers  # the scored day's error bar: its paired interval
    assert bars.has_yerr
    [((x0, low), (x1, high))] = bars.lines[2][0].get_segments()
    assert x0 == x1 == date2num(DAY0)  # at the simulated day, on a date axis
    assert abs(low - (0.20375 + lo)) < 1e-12 and abs(high - (0.20375 + hi)) < 1e-12
    figure.canvas.draw()  # the x axis is the simulated day: a tick on each, dated
    assert [t.get_text() for t in ax.get_xticklabels()] == ["2025-03-01", "2025-03-07"]
    assert any("reference: crowd" in t.get_text() for t in ax.get_legend().get_texts())


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
    assert (
        "scored 12 of 17 resolved questions (an unparsed rollout counts as 0.5); left out: 1 "
        "never forecast, 1 not binary, 3 without a reference" in " ".join(result.output.split())
    )
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["fallback_reference"] is None and metrics["coverage"]["no_reference"] == 3
    assert "is left out (no fallback reference)" in (folder / "report.md").read_text()


def test_backtest_pairs_an_agent_with_imported_outside_forecasts(
    engine: Engine, tmp_path: Path
) -> None:
    """`futureworld import forecasts` makes a read-only agent that a backtest can take as its
    reference: each round pairs the agent's questions with the file's forecasts of them."""
    from flows.stages.external_forecasts import import_forecasts

    history(engine)
    ctx = make_context(engine, tmp_path)
    outside = {i: round(0.15 + 0.06 * i, 4) for i in range(12)}
    lines = ["source,question_id,probability,forecast_at"]
    lines += [
        f"history,h{i},{p},{(DAY0 + timedelta(days=i % 3, hours=1)).isoformat()}"
        for i, p in outside.items()
    ]
    (tmp_path / "outside.csv").write_text("\n".join(lines) + "\n")
    imported = import_forecasts(ctx, tmp_path / "outside.csv", agent_name="outside")
    assert imported.errors == [] and imported.loaded == 12

    options = BacktestOptions(
        agent="uniform", reference="outside", start=date(2025, 3, 1), end=date(2025, 3, 7)
    )
    report = run_backtest(ctx, options)
    assert report.reference == "outside"
    for r in report.rounds[:3]:
        ids = [i for i in range(12) if i % 3 == r.round]
        expected = sum((outside[i] - i % 2) ** 2 for i in ids) / 4
        assert r.n == 4 and r.brier == 0.25
        assert abs(r.reference_brier - expected) < 1e-12
        assert abs(r.difference - (0.25 - expected)) < 1e-12
    assert report.coverage.against_reference == 12
