"""`futureworld import forecasts`: an outside forecaster's file becomes a read-only agent that
evaluate scores beside the project's agents; bad rows are reported by line, re-importing is
idempotent, and a revised file registers the agent's next version."""

from __future__ import annotations

import json
import math
from datetime import timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.stages.lineage import LineageError
from flows.stages.predicting import predict
from flows.stages.promotion import gate_version
from flows.stages.training import TrainOptions, replay_and_train
from futureworld.domain import BackendKind, Question
from storage.engine import make_engine, session_scope
from storage.repositories.agents import get_agent, list_policy_versions
from storage.repositories.questions import upsert_questions
from storage.repositories.rollouts import forecasts_of
from tests.flows.conftest import CUTOFF, make_context, resolve_every_question

RAW = Path(__file__).resolve().parents[2].parent / "shared" / "forecastbench-eval" / "raw"
QUESTIONS = RAW / "2025-10-26-llm.json"
RESOLUTIONS = RAW / "2025-10-26_resolution_set.json"


def cli(*args: str, code: int = 0) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == code, result.output
    return " ".join(result.output.split())


def store_questions(db_url: str) -> None:
    """sim/q0 … sim/q3, resolved NO, YES, NO, YES three days after CUTOFF."""
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="sim",
                    external_id=f"q{i}",
                    title=f"Will event {i} happen?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                )
                for i in range(4)
            ],
        )
    resolve_every_question(engine)
    engine.dispose()


def stored_forecasts(db_url: str, agent: str) -> list[tuple[int, int, float | None]]:
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        found = get_agent(session, agent)
        assert found.backend is BackendKind.EXTERNAL
        rows = [(f.policy_version, f.question_id, f.p_yes) for f in forecasts_of(session, found.id)]
    engine.dispose()
    return sorted(rows)


HEADER = "source,question_id,probability,forecast_at\n"
FIRST = HEADER + (
    "sim,q0,0.2,2026-05-01T12:00:00Z\n"  # 2: good (q0 resolved NO)
    "sim,q1,0.7,2026-05-01\n"  # 3: good (q1 resolved YES)
    "sim,q1,0.6,2026-05-01\n"  # 4: duplicate
    "sim,q9,0.5,2026-05-01\n"  # 5: unknown question
    "sim,q2,1.2,2026-05-01\n"  # 6: outside [0, 1]
    "sim,q2,0.4,soon\n"  # 7: unparseable time
    "sim,q3,,2026-05-01\n"  # 8: missing probability
    "sim,q3,0.9,2026-05-10\n"  # 9: after the outcome was revealed (2026-05-04)
)


