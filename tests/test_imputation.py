"""ForecastBench's 5% rule (src/leaderboard/main.py, IMPUTED_CUTOFF_PCT and get_df_info) on hand
counted fixtures: the share is tested over all forecasts, then over the market and the dataset
ones, strictly above 5%, and baselines are exempt."""

from __future__ import annotations

import pytest

from futureworld.evaluation import ForecastRecord, score_forecasts, score_table_markdown
from futureworld.imputation import (
    IMPUTED_CUTOFF_PCT,
    Eligibility,
    forecaster_eligibility,
    over_imputed_cutoff,
)


def _forecast(agent: str, source: str, *, missing: bool = False, **kw: object) -> ForecastRecord:
    fields: dict[str, object] = {
        "agent": agent,
        "policy_version": 1,
        "source": source,
        "domain": "d",
        "p_yes": 0.5 if missing else 0.7,
        "y": 1.0,
        "imputed": int(missing),
    }
    fields.update(kw)
    return ForecastRecord(**fields)


def test_the_cutoff_is_five_percent_and_strict() -> None:
    assert IMPUTED_CUTOFF_PCT == 5
    one_in_20 = [_forecast("a", "manifold", missing=i == 0) for i in range(20)]
    two_in_39 = [_forecast("a", "manifold", missing=i < 2) for i in range(39)]
    assert not over_imputed_cutoff(one_in_20)  # 5.0% is not over 5%
    assert over_imputed_cutoff(two_in_39)  # 5.13%


def test_a_subset_over_the_cutoff_makes_the_forecaster_ineligible() -> None:
    # 20 market and 10 dataset forecasts, one dataset one missing: 1/30 = 3.3% overall, but
    # 1/10 = 10% of the dataset questions, which ForecastBench tests on their own.
    records = [_forecast("a", "forecastbench:manifold") for _ in range(20)]
    records += [_forecast("a", "forecastbench:fred", missing=i == 0) for i in range(10)]
    # the same forecasts on questions of our own sources are tested only overall
    plain = [_forecast("b", "manifold") for _ in range(20)]
    plain += [_forecast("b", "fred", missing=i == 0) for i in range(10)]
    verdicts = forecaster_eligibility(records + plain)
    assert verdicts == {("a", 1): Eligibility.INELIGIBLE, ("b", 1): Eligibility.ELIGIBLE}


def test_a_partly_unparsed_group_counts_its_unparsed_share() -> None:
    # G = 4 with one unparsed rollout: a quarter of that question's forecast is imputation.
    partial = _forecast("a", "manifold", sample_p=(0.9, 0.9, 0.9, 0.5), p_yes=0.8, imputed=1)
    assert partial.imputed_share == 0.25
    records = [partial] + [_forecast("a", "manifold") for _ in range(4)]
    assert not over_imputed_cutoff(records)  # 0.25 / 5 = 5%: not over
    assert not over_imputed_cutoff([*records, _forecast("a", "manifold")])  # 4.2%
    assert over_imputed_cutoff(records[:4])  # 0.25 / 4 = 6.25%


def test_score_rows_flag_an_ineligible_forecaster_and_keep_it() -> None:
    over = [_forecast("llm", "manifold", missing=i < 3) for i in range(10)]  # 30% imputed
    crowd = [_forecast("crowd", "manifold", missing=i < 9) for i in range(10)]  # 90%, exempt
    clean = [_forecast("clean", "manifold") for _ in range(10)]
    rows = score_forecasts(over + crowd + clean, n_bootstrap=0, reference_agents={"crowd"})
    got = {(r.agent, r.source): (r.eligibility, r.imputed, r.imputed_share) for r in rows}
    assert got[("llm", "manifold")] == (Eligibility.INELIGIBLE, 3, pytest.approx(0.3))
    assert got[("llm", None)] == (Eligibility.INELIGIBLE, 3, pytest.approx(0.3))
    assert got[("crowd", None)] == (Eligibility.REFERENCE, 9, pytest.approx(0.9))
    assert got[("clean", None)] == (Eligibility.ELIGIBLE, 0, 0.0)
    llm = next(r for r in rows if r.agent == "llm" and r.source is None)
    assert llm.brier == pytest.approx((3 * 0.25 + 7 * 0.09) / 10)  # scored, not dropped
    assert llm.as_dict()["eligibility"] == "ineligible"
    table = score_table_markdown(rows)
    assert "| llm | 1 | all | 10 |" in table and "| 3 | ineligible |" in table


def test_rows_pooling_forecasters_have_no_verdict_and_rounds_are_tested_apart() -> None:
    records = [_forecast("a", "manifold", missing=i == 0, round=1) for i in range(10)]
    records += [_forecast("a", "manifold", round=2) for _ in range(10)]
    by_round = score_forecasts(records, by=("agent", "policy_version", "round"), n_bootstrap=0)
    assert [(r.round, r.eligibility) for r in by_round] == [
        (1, Eligibility.INELIGIBLE),
        (2, Eligibility.ELIGIBLE),
    ]
    (pooled,) = score_forecasts(records, by=("source",), include_overall=False, n_bootstrap=0)
    assert pooled.eligibility is None and pooled.imputed == 1
