"""ForecastBench rounds as a scope: with two rounds in one database, `--round` on import,
predict, evaluate, export and backtest (and the evaluate flow's `round`) sees only that round's
questions, with the 2025-10-26 round's own figures; an unknown round is a one-line error (exit
2); `evaluate --by-horizon` splits the binary table into buckets that add up to the whole."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from flows.cli import app
from futureworld.evaluation import ForecastRecord
from futureworld.horizons import HORIZON_BUCKETS, horizon_bucket
from futureworld.sources.forecastbench import MARKET_SOURCES
from storage.engine import session_scope
from storage.repositories.questions import UnknownRound
from storage.tables import AgentRow, QuestionRow, RolloutRow

RAW = Path(__file__).resolve().parents[2].parent / "shared" / "forecastbench-eval" / "raw"
QUESTIONS = RAW / "2025-10-26-llm.json"
RESOLUTIONS = RAW / "2025-10-26_resolution_set.json"
FIRST, SECOND, UNKNOWN = "2025-10-26", "2025-11-09", "2024-01-07"
FIRST_QUESTIONS = 2246
"""Binary questions of the 2025-10-26 round (test_forecastbench_cli)."""


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def refused(*args: str) -> str:
    """The one line a command that refuses its arguments prints (exit 2)."""
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def second_round(folder: Path) -> tuple[Path, Path, list[dict], list[dict]]:
    """The real round re-posed with the due date 2025-11-09 (same freeze time, so both rounds
    are open on 2025-10-26): its first 20 market and first 3 dataset questions, with their
    rows of the real resolution set. Returns both files, the questions and the rows."""
    document = json.loads(QUESTIONS.read_text())
    markets = [q for q in document["questions"] if q["resolution_dates"] == "N/A"][:20]
    datasets = [
        q
        for q in document["questions"]
        if q["resolution_dates"] != "N/A" and not isinstance(q["id"], list)
    ][:3]
    questions = markets + datasets
    name = f"{SECOND}-llm.json"
    question_set = folder / name
    question_set.write_text(
        json.dumps({"forecast_due_date": SECOND, "question_set": name, "questions": questions})
    )
    ids = {(q["source"], q["id"]) for q in questions}
    rows = [
        r
        for r in json.loads(RESOLUTIONS.read_text())["resolutions"]
        if (r["source"], r["id"]) in ids
    ]
    resolution_set = folder / f"{SECOND}_resolution_set.json"
    resolution_set.write_text(
        json.dumps({"forecast_due_date": SECOND, "question_set": name, "resolutions": rows})
    )
    return question_set, resolution_set, questions, rows


def resolved_rows(questions: list[dict], rows: list[dict], by: date | None = None) -> list[dict]:
    """The resolution rows that resolve a binary question of `questions` (by `by`), from the
    JSON alone: a resolved market row, or a resolved row at one of a dataset question's dates."""
    dates = {(q["source"], q["id"]): q["resolution_dates"] for q in questions}
    out = []
    for r in rows:
        key = (r["source"], r["id"])
        if key not in dates or not r["resolved"] or r["resolved_to"] not in (0, 1):
            continue
        if r["source"] not in MARKET_SOURCES and r["resolution_date"] not in dates[key]:
            continue
        if by is None or date.fromisoformat(r["resolution_date"]) <= by:
            out.append(r)
    return out


def horizon_counts(rows: list[dict], forecast_day: date) -> dict[str, int]:
    """Resolved rows per horizon bucket for forecasts made at `forecast_day` 00:00 UTC, by
    the buckets' stated rule (days from the forecast to the resolution date)."""
    counts: dict[str, int] = {}
    for r in rows:
        days = (date.fromisoformat(r["resolution_date"]) - forecast_day).days
        label = next(lab for lab, bound in HORIZON_BUCKETS if bound is None or days <= bound)
        counts[label] = counts.get(label, 0) + 1
    return counts


