"""The ForecastBench round trip on the real fixture: the crowd's forecasts exported in
ForecastBench's submission format, re-scored from the forecast file and the resolution set
alone, give the Brier that `evaluate` reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from futureworld.sources.forecastbench import ForecastBenchFormatError
from futureworld.sources.forecastbench_export import (
    REQUIRED_FILE_KEYS,
    check_forecast_file,
    score_forecast_file,
)

RAW = Path(__file__).resolve().parents[2].parent / "shared" / "forecastbench-eval" / "raw"
QUESTIONS = RAW / "2025-10-26-llm.json"
RESOLUTIONS = RAW / "2025-10-26_resolution_set.json"


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_crowd_round_trips_through_a_forecastbench_file(db_url: str, tmp_path) -> None:
    cli(
        "import", "forecastbench", str(QUESTIONS), "--resolutions", str(RESOLUTIONS), "--db", db_url
    )
    for agent in ("crowd", "uniform"):
        cli("predict", "--agent", agent, "--as-of", "2025-10-26", "--db", db_url)
    cli("backfill", "--db", db_url)
    scores = tmp_path / "scores.json"
    cli("evaluate", "--json", str(scores), "--db", db_url)
    evaluated = json.loads(scores.read_text())
    [headline] = [h for h in evaluated["forecastbench"] if h["agent"] == "crowd"]

    out = tmp_path / "2025-10-26.FutureWorld.1.json"
    printed = cli(
        "export", "forecastbench", "--agent", "crowd", "--question-set", str(QUESTIONS),
        "--out", str(out), "--db", db_url,
    )  # fmt: skip
    assert "250 forecasts" in printed
    document = json.loads(out.read_text())
    assert set(REQUIRED_FILE_KEYS) <= set(document)
    assert document["question_set"] == "2025-10-26-llm.json"
    assert document["forecast_due_date"] == document["forecast_date"] == "2025-10-26"
    forecasts = check_forecast_file(document, out.name)
    assert all(f["resolution_date"] is None for f in forecasts)  # the crowd: markets only

    rescored = score_forecast_file(out.read_text(), RESOLUTIONS.read_text(), out.name)
    # The file holds the crowd's market forecasts: its score is the crowd's market Brier here.
    # Evaluate also counts the 977 dataset questions the crowd has no forecast of, at 0.5 (as
    # ForecastBench imputes a missing forecast), so its overall is the equal-weight mean.
    assert rescored.n == headline["n_market"] == 112
    assert math.isclose(rescored.brier, headline["brier_market"], rel_tol=1e-12)
    assert rescored.by_source["manifold"][0] == 23
    assert round(rescored.by_source["polymarket"][1], 4) == 0.0206
    assert headline["n_dataset"] == 977 and headline["brier_dataset"] == 0.25
    overall = (rescored.brier + 0.25) / 2
    assert math.isclose(headline["brier_overall"], overall, rel_tol=1e-12)
    assert math.isclose(headline["brier_index"], 100 * (1 - math.sqrt(overall)))

    # The uniform forecaster covers dataset questions too: one entry per resolution date.
    out_uniform = tmp_path / "uniform.json"
    cli(
        "export", "forecastbench", "--agent", "uniform", "--question-set", str(QUESTIONS),
        "--out", str(out_uniform), "--db", db_url,
    )  # fmt: skip
    uniform = score_forecast_file(out_uniform.read_text(), RESOLUTIONS.read_text(), "u.json")
    assert uniform.brier == 0.25 and uniform.n_market == 112 and uniform.n_dataset == 977
    dated = [f for f in json.loads(out_uniform.read_text())["forecasts"] if f["resolution_date"]]
    assert len(dated) == 1996


def test_export_refuses_an_agent_without_forecasts_and_a_bad_file(db_url: str, tmp_path) -> None:
    cli("import", "forecastbench", str(QUESTIONS), "--db", db_url)
    result = CliRunner().invoke(
        app,
        ["export", "forecastbench", "--agent", "crowd", "--question-set", str(QUESTIONS),
         "--out", str(tmp_path / "f.json"), "--db", db_url],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "no forecasts of 2025-10-26-llm.json" in " ".join(result.output.split())
    with pytest.raises(ForecastBenchFormatError, match="missing required key 'model_organization'"):
        check_forecast_file({"organization": "o", "model": "m", "forecasts": []}, "f.json")
    bad = {key: "x" for key in REQUIRED_FILE_KEYS}
    bad["forecasts"] = [{"id": "a", "source": "fred", "forecast": 0.5, "resolution_date": None}]
    with pytest.raises(ForecastBenchFormatError, match=r"forecasts\[0\]: resolution_date"):
        check_forecast_file(bad, "f.json")