def test_a_file_with_bad_rows_loads_the_good_ones_and_reimports_idempotently(
    db_url: str, tmp_path: Path
) -> None:
    store_questions(db_url)
    path = tmp_path / "outside.csv"
    path.write_text(FIRST)
    printed = cli("import", "forecasts", str(path), "--agent", "outside", "--db", db_url)
    assert "agent outside v0: 2 loaded, 0 updated, 0 unchanged; rows: 8, bad: 6" in printed
    for line, problem in [
        (4, "duplicate: sim/q1 is forecast on line 3"),
        (5, "unknown question sim/q9"),
        (6, "probability: 1.2 is outside [0, 1]"),
        (7, "forecast_at: 'soon' is not an ISO 8601 time or date"),
        (8, "missing field probability"),
        (9, "forecast time 2026-05-10T00:00:00+00:00 is not before the outcome of sim/q3"),
    ]:
        assert f"bad row: line {line}: {problem}" in printed
    first = stored_forecasts(db_url, "outside")
    assert [(v, p) for v, _, p in first] == [(0, 0.2), (0, 0.7)]
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        made = [f.as_of for f in forecasts_of(session, get_agent(session, "outside").id)]
    engine.dispose()
    # the file's forecast times are the forecasts' as-of (a date alone is 00:00 UTC)
    assert made == [CUTOFF + timedelta(hours=12), CUTOFF]

    again = cli("import", "forecasts", str(path), "--agent", "outside", "--db", db_url)
    assert "agent outside v0: 0 loaded, 0 updated, 2 unchanged" in again
    assert stored_forecasts(db_url, "outside") == first

    # A file that only adds (another batch of questions) extends the same version.
    more = tmp_path / "more.jsonl"
    row = {"source": "sim", "question_id": "q2", "probability": 0.1, "forecast_at": "2026-05-02"}
    more.write_text(json.dumps(row) + "\n")
    added = cli("import", "forecasts", str(more), "--agent", "outside", "--db", db_url)
    assert "agent outside v0: 1 loaded, 0 updated, 0 unchanged; rows: 1, bad: 0" in added

    # A revised forecast registers v1: the file's forecasts and v0's others, each once.
    revised = tmp_path / "outside-revised.csv"
    revised.write_text(HEADER + "sim,q0,0.4,2026-05-01T12:00:00Z\nsim,q3,0.5,2026-05-02\n")
    printed = cli("import", "forecasts", str(revised), "--agent", "outside", "--db", db_url)
    assert "agent outside v1: 1 loaded, 1 updated, 0 unchanged, 2 carried over" in printed
    by_version = stored_forecasts(db_url, "outside")
    assert [(v, p) for v, _, p in by_version if v == 1] == [(1, 0.4), (1, 0.7), (1, 0.1), (1, 0.5)]
    assert len({q for v, q, _ in by_version if v == 1}) == 4
    assert "0 loaded, 0 updated, 2 unchanged" in cli(
        "import", "forecasts", str(revised), "--agent", "outside", "--db", db_url
    )
    assert len(stored_forecasts(db_url, "outside")) == 7

    # evaluate lists it beside the project's agents, each version scored on its own forecasts.
    cli("predict", "--agent", "uniform", "--as-of", "2026-05-01", "--db", db_url)
    scores = tmp_path / "scores.json"
    cli("evaluate", "--json", str(scores), "--db", db_url)
    rows = {
        (r["agent"], r["policy_version"]): r
        for r in json.loads(scores.read_text())["rows"]
        if r["source"] is None
    }
    assert set(rows) == {("outside", 0), ("outside", 1), ("uniform", 0)}
    assert rows[("uniform", 0)]["n"] == 4 and rows[("uniform", 0)]["brier"] == 0.25
    # v0: q0 0.2 (NO), q1 0.7 (YES), q2 0.1 (NO); v1: q0 0.4, q1 0.7, q2 0.1, q3 0.5 (YES)
    assert rows[("outside", 0)]["n"] == 3
    assert math.isclose(rows[("outside", 0)]["brier"], (0.04 + 0.09 + 0.01) / 3)
    assert rows[("outside", 1)]["n"] == 4
    assert math.isclose(rows[("outside", 1)]["brier"], (0.16 + 0.09 + 0.01 + 0.25) / 4)


def test_an_outside_agent_is_never_trained_gated_or_mixed_with_another(
    db_url: str, tmp_path: Path
) -> None:
    store_questions(db_url)
    path = tmp_path / "outside.csv"
    path.write_text(HEADER + "sim,q0,0.2,2026-05-01\n")
    cli("import", "forecasts", str(path), "--agent", "outside", "--db", db_url)
    engine = make_engine(db_url)
    ctx = make_context(engine, tmp_path)
    with pytest.raises(LineageError, match="has no policy to train"):
        replay_and_train(ctx, "outside", TrainOptions())
    with pytest.raises(ValueError, match="no versions to gate"):
        gate_version(ctx, "outside", 0)
    later = make_context(engine, tmp_path, as_of=CUTOFF + timedelta(days=1))
    report = predict(later, "outside", samples=4)  # the daily cycle predicts every agent
    assert (report.questions, report.rollouts) == (0, 0)
    with session_scope(engine) as session:
        [version] = list_policy_versions(session, get_agent(session, "outside").id)
    engine.dispose()
    assert version.version == 0

    for agent, problem in [("uniform", "is a built-in baseline's"), ("crowd", "baseline's")]:
        printed = cli("import", "forecasts", str(path), "--agent", agent, "--db", db_url, code=2)
        assert problem in printed
    cli("agent", "add", "mine", "--model", "crowd", "--backend", "baseline", "--db", db_url)
    printed = cli("import", "forecasts", str(path), "--agent", "mine", "--db", db_url, code=2)
    assert "agent 'mine' is a baseline agent" in printed
    printed = cli(
        "agent", "add", "x", "--model", "m", "--backend", "external", "--db", db_url, code=2
    )
    assert "import forecasts" in printed


