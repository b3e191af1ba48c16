"""`evaluate` against ForecastBench's own resolver and leaderboard code (vendored in
tests/fixtures/forecastbench_reference) on the shared 2025-10-26 round: the same forecast file,
resolved and scored by their functions, gives the Brier per source, per kind and overall, the
imputed count and the 5% verdict that `evaluate` gives the crowd and the imported file's agent."""

from __future__ import annotations

import json
import math
import random
from datetime import date
from pathlib import Path
from typing import Any

import pandas as pd
from typer.testing import CliRunner

from flows.cli import app
from futureworld.sources.forecastbench_export import Submission, forecast_file
from tests.fixtures.forecastbench_reference import leaderboard as fb
from tests.fixtures.forecastbench_reference._upstream import resolution
from tests.fixtures.forecastbench_reference.resolve_impute import impute_missing_forecasts
from tests.fixtures.forecastbench_reference.resolve_prepare import (
    check_and_prepare_forecast_file,
    set_resolution_dates,
)

RAW = Path(__file__).resolve().parents[2].parent / "shared" / "forecastbench-eval" / "raw"
QUESTIONS = RAW / "2025-10-26-llm.json"
RESOLUTIONS = RAW / "2025-10-26_resolution_set.json"
DUE = "2025-10-26"
TOL = 1e-12
"""Both sides sum the same squared errors in another order: they agree to rounding."""

# ForecastBench exempts its own baselines from the 5% rule, as evaluate exempts ours; the crowd
# (the market value) plays their Naive Forecaster.
THEIR_BASELINE = {"organization": "ForecastBench", "model_organization": "ForecastBench",
                  "model": "Naive Forecaster"}  # fmt: skip


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def forecastbench_resolve(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The processed forecast file ForecastBench's resolver writes for `document`: the steps of
    src/orchestration/func_resolve/main.py's driver (read, prepare, join to the resolutions,
    impute), with the published resolution set in the columns `resolve_all` gives it."""
    published = json.loads(RESOLUTIONS.read_text())
    resolutions = resolution.make_columns_hashable(pd.DataFrame(published["resolutions"]))
    resolutions["resolution_date"] = pd.to_datetime(resolutions["resolution_date"])
    resolutions["forecast_due_date"] = pd.to_datetime(published["forecast_due_date"])
    df = pd.DataFrame(document["forecasts"]).drop(labels="reasoning", axis=1, errors="ignore")
    if "direction" not in df:
        df["direction"] = None
    due = document["question_set"][:10]
    df = check_and_prepare_forecast_file(
        df=df, forecast_due_date=due, organization=document["organization"]
    )
    df = set_resolution_dates(df=df, df_question_resolutions=resolutions)
    df = impute_missing_forecasts(
        df=df,
        organization=document["organization"],
        model_organization=document["model_organization"],
        model=document["model"],
    )
    return json.loads(df.to_json(orient="records", date_format="iso"))


def forecastbench_entry(
    processed: list[dict[str, Any]], who: dict[str, str]
) -> pd.DataFrame | None:
    """Their leaderboard's reading of a processed file (`get_df_info`): the scored rows, or
    None when the 5% rule leaves the file out."""
    identity = {**who, "model_run_key": None, "forecast_variant_key": None}
    return fb.get_df_info(df=pd.DataFrame(processed), org_and_model=identity,
                          forecast_due_date=DUE)  # fmt: skip


def forecastbench_scores(entry: pd.DataFrame) -> dict[str, Any]:
    """Their `score_models` with the Brier score: per kind and overall, plus per source."""
    board, _ = fb.score_models(
        df=fb.combine_forecasting_rounds([entry]),
        scoring_funcs=[fb.brier_score],
        market_question_adjustment=fb.MarketQuestionAdjustment.TWO_WAY_FIXED_EFFECTS,
    )
    [row] = board.to_dict("records")
    per_row = fb.brier_score(entry)
    by_source = per_row.groupby("source")["brier_score"].agg(["count", "mean"])
    return {
        **row,
        "by_source": {s: (int(n), float(b)) for s, (n, b) in by_source.iterrows()},
        "imputed": int(entry["imputed"].sum()),
    }


def assert_same_scores(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert (ours["n_market"], ours["n_dataset"]) == (theirs["n_market"], theirs["n_dataset"])
    for kind in ("market", "dataset", "overall"):
        assert math.isclose(ours[f"brier_{kind}"], theirs[f"brier_score_{kind}"], abs_tol=TOL)
    assert ours["imputed"] == theirs["imputed"]


def assert_same_sources(ours: dict[str, tuple[int, float]], theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for source, (n, brier) in ours.items():
        assert theirs[source][0] == n and math.isclose(theirs[source][1], brier, abs_tol=TOL)


def our_sources(evaluated: dict[str, Any], agent: str) -> dict[str, tuple[int, float]]:
    return {
        r["source"].removeprefix("forecastbench:"): (r["n"], r["brier"])
        for r in evaluated["rows"]
        if r["agent"] == agent and r["source"] is not None
    }


def full_file(market_p: dict[tuple[str, str], float] | None = None) -> dict[str, Any]:
    """A submission of every entry, written by our exporter's `forecast_file`: `market_p` for
    the market questions (else seeded forecasts), and seeded forecasts of every dataset
    question at every resolution date."""
    question_set = json.loads(QUESTIONS.read_text())
    rng = random.Random(25)
    forecasts: dict[tuple[str, str, date | None], float] = {}
    for record in question_set["questions"]:
        source, upstream_id = record["source"], record["id"]
        if record["resolution_dates"] == "N/A":
            p = market_p[(source, upstream_id)] if market_p else round(rng.uniform(0.02, 0.98), 3)
            forecasts[(source, upstream_id, None)] = p
        else:
            for day in record["resolution_dates"]:
                key = (source, upstream_id, date.fromisoformat(day[:10]))
                forecasts[key] = round(rng.uniform(0.02, 0.98), 3)
    who = Submission(organization="Outside", model="seeded", model_organization="Outside")
    return forecast_file(question_set, forecasts, who)


def without(document: dict[str, Any], drop: set[tuple[str, str, str | None]]) -> dict[str, Any]:
    kept = [f for f in document["forecasts"]
            if (f["source"], f["id"], f["resolution_date"]) not in drop]  # fmt: skip
    assert len(kept) == len(document["forecasts"]) - len(drop)
    return {**document, "forecasts": kept}


def entry_keys(document: dict[str, Any]) -> dict[str, list[tuple[str, str, str | None]]]:
    """The file's entries in file order, by what the resolution set says of them."""
    rows = json.loads(RESOLUTIONS.read_text())["resolutions"]
    status = {(r["source"], r["id"], None if r["source"] in fb.question_curation.MARKET_SOURCES
               else r["resolution_date"]): r["resolved"] for r in rows}  # fmt: skip
    keys: dict[str, list[tuple[str, str, str | None]]] = {
        "resolved market": [], "open market": [], "resolved dataset": []
    }  # fmt: skip
    for f in document["forecasts"]:
        key = (f["source"], f["id"], f["resolution_date"])
        if key in status:
            market = key[2] is None
            name = ("resolved " if status[key] else "open ") + ("market" if market else "dataset")
            keys[name].append(key)
    return keys