def test_horizon_buckets_follow_their_stated_bounds() -> None:
    at = datetime(2025, 10, 26, tzinfo=UTC)

    def bucket(days: float) -> str:
        record = ForecastRecord(
            agent="a", policy_version=0, source="s", domain="", p_yes=0.5, y=1.0, as_of=at,
            resolved_at=at + timedelta(days=days),
        )  # fmt: skip
        return horizon_bucket(record)

    cases = [(-1, "≤7 d"), (7, "≤7 d"), (7.5, "8–30 d"), (30, "8–30 d"), (31, "31–90 d")]
    cases += [(90, "31–90 d"), (180, "91–180 d"), (181, ">180 d"), (3650, ">180 d")]
    assert [bucket(days) for days, _ in cases] == [label for _, label in cases]
    with pytest.raises(ValueError, match="needs as_of and resolved_at"):
        horizon_bucket(ForecastRecord(agent="a", policy_version=0, source="s", domain="",
                                      p_yes=0.5, y=1.0))  # fmt: skip


def test_every_command_with_round_sees_only_that_round(
    engine, db_url: str, tmp_path: Path, prefect_harness, monkeypatch
) -> None:
    folder = tmp_path / "second"
    folder.mkdir()
    second_set, _, second_questions, second_rows = second_round(folder)
    first_questions = json.loads(QUESTIONS.read_text())["questions"]
    first_rows = json.loads(RESOLUTIONS.read_text())["resolutions"]
    n_second = 20 + sum(len(q["resolution_dates"]) for q in second_questions[20:])

    # import: the files must be of the round named; from a folder, only that round
    line = refused("import", "forecastbench", str(QUESTIONS), "--round", SECOND, "--db", db_url)
    assert f"forecast_due_date is {FIRST}, not --round {SECOND}" in line
    line = refused("import", "forecastbench", str(folder), "--round", FIRST, "--db", db_url)
    assert f"no question set of round {FIRST}" in line and SECOND in line
    with session_scope(engine) as session:
        assert session.scalar(select(func.count()).select_from(QuestionRow)) == 0
    out = cli(
        "import", "forecastbench", str(QUESTIONS), "--resolutions", str(RESOLUTIONS),
        "--round", FIRST, "--db", db_url,
    )  # fmt: skip
    assert f"questions: {FIRST_QUESTIONS} new" in out
    out = cli("import", "forecastbench", str(folder), "--round", SECOND, "--db", db_url)
    assert f"round {SECOND}: questions: {n_second} new" in out

    # an unknown round: one line naming the stored rounds, exit 2, from every command
    stored = f"stored rounds: {FIRST}, {SECOND}"
    for args in (
        ("predict", "--agent", "crowd", "--as-of", FIRST),
        ("evaluate",),
        ("export", "forecastbench", "--agent", "crowd", "--question-set", str(QUESTIONS),
         "--out", str(tmp_path / "x.json")),
        ("backtest", "--agent", "uniform", "--from", FIRST, "--to", FIRST, "--out",
         str(tmp_path / "bt-unknown")),
    ):  # fmt: skip
        line = refused(*args, "--round", UNKNOWN, "--db", db_url)
        assert f"round {UNKNOWN}: no question of it is stored ({stored})" in line, args
    assert "is not a date" in " ".join(
        CliRunner().invoke(app, ["evaluate", "--round", "soon", "--db", db_url]).output.split()
    )

    # predict: each round's own questions
    for agent in ("crowd", "uniform"):
        out = cli("predict", "--agent", agent, "--as-of", FIRST, "--round", SECOND, "--db", db_url)
        assert f"{n_second} rollouts" in out
    out = cli("predict", "--agent", "crowd", "--as-of", FIRST, "--round", FIRST, "--db", db_url)
    assert f"{FIRST_QUESTIONS} rollouts" in out
    out = cli("predict", "--agent", "uniform", "--as-of", FIRST, "--round", FIRST, "--db", db_url)
    assert f"{FIRST_QUESTIONS} rollouts" in out
    cli("backfill", "--db", db_url)

    # evaluate: the first round's figures as test_forecastbench_cli states them
    def evaluate(*args: str) -> dict:
        path = tmp_path / "scores.json"
        cli("evaluate", "--json", str(path), *args, "--db", db_url)
        return json.loads(path.read_text())

    first = evaluate("--round", FIRST, "--by-horizon")
    board = {h["agent"]: h for h in first["forecastbench"]}
    assert (board["crowd"]["n_market"], board["crowd"]["n_dataset"]) == (112, 977)
    assert round(board["crowd"]["brier_index"], 1) == 61.7
    overall = {r["agent"]: r for r in first["rows"] if r["source"] is None}
    assert overall["crowd"]["n"] == overall["uniform"]["n"] == 112 + 977
    assert len(resolved_rows(first_questions, first_rows)) == 112 + 977
    n_second_resolved = len(resolved_rows(second_questions, second_rows))
    second = evaluate("--round", SECOND)
    overall_second = {r["agent"]: r for r in second["rows"] if r["source"] is None}
    assert overall_second["crowd"]["n"] == overall_second["uniform"]["n"] == n_second_resolved
    both = evaluate()
    mixed = {r["agent"]: r for r in both["rows"] if r["source"] is None}
    assert mixed["crowd"]["n"] == 112 + 977 + n_second_resolved

    # by horizon: the buckets of each forecaster add up to its whole, and hold the rows the
    # raw files put in them (forecasts made on the due date, 00:00 UTC)
    expected = horizon_counts(resolved_rows(first_questions, first_rows), date(2025, 10, 26))
    for agent in ("crowd", "uniform"):
        rows = [r for r in first["horizon_rows"] if r["agent"] == agent]
        assert sum(r["n"] for r in rows) == overall[agent]["n"]
        assert {r["horizon"]: r["n"] for r in rows} == expected
    assert len(expected) >= 4  # 7, 30, 90 and 180 days: the resolved dataset horizons
    uniform_rows = [r for r in first["horizon_rows"] if r["agent"] == "uniform"]
    assert all(r["brier"] == 0.25 for r in uniform_rows)

    # export: the set must be of the round named
    out_file = tmp_path / "export.json"
    printed = cli(
        "export", "forecastbench", "--agent", "crowd", "--question-set", str(QUESTIONS),
        "--round", FIRST, "--out", str(out_file), "--db", db_url,
    )  # fmt: skip
    assert "250 forecasts" in printed
    line = refused(
        "export", "forecastbench", "--agent", "crowd", "--question-set", str(QUESTIONS),
        "--round", SECOND, "--out", str(out_file), "--db", db_url,
    )  # fmt: skip
    assert f"a question set of round {FIRST}, not of --round {SECOND}" in line
    printed = cli(
        "export", "forecastbench", "--agent", "crowd", "--question-set", str(second_set),
        "--round", SECOND, "--out", str(out_file), "--db", db_url,
    )  # fmt: skip
    assert "20 forecasts" in printed  # the crowd forecasts markets only

    # backtest: a new forecaster over the second round only, scored against the crowd (the
    # uniform forecast where the crowd has none), with the outcomes revealed by 2025-11-26
    out = cli(
        "backtest", "--agent", "base-rate", "--from", FIRST, "--to", "2025-11-26", "--step",
        "31d", "--train-every", "0", "--fallback-reference", "uniform", "--round", SECOND,
        "--out", str(tmp_path / "bt"), "--db", db_url,
    )  # fmt: skip
    revealed = len(resolved_rows(second_questions, second_rows, by=date(2025, 11, 26)))
    assert 0 < revealed < n_second_resolved
    assert f"scored {revealed} of {revealed} resolved questions" in " ".join(out.split())
    with session_scope(engine) as session:
        ids = session.scalars(
            select(QuestionRow.external_id)
            .join(RolloutRow, RolloutRow.question_id == QuestionRow.id)
            .join(AgentRow, AgentRow.id == RolloutRow.agent_id)
            .where(AgentRow.name == "base-rate")
        ).all()
    assert len(ids) == n_second and all(i.startswith(f"{SECOND}/") for i in ids)

    # the evaluate and backtest flows take the same round
    from flows.orchestration.pipeline import backtest_flow, evaluate_flow

    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("FW_DB_URL", db_url)
    rows = evaluate_flow(round=SECOND)
    flow_overall = {r["agent"]: r for r in rows if r["source"] is None and r["agent"] == "crowd"}
    assert flow_overall["crowd"]["n"] == n_second_resolved
    with pytest.raises(UnknownRound, match=f"round {UNKNOWN}: no question of it is stored"):
        backtest_flow(agent="uniform", start=FIRST, end=FIRST, train_every=0, round=UNKNOWN)
