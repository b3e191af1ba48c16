"""ForecastBench parsing on the real upstream files, and clear errors on bad input."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest

from futureworld.domain import OutcomeStatus
from futureworld.sources import forecastbench as fb
from futureworld.sources import forecastbench_outcomes as fbo

REPO = Path(__file__).resolve().parents[2]
RAW = (
    next((p for p in (REPO / "shared", REPO.parent / "shared") if p.is_dir()), REPO / "shared")
    / "forecastbench-eval"
    / "raw"
)
QUESTION_FILE = "2025-10-26-llm.json"
RESOLUTION_FILE = "2025-10-26_resolution_set.json"


@pytest.fixture(scope="module")
def question_set() -> fb.QuestionSetImport:
    return fb.parse_question_set((RAW / QUESTION_FILE).read_text(), QUESTION_FILE)


@pytest.fixture(scope="module")
def resolution_set() -> fb.ResolutionSetImport:
    return fb.parse_resolution_set((RAW / RESOLUTION_FILE).read_text(), RESOLUTION_FILE)


@pytest.fixture(scope="module")
def matches(
    question_set: fb.QuestionSetImport, resolution_set: fb.ResolutionSetImport
) -> list[fbo.ResolutionMatch]:
    return fbo.match_resolutions(question_set.questions, resolution_set.rows)


def _is_market(question_source: str) -> bool:
    return question_source.removeprefix(fb.SOURCE_PREFIX) in fb.MARKET_SOURCES


def test_real_question_set_yields_250_market_and_1996_dataset_questions(
    question_set: fb.QuestionSetImport,
) -> None:
    assert question_set.forecast_due_date == date(2025, 10, 26)
    assert question_set.question_set_name == QUESTION_FILE
    assert question_set.skipped == Counter()
    by_source = Counter(q.source for q in question_set.questions)
    assert by_source == {
        "forecastbench:manifold": 77,
        "forecastbench:metaculus": 76,
        "forecastbench:polymarket": 76,
        "forecastbench:infer": 21,
        **{f"forecastbench:{s}": 400 for s in fb.DATASET_SOURCES},
        # four FRED series list 7 horizons, not 8 (2025-11-02 is missing upstream)
        "forecastbench:fred": 396,
    }
    assert len({(q.source, q.external_id) for q in question_set.questions}) == 250 + 1996
    assert all(q.external_id.startswith("2025-10-26/") for q in question_set.questions)


def test_market_question_carries_crowd_probability_and_close_time(
    question_set: fb.QuestionSetImport,
) -> None:
    by_id = {q.external_id: q for q in question_set.questions}
    q = by_id["2025-10-26/K8qazyZJ3tXyuLlzkkyk"]
    assert q.source == "forecastbench:manifold"
    assert q.title == "Will San Diego FC make the playoffs in 2025?"
    assert q.crowd_probability == pytest.approx(0.979920031255855)
    assert q.info_cutoff_at == datetime(2025, 10, 16, tzinfo=UTC)
    assert q.created_at == q.info_cutoff_at
    assert q.close_at == datetime(2026, 1, 1, 4, 59, tzinfo=UTC)
    assert q.resolve_by is None
    assert q.url == "https://manifold.markets/UniversalFC/will-san-diego-fc-make-the-playoffs"
    assert q.extra["question_set"] == QUESTION_FILE
    assert q.extra["upstream_id"] == "K8qazyZJ3tXyuLlzkkyk"
    assert "Manifold" in q.extra["source_intro"]
    metaculus = by_id["2025-10-26/7994"]
    assert metaculus.crowd_probability == pytest.approx(0.8)
    assert "before January 1, 2041" in metaculus.resolution_criteria


def test_dataset_question_expands_to_one_question_per_resolution_date(
    question_set: fb.QuestionSetImport,
) -> None:
    daaa = [q for q in question_set.questions if q.extra["upstream_id"] == "DAAA"]
    assert [q.external_id for q in daaa][:2] == [
        "2025-10-26/DAAA@2025-11-02",
        "2025-10-26/DAAA@2025-11-25",
    ]
    assert len(daaa) == 8
    first = daaa[0]
    assert first.source == "forecastbench:fred"
    assert first.title == (
        "Will Moody's Seasoned Aaa Corporate Bond Yield have increased by 2025-11-02 "
        "as compared to its value on 2025-10-26?"
    )
    assert first.resolve_by == datetime(2025, 11, 2, tzinfo=UTC)
    assert daaa[-1].resolve_by == datetime(2035, 10, 24, tzinfo=UTC)
    assert first.crowd_probability is None
    assert first.extra["freeze_datetime_value"] == "5.13"
    assert all("{" not in q.title for q in question_set.questions if not _is_market(q.source))


def test_real_resolution_set_rows(resolution_set: fb.ResolutionSetImport) -> None:
    assert resolution_set.question_set_name == QUESTION_FILE
    assert resolution_set.forecast_due_date == date(2025, 10, 26)
    assert len(resolution_set.rows) == 1208
    market = [r for r in resolution_set.rows if r.source in fb.MARKET_SOURCES]
    assert len(market) == 231
    assert sum(r.resolved for r in market) == 112


def test_real_resolutions_match_documented_counts(matches: list[fbo.ResolutionMatch]) -> None:
    resolved_market = [
        m for m in matches if _is_market(m.source) and m.status is OutcomeStatus.RESOLVED
    ]
    annulled = [m for m in matches if m.status is OutcomeStatus.ANNULLED]
    resolved_dataset = [m for m in matches if not _is_market(m.source)]
    assert len(resolved_market) == 112
    assert sum(m.value == 1.0 for m in resolved_market) == 18
    assert len(annulled) == 19
    assert all(_is_market(m.source) and m.value is None for m in annulled)
    assert annulled[0].resolved_at == datetime(2026, 8, 19, tzinfo=UTC)
    assert len(resolved_dataset) == 977
    assert sum(m.value == 1.0 for m in resolved_dataset) == 370
    assert all(m.status is OutcomeStatus.RESOLVED for m in resolved_dataset)
    assert len({(m.source, m.external_id) for m in matches}) == len(matches)


def test_dataset_resolution_joins_on_id_and_date(
    matches: list[fbo.ResolutionMatch], resolution_set: fb.ResolutionSetImport
) -> None:
    row = next(r for r in resolution_set.rows if r.source == "acled")
    match = next(
        m
        for m in matches
        if m.external_id == f"2025-10-26/{row.external_id}@{row.resolution_date.isoformat()}"
    )
    assert match.source == "forecastbench:acled"
    assert match.value == row.value
    assert match.resolved_at == datetime.combine(row.resolution_date, datetime.min.time(), UTC)
    assert match.raw["resolved_to"] == row.value


def test_open_market_rows_and_unresolved_horizons_stay_open(
    question_set: fb.QuestionSetImport,
    resolution_set: fb.ResolutionSetImport,
    matches: list[fbo.ResolutionMatch],
) -> None:
    matched = {m.external_id for m in matches}
    open_ids = {
        f"2025-10-26/{r.external_id}"
        for r in resolution_set.rows
        if r.source in fb.MARKET_SOURCES and not r.resolved
    }
    assert len(open_ids) == 119
    assert not open_ids & matched
    far = [q for q in question_set.questions if q.external_id.endswith("@2035-10-24")]
    assert far and not {q.external_id for q in far} & matched


# -- small hand-written files --------------------------------------------------------------


def _market(**overrides: Any) -> dict[str, Any]:
    record = {
        "id": "m1",
        "source": "manifold",
        "question": "Will it rain?",
        "resolution_criteria": "Resolves per the market.",
        "background": "",
        "market_info_open_datetime": "2025-01-01",
        "market_info_close_datetime": "2026-01-01T00:00:00+00:00",
        "market_info_resolution_criteria": "N/A",
        "url": "https://example.org/m1",
        "freeze_datetime": "2025-10-16T00:00:00+00:00",
        "freeze_datetime_value": "0.4",
        "freeze_datetime_value_explanation": "The market value.",
        "source_intro": "Predict the market.",
        "resolution_dates": "N/A",
    }
    record.update(overrides)
    return record


def _question_file(*records: dict[str, Any]) -> str:
    return json.dumps(
        {"forecast_due_date": "2025-10-26", "question_set": "t.json", "questions": list(records)}
    )


def _resolution_file(*rows: dict[str, Any]) -> str:
    return json.dumps(
        {"forecast_due_date": "2025-10-26", "question_set": "t.json", "resolutions": list(rows)}
    )


def _row(**overrides: Any) -> dict[str, Any]:
    row = {
        "id": "m1",
        "source": "manifold",
        "direction": None,
        "resolution_date": "2025-12-01",
        "resolved_to": 1.0,
        "resolved": True,
    }
    row.update(overrides)
    return row


def test_truncated_json_names_the_file() -> None:
    text = _question_file(_market())[:-20]
    with pytest.raises(fb.ForecastBenchFormatError, match=r"t\.json: invalid JSON at line 1"):
        fb.parse_question_set(text, "t.json")


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (_market(freeze_datetime_value="1.4"), r"'freeze_datetime_value' is a market probability"),
        (_market(freeze_datetime_value="abc"), r"'freeze_datetime_value' is not a number"),
        (_market(source="kalshi"), r"field 'source' is unknown: 'kalshi'"),
        (_market(question=3), r"field 'question' must be a string, got int"),
        (_market(freeze_datetime="yesterday"), r"'freeze_datetime' is not a timestamp"),
        (_market(resolution_dates=["2025-11-01"]), r"'resolution_dates' must be 'N/A'"),
        (_market(source="fred", resolution_dates="N/A"), r"non-empty list of dates"),
    ],
)
def test_bad_question_records_name_file_record_and_field(
    record: dict[str, Any], message: str
) -> None:
    text = _question_file(_market(id="ok"), record)
    with pytest.raises(
        fb.ForecastBenchFormatError, match=r"t\.json: questions\[1\] \(id "
    ) as error:
        fb.parse_question_set(text, "t.json")
    assert error.match(message)


def test_missing_question_field_is_named() -> None:
    record = _market()
    del record["url"]
    with pytest.raises(
        fb.ForecastBenchFormatError, match=r"questions\[0\] \(id 'm1'\): missing field 'url'"
    ):
        fb.parse_question_set(_question_file(record), "t.json")


def test_missing_top_level_field_is_named() -> None:
    with pytest.raises(fb.ForecastBenchFormatError, match="missing top-level field 'questions'"):
        fb.parse_question_set('{"forecast_due_date": "2025-10-26", "question_set": "x"}', "x")


def test_combination_questions_are_skipped_and_counted() -> None:
    parsed = fb.parse_question_set(_question_file(_market(), _market(id=["a", "b"])), "t.json")
    assert [q.external_id for q in parsed.questions] == ["2025-10-26/m1"]
    assert parsed.skipped == Counter({"combination": 1})


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (_row(resolved_to=1.5), r"'resolved_to' is outside \[0, 1\]"),
        (_row(resolved_to="1"), r"'resolved_to' must be a number"),
        (_row(resolved="yes"), r"'resolved' must be true or false"),
        (_row(source="nowhere"), r"field 'source' is unknown"),
        (_row(resolution_date="soon"), r"'resolution_date' is not a date"),
    ],
)
def test_bad_resolution_rows_name_file_record_and_field(row: dict[str, Any], message: str) -> None:
    with pytest.raises(fb.ForecastBenchFormatError, match=r"r\.json: resolutions\[0\] \(id "):
        fb.parse_resolution_set(_resolution_file(row), "r.json")
    with pytest.raises(fb.ForecastBenchFormatError, match=message):
        fb.parse_resolution_set(_resolution_file(row), "r.json")


def test_nan_resolution_stays_open_and_missing_market_is_annulled() -> None:
    questions = fb.parse_question_set(
        _question_file(_market(id="m1"), _market(id="m2"), _market(id="m3")), "t.json"
    ).questions
    text = _resolution_file(_row(id="m1", resolved_to=0.0), _row(id="m2", resolved=False)).replace(
        '"resolved_to": 1.0', '"resolved_to": NaN'
    )
    rows = fb.parse_resolution_set(text, "r.json").rows
    assert rows[1].value is None
    matches = {m.external_id: m for m in fbo.match_resolutions(questions, rows)}
    m1, m3 = matches["2025-10-26/m1"], matches["2025-10-26/m3"]
    assert m1.status is OutcomeStatus.RESOLVED and m1.value == 0.0
    assert "2025-10-26/m2" not in matches
    assert m3.status is OutcomeStatus.ANNULLED
    assert m3.raw == {"reason": "no row in the resolution set"}


def test_resolution_set_of_another_question_set_is_refused() -> None:
    questions = fb.parse_question_set(_question_file(_market(id="m1")), "t.json").questions
    rows = fb.parse_resolution_set(_resolution_file(_row(id="other")), "r.json").rows
    with pytest.raises(ValueError, match="refusing to annul them all"):
        fbo.match_resolutions(questions, rows)


def test_duplicate_rows_are_counted_and_conflicting_ones_rejected() -> None:
    parsed = fb.parse_resolution_set(_resolution_file(_row(), _row()), "r.json")
    assert len(parsed.rows) == 1 and parsed.skipped == Counter({"duplicate": 1})
    with pytest.raises(fb.ForecastBenchFormatError, match="conflicting duplicate"):
        fb.parse_resolution_set(_resolution_file(_row(), _row(resolved_to=0.0)), "r.json")


def test_parsing_is_deterministic() -> None:
    text = _question_file(
        _market(), _market(id="d1", source="fred", resolution_dates=["2025-11-02"])
    )
    assert fb.parse_question_set(text, "t.json") == fb.parse_question_set(text, "t.json")