def import_and_evaluate(db_url: str, tmp_path: Path, files: dict[str, dict]) -> dict[str, Any]:
    for agent, document in files.items():
        path = tmp_path / f"{agent}.json"
        path.write_text(json.dumps(document))
        cli("import", "forecasts", str(path), "--agent", agent, "--db", db_url)
    scores = tmp_path / "scores.json"
    cli("evaluate", "--json", str(scores), "--db", db_url)
    return json.loads(scores.read_text())


def crowd_file(db_url: str, tmp_path: Path) -> dict[str, Any]:
    cli(
        "import", "forecastbench", str(QUESTIONS), "--resolutions", str(RESOLUTIONS), "--db", db_url
    )
    cli("predict", "--agent", "crowd", "--as-of", DUE, "--db", db_url)
    out = tmp_path / f"{DUE}.FutureWorld.1.json"
    cli(
        "export", "forecastbench", "--agent", "crowd", "--question-set", str(QUESTIONS),
        "--out", str(out), "--db", db_url,
    )  # fmt: skip
    return json.loads(out.read_text())


def test_evaluate_scores_a_forecast_file_as_forecastbenchs_resolver_does(
    db_url: str, tmp_path: Path
) -> None:
    crowd = crowd_file(db_url, tmp_path)
    full = full_file({(f["source"], f["id"]): f["forecast"] for f in crowd["forecasts"]})
    evaluated = import_and_evaluate(db_url, tmp_path, {"outside": full})
    headline = {h["agent"]: h for h in evaluated["forecastbench"]}

    # (a) The crowd's exported file, resolved by their code: 250 market entries joined to the
    # 1,208 resolution rows, the 977 dataset rows imputed at 0.5, 112 resolved markets scored.
    processed = forecastbench_resolve(crowd)
    assert len(processed) == 1208
    assert sum(r["imputed"] for r in processed) == 977
    entry = forecastbench_entry(processed, THEIR_BASELINE)
    assert entry is not None
    theirs = forecastbench_scores(entry)
    ours = headline["crowd"]
    assert_same_scores(ours, theirs)
    assert round(theirs["brier_score_market"], 4) == 0.0435
    assert theirs["brier_score_dataset"] == 0.25
    assert round(theirs["brier_score_overall"], 4) == 0.1468
    assert ours["eligibility"] == "reference"
    assert_same_sources(our_sources(evaluated, "crowd"), theirs["by_source"])
    # An outside file imputed that much is left off their leaderboard: they run the 5% rule
    # for every file but their own baselines'.
    external = {k: crowd[k] for k in ("organization", "model", "model_organization")}
    assert forecastbench_entry(processed, external) is None

    # (b) A file of every entry (the crowd's markets), imported as an outside agent: their
    # resolver and leaderboard take it whole (nothing imputed) and give the scores evaluate
    # gives the imported agent.
    processed = forecastbench_resolve(full)
    assert len(processed) == 1208 and not any(r["imputed"] for r in processed)
    who = {k: full[k] for k in ("organization", "model", "model_organization")}
    entry = forecastbench_entry(processed, who)
    assert entry is not None
    theirs = forecastbench_scores(entry)
    ours = headline["outside"]
    assert_same_scores(ours, theirs)
    assert (theirs["n_market"], theirs["n_dataset"], theirs["imputed"]) == (112, 977, 0)
    assert ours["eligibility"] == "eligible"
    assert_same_sources(our_sources(evaluated, "outside"), theirs["by_source"])
    # the crowd's markets are the same forecasts in both files
    assert math.isclose(ours["brier_market"], headline["crowd"]["brier_market"], abs_tol=TOL)


