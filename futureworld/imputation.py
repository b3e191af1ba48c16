"""ForecastBench's missing-forecast rules: the 0.5 a missing or unparsed answer counts as, and the
5% rule that leaves a forecaster with too many imputed forecasts off the leaderboard.

Pure functions over forecast records (anything with `agent`, `source` and `imputed_share`, as
futureworld.evaluation.ForecastRecord); the score tables that show the verdicts live in
evaluation.py. Sources: src/resolve/_impute.py and src/leaderboard/main.py of
github.com/forecastingresearch/forecastbench.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from futureworld.sources.forecastbench import MARKET_SOURCES, SOURCE_PREFIX


class ImputedForecast(Protocol):
    """What the 5% rule reads of a forecast record."""

    @property
    def agent(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def imputed_share(self) -> float: ...


IMPUTED_P = 0.5
"""P(yes) counted for a rollout without an answer (unparsed, or a baseline with nothing to say),
so failing to answer is scored as knowing nothing, never left out: ForecastBench's default
imputation of a missing forecast (`impute_missing_forecasts`, src/resolve/_impute.py; only its
own market baselines impute the market value instead)."""


def question_forecast(samples: Sequence[float | None]) -> tuple[float, tuple[float, ...], int]:
    """(the question's forecast, every sample's p with IMPUTED_P for an unparsed one, how many
    were imputed) from a group's rollout answers (None: unparsed)."""
    if not samples:
        raise ValueError("a question forecast needs at least one rollout")
    filled = tuple(IMPUTED_P if p is None else float(p) for p in samples)
    return float(np.mean(filled)), filled, sum(p is None for p in samples)


IMPUTED_CUTOFF_PCT = 5.0
"""ForecastBench's eligibility threshold: a forecaster whose imputed forecasts are more than 5%
of a scored set (`d["imputed"].mean() * 100 > IMPUTED_CUTOFF_PCT`) is left off the leaderboard
(`IMPUTED_CUTOFF_PCT` and `get_df_info`, src/leaderboard/main.py); ForecastBench's own
baselines are not tested."""


class Eligibility(StrEnum):
    """A forecaster's standing under the 5% rule (`forecaster_eligibility`)."""

    ELIGIBLE = "eligible"
    """At most IMPUTED_CUTOFF_PCT% of its forecasts imputed in every tested subset."""
    INELIGIBLE = "ineligible"
    """Over the threshold in some subset: ForecastBench would leave it off; here it stays in
    the table, flagged, and out of the difficulty model's reference set."""
    REFERENCE = "reference"
    """A baseline (crowd, base rate, uniform): exempt, as ForecastBench runs the test only for
    models that are not its own benchmark baselines (`run_imputed_test_for_model`)."""


def forecastbench_kind(source: str) -> str | None:
    """ "market" or "dataset" for an imported ForecastBench question's source, else None
    (`get_market_mask` / `get_dataset_mask`, src/leaderboard/main.py)."""
    if not source.startswith(SOURCE_PREFIX):
        return None
    return "market" if source.removeprefix(SOURCE_PREFIX) in MARKET_SOURCES else "dataset"


def imputed_subsets(records: Sequence[ImputedForecast]) -> dict[str, list[ImputedForecast]]:
    """The subsets the 5% rule tests: every record ("all"), and, for ForecastBench questions,
    the market and the dataset ones (`get_df_info` tests the whole file, then its market and
    its dataset questions); empty subsets are left out. The records are those the caller
    tests: futureworld.leaderboard adds the markets not yet resolved (ForecastBench's file
    holds them, in its "market" mask); evaluation's score rows test the scored ones only."""
    subsets: dict[str, list[ImputedForecast]] = {"all": list(records)}
    for record in records:
        kind = forecastbench_kind(record.source)
        if kind is not None:
            subsets.setdefault(kind, []).append(record)
    return {name: members for name, members in subsets.items() if members}


def over_imputed_cutoff(records: Sequence[ImputedForecast]) -> bool:
    """True when the imputed share of these forecasts is over IMPUTED_CUTOFF_PCT (strictly, as
    ForecastBench's `over_imputed_cutoff`)."""
    share = sum(r.imputed_share for r in records) / len(records)
    return share * 100 > IMPUTED_CUTOFF_PCT


def forecaster_eligibility(
    records: Iterable[ImputedForecast],
    *,
    keys: Sequence[str] = ("agent", "policy_version"),
    reference_agents: Collection[str] = (),
) -> dict[tuple[Any, ...], Eligibility]:
    """The 5% rule per forecaster (the values of `keys`, e.g. agent and version, or also the
    round): INELIGIBLE when any of its `imputed_subsets` is over the cutoff; REFERENCE for the
    agents in `reference_agents` (baselines, which ForecastBench does not test)."""
    members: dict[tuple[Any, ...], list[ImputedForecast]] = {}
    for record in records:
        members.setdefault(tuple(getattr(record, k) for k in keys), []).append(record)
    verdicts = {}
    for forecaster, mine in members.items():
        if mine[0].agent in reference_agents:
            verdicts[forecaster] = Eligibility.REFERENCE
        elif any(over_imputed_cutoff(s) for s in imputed_subsets(mine).values()):
            verdicts[forecaster] = Eligibility.INELIGIBLE
        else:
            verdicts[forecaster] = Eligibility.ELIGIBLE
    return verdicts
