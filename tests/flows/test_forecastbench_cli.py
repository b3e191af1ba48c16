"""The foundation loop through the CLI on the real ForecastBench files: import, baseline
forecasts, backfill, evaluate — on Postgres and SQLite, every stage idempotent."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from flows.cli import app
from futureworld.sources.forecastbench import MARKET_SOURCES as MARKETS
from storage.engine import session_scope
from storage.tables import OutcomeRow, QuestionRow, RewardRow, RolloutRow

RAW = Path(__file__).resolve().parents[2].parent / "shared" / "forecastbench-eval" / "raw"
QUESTIONS = RAW / "2025-10-26-llm.json"
RESOLUTIONS = RAW / "2025-10-26_resolution_set.json"
FREEZE = "2025-10-16T00:00:00+00:00"


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def counts(engine) -> dict[str, int]:
    with session_scope(engine) as session:
        return {
            table.__tablename__: session.scalar(select(func.count()).select_from(table))
            for table in (QuestionRow, OutcomeRow, RolloutRow, RewardRow)
        }


def crowd_brier_from_raw() -> float:
    """Straight from the JSON: resolved market questions, freeze value vs resolved_to."""
    questions = json.loads(QUESTIONS.read_text())["questions"]
    resolutions = json.loads(RESOLUTIONS.read_text())["resolutions"]
    freeze = {
        (q["source"], q["id"]): float(q["freeze_datetime_value"])
        for q in questions
        if q["resolution_dates"] == "N/A"
    }
    errors = [
        (freeze[(r["source"], r["id"])] - r["resolved_to"]) ** 2
        for r in resolutions
        if r["resolved"] and (r["source"], r["id"]) in freeze
    ]
    assert len(errors) == 112
    return sum(errors) / len(errors)


def test_forecastbench_loop_end_to_end_and_idempotent(engine, db_url: str, tmp_path) -> None:
    cli("db", "upgrade", "--db", db_url)
    cli("import", "forecastbench", str(QUESTIONS), "--db", db_url)
    for name in ("crowd", "base-rate", "uniform"):
        cli("agent", "add", name, "--model", name, "--backend", "baseline", "--db", db_url)
        cli("predict", "--agent", name, "--as-of", FREEZE, "--db", db_url)
    before_outcomes = counts(engine)
    assert before_outcomes["question"] == 2246  # 4 FRED series list 7 horizons upstream
    assert before_outcomes["rollout"] == 3 * 2246
    cli(
        "import", "forecastbench", str(QUESTIONS), "--resolutions", str(RESOLUTIONS), "--db", db_url
    )
    out = cli("backfill", "--db", db_url)
    assert "voided" in out
    first = counts(engine)

    # Every stage again: nothing changes.
    cli(
        "import", "forecastbench", str(QUESTIONS), "--resolutions", str(RESOLUTIONS), "--db", db_url
    )
    for name in ("crowd", "base-rate", "uniform"):
        cli("predict", "--agent", name, "--as-of", FREEZE, "--db", db_url)
    cli("backfill", "--db", db_url)
    assert counts(engine) == first
    assert first["outcome"] == 112 + 977 + 19

    report = tmp_path / "scores.json"
    plot = tmp_path / "reliability.png"
    cli("evaluate", "--json", str(report), "--plot", str(plot), "--db", db_url)
    rows = json.loads(report.read_text())["rows"]
    crowd_all = next(r for r in rows if r["agent"] == "crowd" and r["source"] is None)
    # The crowd has no forecast of the 977 dataset questions: each counts as 0.5, as
    # ForecastBench imputes a missing forecast, and the parse rate says how many were.
    assert crowd_all["n"] == 112 + 977
    assert math.isclose(crowd_all["parse_rate"], 112 / (112 + 977))
    imputed = (112 * crowd_brier_from_raw() + 977 * 0.25) / (112 + 977)
    assert math.isclose(crowd_all["brier"], imputed, rel_tol=1e-9)
    uniform_all = next(r for r in rows if r["agent"] == "uniform" and r["source"] is None)
    assert uniform_all["brier"] == 0.25
    assert uniform_all["n"] == 112 + 977
    lo, hi = crowd_all["brier_ci"]
    assert lo < crowd_all["brier"] < hi
    assert plot.stat().st_size > 1000


def test_bad_files_fail_clearly_and_write_nothing(engine, db_url: str, tmp_path) -> None:
    truncated = tmp_path / "truncated.json"
    truncated.write_text(QUESTIONS.read_text()[:5000])
    bad_resolutions = tmp_path / "bad_resolutions.json"
    data = json.loads(RESOLUTIONS.read_text())
    data["resolutions"][7]["resolved_to"] = 1.5
    bad_resolutions.write_text(json.dumps(data))
    unknown = tmp_path / "unknown_source.json"
    questions = json.loads(QUESTIONS.read_text())
    questions["questions"][3]["source"] = "oracle"
    unknown.write_text(json.dumps(questions))
    cases = [
        ((str(truncated),), "truncated.json"),
        ((str(QUESTIONS), "--resolutions", str(bad_resolutions)), "resolutions[7]"),
        ((str(unknown),), "oracle"),
    ]
    for args, needle in cases:
        result = CliRunner().invoke(app, ["import", "forecastbench", *args, "--db", db_url])
        assert result.exit_code == 2, result.output
        assert needle in " ".join(result.output.split()), result.output
        assert counts(engine) == {"question": 0, "outcome": 0, "rollout": 0, "reward": 0}


def test_built_in_baselines_forecast_on_a_fresh_database_without_agent_add(tmp_path) -> None:
    db_url = f"sqlite:///{tmp_path / 'fresh.db'}"
    cli("import", "forecastbench", str(QUESTIONS), "--db", db_url)
    out = cli("predict", "--agent", "crowd", "--as-of", FREEZE, "--db", db_url)
    assert "crowd v0:" in out and " 0 rollouts" not in out
    listed = cli("agent", "list", "--db", db_url)
    assert "crowd" in listed and "baseline" in listed
    result = CliRunner().invoke(app, ["predict", "--agent", "nobody", "--db", db_url])
    assert result.exit_code == 2 and "no agent named 'nobody'" in result.output


def crowd_brier_by_source_from_raw() -> dict[str | None, tuple[int, float]]:
    """Per market source (None: all markets), straight from the JSON: (n, crowd Brier)."""
    questions = json.loads(QUESTIONS.read_text())["questions"]
    resolutions = json.loads(RESOLUTIONS.read_text())["resolutions"]
    freeze = {
        (q["source"], q["id"]): float(q["freeze_datetime_value"])
        for q in questions
        if q["resolution_dates"] == "N/A"
    }
    errors: dict[str | None, list[float]] = {}
    for r in resolutions:
        if r["resolved"] and (r["source"], r["id"]) in freeze:
            error = (freeze[(r["source"], r["id"])] - r["resolved_to"]) ** 2
            errors.setdefault(r["source"], []).append(error)
            errors.setdefault(None, []).append(error)
    return {source: (len(e), sum(e) / len(e)) for source, e in errors.items()}


def test_questions_imported_with_their_resolutions_are_open_before_them(
    engine, db_url: str, tmp_path
) -> None:
    """The new user's order: import the set with its resolutions, then forecast as of the due
    date, backfill and evaluate; the crowd's Brier per source is the raw files' own."""
    cli(
        "import", "forecastbench", str(QUESTIONS), "--resolutions", str(RESOLUTIONS), "--db", db_url
    )
    out = cli("predict", "--agent", "crowd", "--as-of", "2025-10-26", "--db", db_url)
    assert "2246 rollouts" in out
    cli("backfill", "--db", db_url)
    report = tmp_path / "scores.json"
    cli("evaluate", "--json", str(report), "--db", db_url)
    rows = {r["source"]: r for r in json.loads(report.read_text())["rows"] if r["agent"] == "crowd"}
    expected = crowd_brier_by_source_from_raw()
    for upstream, published_n, published_brier in (
        ("manifold", 23, 0.0362),
        ("polymarket", 71, 0.0206),
        (None, 112, 0.0435),
    ):
        n, brier = expected[upstream]
        assert (n, round(brier, 4)) == (published_n, published_brier)
        if upstream is None:  # every market pooled: the crowd's market rows together
            markets = [r for s, r in rows.items() if s and s.split(":")[1] in MARKETS]
            assert sum(r["n"] for r in markets) == n
            pooled = sum(r["brier"] * r["n"] for r in markets) / n
            assert math.isclose(pooled, brier, rel_tol=1e-9)
            continue
        source = f"forecastbench:{upstream}"
        assert rows[source]["n"] == n and rows[source]["parse_rate"] == 1.0
        assert math.isclose(rows[source]["brier"], brier, rel_tol=1e-9)

    # As of a day after the first resolutions, those questions are no longer open, nor are
    # markets closed by then: a new forecaster (uniform) gets every other question.
    day = datetime(2025, 11, 1, tzinfo=UTC)
    out = cli("predict", "--agent", "uniform", "--as-of", day.isoformat(), "--db", db_url)
    with session_scope(engine) as session:
        resolved_by = set(
            session.scalars(select(OutcomeRow.question_id).where(OutcomeRow.resolved_at <= day))
        )
        closed_by = set(session.scalars(select(QuestionRow.id).where(QuestionRow.close_at <= day)))
    assert resolved_by and closed_by - resolved_by
    assert f"{2246 - len(resolved_by | closed_by)} rollouts" in out


def test_the_crowd_on_forecastbench_rules_from_the_raw_files(db_url: str, tmp_path) -> None:
    """ForecastBench's leaderboard figures of the crowd on the shared 2025-10-26 round,
    recomputed from the raw files: 112 resolved markets at the crowd's freeze value (Brier
    0.0435), 977 dataset rows, one per resolved (question, resolution date) of 246 questions,
    none forecast by the crowd and so imputed at 0.5 (Brier 0.25), overall (0.0435 + 0.25) / 2
    = 0.1468 and Brier Index 61.7. 977 of its 1089 forecasts (89.7%) are imputed, far over
    ForecastBench's 5%; as a baseline it is exempt (ForecastBench does not test its own)."""
    cli(
        "import", "forecastbench", str(QUESTIONS), "--resolutions", str(RESOLUTIONS), "--db", db_url
    )
    for name in ("crowd", "uniform"):
        cli("predict", "--agent", name, "--as-of", "2025-10-26", "--db", db_url)
    cli("backfill", "--db", db_url)
    report = tmp_path / "scores.json"
    out = cli("evaluate", "--json", str(report), "--db", db_url)
    scores = json.loads(report.read_text())
    board = {h["agent"]: h for h in scores["forecastbench"]}

    questions = json.loads(QUESTIONS.read_text())["questions"]
    resolutions = json.loads(RESOLUTIONS.read_text())["resolutions"]
    dataset_rows = [r for r in resolutions if r["source"] not in MARKETS]
    assert len({(r["source"], r["id"]) for r in dataset_rows}) == 246
    market = crowd_brier_from_raw()
    overall = (market + 0.25) / 2
    crowd = board["crowd"]
    assert (crowd["n_market"], crowd["n_dataset"]) == (112, len(dataset_rows)) == (112, 977)
    assert math.isclose(crowd["brier_market"], market, rel_tol=1e-12)
    assert crowd["brier_dataset"] == 0.25
    assert math.isclose(crowd["brier_overall"], overall, rel_tol=1e-12)
    # One round, every forecaster answering every question: the fixed effects change no
    # ranking and the rescaled difficulty-adjusted Brier is the Brier itself.
    assert math.isclose(crowd["difficulty_adjusted_overall"], overall, rel_tol=1e-9)
    assert math.isclose(crowd["brier_index"], 100 * (1 - math.sqrt(overall)), rel_tol=1e-9)
    assert (round(market, 4), round(overall, 4), round(crowd["brier_index"], 1)) == (
        0.0435,
        0.1468,
        61.7,
    )
    assert crowd["imputed"] == 977 and round(crowd["imputed_share"], 3) == 0.897
    assert crowd["eligibility"] == "reference" and crowd["ineligible_rounds"] == []
    uniform = board["uniform"]
    assert uniform["difficulty_adjusted_overall"] == pytest.approx(0.25)
    assert uniform["brier_index"] == pytest.approx(50.0) and uniform["imputed"] == 0
    # Uniform is Always 0.5, out of the fit; the crowd's 0.5 on every dataset row is too,
    # unless nothing else forecasts them.
    assert scores["forecastbench_reference_set"] == {
        "market": ["crowd v0"],
        "dataset": ["crowd v0", "uniform v0"],
    }
    assert "ForecastBench crowd v0 [reference]: Brier Index 61.7" in " ".join(out.split())
    rows = {(r["agent"], r["source"]): r for r in scores["rows"]}
    assert rows[("crowd", None)]["eligibility"] == "reference"
    assert rows[("crowd", None)]["imputed"] == 977
    assert len(questions) == 500