def test_imputation_and_the_5pct_rule_agree_with_forecastbenchs_code(
    db_url: str, tmp_path: Path
) -> None:
    cli(
        "import", "forecastbench", str(QUESTIONS), "--resolutions", str(RESOLUTIONS), "--db", db_url
    )
    full = full_file()
    keys = entry_keys(full)
    assert {k: len(v) for k, v in keys.items()} == {
        "resolved market": 112, "open market": 119, "resolved dataset": 977
    }  # fmt: skip
    # Under: 53 of 1,089 scored rows imputed (theirs: of 1,208), 5 of 112 (theirs: of 231)
    # markets, 48 of 977 dataset rows (4.9%). Over: 49 of 977 dataset rows (5.02%).
    files = {
        "under": without(full, {*keys["resolved market"][:5], *keys["resolved dataset"][:48]}),
        "over": without(full, set(keys["resolved dataset"][-49:])),
        # The rule tests every market of the file, resolved or not: 6 of 231 is under (6 of the
        # 112 scored would be over), and 12 of the open ones, never scored, are over.
        "sparse": without(full, set(keys["resolved market"][:6])),
        "open": without(full, set(keys["open market"][:12])),
    }
    evaluated = import_and_evaluate(db_url, tmp_path, files)
    headline = {h["agent"]: h for h in evaluated["forecastbench"]}
    who = {k: full[k] for k in ("organization", "model", "model_organization")}

    verdicts = {}
    for agent, document in files.items():
        processed = forecastbench_resolve(document)
        # their resolver's output scored whatever the verdict (the rows their leaderboard reads)
        theirs = forecastbench_scores(forecastbench_entry(processed, THEIR_BASELINE))
        assert_same_scores(headline[agent], theirs)
        verdicts[agent] = (
            headline[agent]["eligibility"],
            forecastbench_entry(processed, who) is not None,
            sum(r["imputed"] for r in processed),
        )
    assert verdicts == {
        "under": ("eligible", True, 53),
        "over": ("ineligible", False, 49),
        "sparse": ("eligible", True, 6),
        "open": ("ineligible", False, 12),
    }
    # the imputed count is of the scored rows, as on their leaderboard
    assert headline["under"]["imputed"] == 53 and headline["open"]["imputed"] == 0
    assert math.isclose(headline["over"]["imputed_share"], 49 / 1089, abs_tol=TOL)
