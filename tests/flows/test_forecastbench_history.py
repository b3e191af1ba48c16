"""A folder of ForecastBench rounds through `import forecastbench FOLDER`: every round, once,
one question per round for a market posed in two rounds, a bad file named while the other
rounds import; and the migration that renames questions imported before rounds existed."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import func, select
from typer.testing import CliRunner

from flows.cli import app
from storage.engine import session_scope
from storage.tables import OutcomeRow, QuestionRow

RAW = Path(__file__).resolve().parents[2].parent / "shared" / "forecastbench-eval" / "raw"
QUESTIONS = RAW / "2025-10-26-llm.json"
RESOLUTIONS = RAW / "2025-10-26_resolution_set.json"


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def later_round(folder: Path) -> None:
    """A second round two weeks later re-posing the first round's first ten markets (with a
    new freeze time and crowd value), and its resolution set."""
    questions = json.loads(QUESTIONS.read_text())
    markets = [q for q in questions["questions"] if q["resolution_dates"] == "N/A"][:10]
    for q in markets:
        q["freeze_datetime"] = "2025-10-30T00:00:00+00:00"
        q["freeze_datetime_value"] = "0.5"
    (folder / "2025-11-09-llm.json").write_text(
        json.dumps(
            {
                "forecast_due_date": "2025-11-09",
                "question_set": "2025-11-09-llm.json",
                "questions": markets,
            }
        )
    )
    resolutions = json.loads(RESOLUTIONS.read_text())["resolutions"]
    ids = {(q["source"], q["id"]) for q in markets}
    (folder / "2025-11-09_resolution_set.json").write_text(
        json.dumps(
            {
                "forecast_due_date": "2025-11-09",
                "question_set": "2025-11-09-llm.json",
                "resolutions": [r for r in resolutions if (r["source"], r["id"]) in ids],
            }
        )
    )


def counts(engine) -> tuple[int, int]:
    with session_scope(engine) as session:
        return (
            session.scalar(select(func.count()).select_from(QuestionRow)),
            session.scalar(select(func.count()).select_from(OutcomeRow)),
        )


def test_folder_of_rounds_imports_every_round_once(engine, db_url: str, tmp_path) -> None:
    folder = tmp_path / "rounds"
    folder.mkdir()
    (folder / "2025-10-26-llm.json").write_bytes(QUESTIONS.read_bytes())
    (folder / "2025-10-26_resolution_set.json").write_bytes(RESOLUTIONS.read_bytes())
    later_round(folder)
    (folder / "notes.json").write_text('{"hello": 1}')
    (folder / "broken.json").write_text("{not json")

    out = " ".join(cli("import", "forecastbench", str(folder), "--db", db_url).split())
    assert "round 2025-10-26: questions: 2246 new" in out
    assert "round 2025-11-09: questions: 10 new" in out
    assert "broken.json: not valid JSON" in out and "notes.json: neither" in out
    first = counts(engine)
    assert first[0] == 2246 + 10

    with session_scope(engine) as session:
        posed = session.execute(
            select(
                QuestionRow.external_id, QuestionRow.info_cutoff_at, QuestionRow.crowd_probability
            )
            .where(QuestionRow.extra["upstream_id"].as_string() == "K8qazyZJ3tXyuLlzkkyk")
            .order_by(QuestionRow.external_id)
        ).all()
    assert [(e, c.day, p) for e, c, p in posed] == [
        ("2025-10-26/K8qazyZJ3tXyuLlzkkyk", 16, posed[0][2]),
        ("2025-11-09/K8qazyZJ3tXyuLlzkkyk", 30, 0.5),
    ]

    out = cli("import", "forecastbench", str(folder), "--db", db_url)
    assert (
        "round 2025-11-09: questions: 0 new, 10 already stored; outcomes recorded: 0"
        in " ".join(out.split())
    )
    assert counts(engine) == first


def test_folder_without_rounds_and_folder_with_resolutions_are_refused(
    db_url: str, tmp_path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = CliRunner().invoke(app, ["import", "forecastbench", str(empty), "--db", db_url])
    assert result.exit_code == 2 and "no ForecastBench question set" in result.output
    result = CliRunner().invoke(
        app,
        ["import", "forecastbench", str(empty), "--resolutions", str(RESOLUTIONS), "--db", db_url],
    )
    assert result.exit_code == 2 and "put the resolution sets in the folder" in result.output
