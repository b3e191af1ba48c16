"""Outside forecast files read strictly: every bad row refused with its line and reason, the
good rows kept; ForecastBench entries keyed as the ForecastBench importer stores questions."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from futureworld.domain import Question, QuestionKind
from futureworld.sources.forecast_files import (
    default_agent_name,
    detect_format,
    match_forecasts,
    read_forecast_file,
)
from futureworld.sources.forecast_rows import ForecastFileError, ForecastFormat, RowError

AT = datetime(2025, 10, 1, tzinfo=UTC)


def question(source: str, external_id: str, qid: int, kind: str = "binary") -> Question:
    extra = {"numeric": {"lower": 0.0, "upper": 10.0}} if kind == "numeric" else {}
    return Question(
        source=source,
        external_id=external_id,
        title="?",
        created_at=AT,
        info_cutoff_at=AT,
        kind=QuestionKind(kind),
        extra=extra,
        id=qid,
    )


CSV_TEXT = """source,question_id,probability,forecast_at,note
sim,q1,0.25,2025-10-02T12:00:00Z,fine
sim,q2,1.5,2025-10-02,too big
sim,q3,0.5,yesterday,bad time
sim,,0.5,2025-10-02,no id
sim,q1,0.3,2025-10-03,again
sim,q9,0.4,2025-10-02,unknown
sim,q4,0.7,2025-10-02T09:00:00,no zone
sim,q5,abc,2025-10-02,not a number
sim,q6,0,2025-10-02,
sim,n1,0.5,2025-10-02,numeric question
"""


def test_csv_loads_the_good_rows_and_reports_each_bad_line() -> None:
    parsed = read_forecast_file(CSV_TEXT, "outside.csv")
    assert parsed.file_format is ForecastFormat.CSV
    assert parsed.row_count == 10
    stored = {
        ("sim", name): question("sim", name, i)
        for i, name in enumerate(["q1", "q2", "q3", "q4", "q5", "q6"], start=1)
    }
    stored[("sim", "n1")] = question("sim", "n1", 7, kind="numeric")
    matched = match_forecasts(parsed, stored)
    assert [(m.question.external_id, m.row.p_yes) for m in matched.forecasts] == [
        ("q1", 0.25),
        ("q6", 0.0),  # p = 0 is a forecast, not a missing one
    ]
    assert matched.forecasts[0].row.forecast_at == datetime(2025, 10, 2, 12, tzinfo=UTC)
    assert matched.forecasts[1].row.forecast_at == datetime(2025, 10, 2, tzinfo=UTC)
    problems = {e.line: e.problem for e in matched.errors}
    assert sorted(problems) == [3, 4, 5, 6, 7, 8, 9, 11]
    assert problems[3] == "probability: 1.5 is outside [0, 1]"
    assert problems[4] == "forecast_at: 'yesterday' is not an ISO 8601 time or date"
    assert problems[5] == "missing field question_id"
    assert problems[6] == "duplicate: sim/q1 is forecast on line 2"
    assert problems[7] == "unknown question sim/q9"
    assert problems[8] == "forecast_at: '2025-10-02T09:00:00' has no time zone"
    assert problems[9] == "probability: 'abc' is not a number"
    assert problems[11] == "sim/n1 is a numeric question, not binary"


def test_jsonl_rows_are_strict_about_types_and_report_their_lines() -> None:
    lines = [
        json.dumps({"source": "sim", "question_id": "q1", "probability": 0.6,
                    "forecast_at": "2025-10-02T00:00:00+02:00"}),
        "",
        "{not json",
        json.dumps({"source": "sim", "question_id": "q2", "probability": "0.6",
                    "forecast_at": "2025-10-02"}),
        json.dumps({"source": "sim", "question_id": "q3", "probability": True,
                    "forecast_at": "2025-10-02"}),
        json.dumps({"source": "sim", "question_id": "q4", "probability": 0.1}),
        json.dumps([1, 2]),
        json.dumps({"source": "sim", "question_id": "q5", "probability": float("nan"),
                    "forecast_at": "2025-10-02"}),
    ]  # fmt: skip
    parsed = read_forecast_file("\n".join(lines) + "\n", "outside.jsonl")
    assert parsed.file_format is ForecastFormat.JSONL
    [row] = parsed.rows
    assert (row.line, row.key, row.p_yes) == (1, ("sim", "q1"), 0.6)
    assert row.forecast_at == datetime(2025, 10, 1, 22, tzinfo=UTC)
    assert [str(e) for e in parsed.errors] == [
        "line 3: not JSON (Expecting property name enclosed in double quotes at column 2)",
        "line 4: probability: '0.6' is not a number",
        "line 5: probability: True is not a number",
        "line 6: missing field forecast_at",
        "line 7: not a JSON object",
        "line 8: probability: nan is outside [0, 1]",
    ]


def test_a_forecast_made_once_the_outcome_was_known_is_refused() -> None:
    text = (
        "source,question_id,probability,forecast_at\nsim,q1,0.9,2025-10-05\nsim,q2,0.9,2025-10-03\n"
    )
    parsed = read_forecast_file(text, "late.csv")
    stored = {("sim", "q1"): question("sim", "q1", 1), ("sim", "q2"): question("sim", "q2", 2)}
    revealed = {1: datetime(2025, 10, 4, tzinfo=UTC), 2: datetime(2025, 10, 4, tzinfo=UTC)}
    matched = match_forecasts(parsed, stored, revealed)
    assert [m.question.id for m in matched.forecasts] == [2]
    [error] = matched.errors
    assert error.line == 2 and "is not before the outcome of sim/q1 was revealed" in error.problem


def submission(forecasts: list[object], **top: object) -> str:
    document = {
        "organization": "Acme",
        "model": "oracle 1",
        "model_organization": "Acme",
        "question_set": "2025-10-26-llm.json",
        "forecast_due_date": "2025-10-26",
        "forecast_date": "2025-10-26",
        "forecasts": forecasts,
        **top,
    }
    return json.dumps(document, indent=2)


FB_M1 = "forecastbench:manifold/2025-10-26/m1"


def test_forecastbench_entries_are_keyed_like_imported_questions_with_their_lines() -> None:
    text = submission(
        [
            {"id": "m1", "source": "manifold", "forecast": 0.2, "resolution_date": None},
            {"id": "d1", "source": "fred", "forecast": 0.7, "resolution_date": "2025-11-02"},
            {"id": "d1", "source": "fred", "forecast": 0.4, "resolution_date": "2026-01-25"},
            {"id": "m2", "source": "polymarket", "forecast": 0.5, "resolution_date": "2025-11-02"},
            {"id": "d2", "source": "acled", "forecast": 0.5, "resolution_date": None},
            {"id": ["a", "b"], "source": "fred", "forecast": 0.5, "resolution_date": "2025-11-02"},
            {"id": "m3", "source": "nowhere", "forecast": 0.5, "resolution_date": None},
            {"id": "m4", "source": "manifold", "forecast": -0.1, "resolution_date": None},
            {"id": "m5", "source": "manifold", "resolution_date": None},
            {"id": "m1", "source": "manifold", "forecast": 0.3, "resolution_date": None},
        ]
    )
    parsed = read_forecast_file(text, "2025-10-26.Acme.1.json")
    assert parsed.file_format is ForecastFormat.FORECASTBENCH
    keys = [(r.key, r.p_yes) for r in parsed.rows]
    assert keys == [
        (("forecastbench:manifold", "2025-10-26/m1"), 0.2),
        (("forecastbench:fred", "2025-10-26/d1@2025-11-02"), 0.7),
        (("forecastbench:fred", "2025-10-26/d1@2026-01-25"), 0.4),
    ]
    assert {r.forecast_at for r in parsed.rows} == {datetime(2025, 10, 26, tzinfo=UTC)}
    lines = text.splitlines()
    # Each row's line is the line its entry's '{' is on.
    for row in parsed.rows:
        assert lines[row.line - 1].strip() == "{"
    starts = [i + 1 for i, line in enumerate(lines) if line.strip() == "{"][1:]
    assert [r.line for r in parsed.rows] == starts[:3]
    assert [(e.line, e.problem) for e in parsed.errors] == [
        (starts[3], "resolution_date: must be null for a polymarket (market) question"),
        (starts[4], "resolution_date: a acled (dataset) question needs its date"),
        (starts[5], "id: a combination question (they are not imported)"),
        (starts[6], "source: 'nowhere' is not a ForecastBench source"),
        (starts[7], "forecast: -0.1 is outside [0, 1]"),
        (starts[8], "missing field forecast"),
        (starts[9], f"duplicate: {FB_M1} is forecast on line {starts[0]}"),
    ]  # fmt: skip
    assert default_agent_name(parsed, "2025-10-26.Acme.1") == "Acme-oracle-1"


def test_forecastbench_round_falls_back_to_the_question_set_name_and_due_date() -> None:
    entry = {"id": "m1", "source": "manifold", "forecast": 0.2, "resolution_date": None}
    text = json.dumps(
        {"organization": "o", "model": "m", "question_set": "2025-11-09-llm.json",
         "forecasts": [entry]}
    )  # fmt: skip
    [row] = read_forecast_file(text, "f.json").rows
    assert row.external_id == "2025-11-09/m1"
    assert row.forecast_at == datetime(2025, 11, 9, tzinfo=UTC)
    assert row.line == 1


@pytest.mark.parametrize(
    ("text", "name", "problem"),
    [
        ("[1, 2]", "f.json", "the top level must be a JSON object"),
        ('{"organization": "o", ', "f.json", "invalid JSON at line 1"),
        ('{"organization": "o", "model": "m", "forecasts": []}', "f.json", "question_set"),
        (
            '{"organization": "o", "model": "m", "question_set": "x", "forecasts": {}}',
            "f.json",
            "'forecasts' must be a list",
        ),
        (
            '{"organization": "o", "model": "m", "question_set": "x", "forecasts": []}',
            "f.json",
            "no round",
        ),
        (
            "question,probability\nq1,0.5\n",
            "f.csv",
            "the CSV header lacks source, question_id, forecast_at",
        ),
    ],
)
def test_a_file_that_cannot_be_read_at_all_is_refused_whole(
    text: str, name: str, problem: str
) -> None:
    with pytest.raises(ForecastFileError, match=problem):
        read_forecast_file(text, name)


def test_format_comes_from_the_name_else_the_content() -> None:
    assert detect_format("a.json", "") is ForecastFormat.FORECASTBENCH
    assert detect_format("a.ndjson", "") is ForecastFormat.JSONL
    assert detect_format("a.CSV", "{") is ForecastFormat.CSV
    assert detect_format("a", submission([])) is ForecastFormat.FORECASTBENCH
    assert detect_format("a", '{"source": "sim"}\n{"source": "sim"}\n') is ForecastFormat.JSONL
    assert detect_format("a", "source,question_id\n") is ForecastFormat.CSV
    parsed = read_forecast_file("source,question_id,probability,forecast_at\n", "x.txt")
    assert parsed.rows == [] and parsed.errors == []
    assert default_agent_name(parsed, "my forecasts") == "my-forecasts"
    assert str(RowError(3, "bad")) == "line 3: bad"