def test_a_file_that_cannot_be_read_or_loads_nothing_exits_2(db_url: str, tmp_path: Path) -> None:
    store_questions(db_url)
    broken = tmp_path / "broken.json"
    broken.write_text('{"organization": "o", "forecasts": [')
    assert "import failed: broken.json: invalid JSON" in cli(
        "import", "forecasts", str(broken), "--db", db_url, code=2
    )
    no_header = tmp_path / "rows.csv"
    no_header.write_text("q0,0.5\n")
    assert "the CSV header lacks" in cli(
        "import", "forecasts", str(no_header), "--db", db_url, code=2
    )
    wrong_format = tmp_path / "rows.txt"
    wrong_format.write_text(HEADER + "sim,q0,0.5,2026-05-01\n")
    printed = cli(
        "import", "forecasts", str(wrong_format), "--format", "forecastbench", "--db", db_url,
        code=2,
    )  # fmt: skip
    assert "not a ForecastBench file" in printed
    assert "--format xml" in cli(
        "import", "forecasts", str(wrong_format), "--format", "xml", "--db", db_url, code=2
    )
    all_bad = tmp_path / "all-bad.csv"
    all_bad.write_text(HEADER + "sim,q9,0.5,2026-05-01\n")
    printed = cli("import", "forecasts", str(all_bad), "--db", db_url, code=2)
    assert "bad row: line 2: unknown question sim/q9" in printed
    assert "no forecast loaded" in printed
    engine = make_engine(db_url)
    with session_scope(engine) as session, pytest.raises(LookupError):
        get_agent(session, "all-bad")  # nothing was registered
    engine.dispose()
    # the format option reads a file whatever its name
    cli("import", "forecasts", str(wrong_format), "--format", "csv", "--db", db_url)
    assert [p for _, _, p in stored_forecasts(db_url, "rows")] == [0.5]


def test_the_crowd_exported_and_reimported_scores_exactly_the_crowds_brier(
    db_url: str, tmp_path: Path
) -> None:
    cli(
        "import", "forecastbench", str(QUESTIONS), "--resolutions", str(RESOLUTIONS), "--db", db_url
    )
    cli("predict", "--agent", "crowd", "--as-of", "2025-10-26", "--db", db_url)
    exported = tmp_path / "2025-10-26.FutureWorld.1.json"
    cli(
        "export", "forecastbench", "--agent", "crowd", "--question-set", str(QUESTIONS),
        "--out", str(exported), "--db", db_url,
    )  # fmt: skip
    printed = cli("import", "forecasts", str(exported), "--db", db_url)
    assert "agent FutureWorld-crowd-v0 v0: 250 loaded, 0 updated, 0 unchanged" in printed
    assert "rows: 250, bad: 0" in printed
    again = cli("import", "forecasts", str(exported), "--db", db_url)
    assert "0 loaded, 0 updated, 250 unchanged" in again

    scores = tmp_path / "scores.json"
    cli("evaluate", "--json", str(scores), "--db", db_url)
    evaluated = json.loads(scores.read_text())
    headlines = {h["agent"]: h for h in evaluated["forecastbench"]}
    crowd, outside = headlines["crowd"], headlines["FutureWorld-crowd-v0"]
    assert outside["n_market"] == crowd["n_market"] == 112
    assert outside["brier_market"] == crowd["brier_market"]
    assert outside["brier_overall"] == crowd["brier_overall"]
    rows = {(r["agent"], r["source"]): r for r in evaluated["rows"]}
    markets = [s for a, s in rows if a == "FutureWorld-crowd-v0" and s is not None]
    assert sorted(markets) == [
        "forecastbench:infer",
        "forecastbench:manifold",
        "forecastbench:metaculus",
        "forecastbench:polymarket",
    ]
    for source in markets:
        mine, theirs = rows[("FutureWorld-crowd-v0", source)], rows[("crowd", source)]
        assert mine["n"] == theirs["n"] and mine["brier"] == theirs["brier"]
