"""ForecastBench's leaderboard scores on imported ForecastBench questions: the Brier on market and
on dataset questions, their equal-weight mean, the difficulty-adjusted Brier from a two-way
fixed-effects model, and the Brier Index of the rescaled difficulty-adjusted Brier.

Follows src/leaderboard/main.py of github.com/forecastingresearch/forecastbench (`get_df_info`,
`score_models`, `two_way_fixed_effects`, `rescale_difficulty_adjusted_brier`,
`apply_brier_index_transform`; the baseline leaderboard, whose market questions are adjusted by
the fixed-effects model too). Pure: the records come from the caller; the 5% rule is
futureworld.imputation's.

Decisions, checked against that code:
- A question is a question of one round: a market question, or a dataset question at one
  resolution date (`question_pk` = due date, source, id and, for a dataset question, the
  horizon). The importer already makes one question per (dataset question, resolution date),
  each paired with that date's outcome, as `set_resolution_dates` (src/resolve/_prepare.py)
  joins forecasts to resolutions on (id, source, resolution_date); unresolved horizons have
  no outcome and are not scored, as `resolve_all` drops them. The round is the due date that
  starts the question's external id.
- A forecaster (agent, version) active in a round that has no forecast of one of the round's
  scored questions gets IMPUTED_P for it, counted as imputed: ForecastBench left-joins the
  resolutions to a forecast file and imputes what is missing. The round's questions are those
  some forecaster in the records forecast (the records hold no question set).
- The 5% rule also counts the round's market questions still open (`open_markets`, each
  forecaster's forecast or its absence), as `get_df_info` tests every market row of the file,
  resolved or not; they are not scored.
- Market and dataset questions are scored apart: each kind's score is the mean over its rows
  (every horizon a row), and overall = (dataset + market) / 2, None when either is missing
  (pandas gives NaN).
- The fixed-effects model is fitted per kind on the reference set: every forecaster present
  except those ineligible in a round (their round is left out, as ForecastBench ignores that
  file) and constant forecasters, whose forecasts of the kind are all 0, all 0.5 or all 1
  (ForecastBench drops Always 0, Always 1, Always 0.5 and its Imputed Forecaster, 0.5 on every
  dataset question), unless only constant forecasters forecast the kind (then every question is
  equally hard and each score is its Brier). Unlike ForecastBench no release-date or
  external-submission filter applies, and our crowd stays in (ForecastBench drops its Imputed
  Forecaster, the market value, because its Naive Forecaster already carries the market).
- Rescaling: ForecastBench shifts each score so that Always 0.5 scores 0.25; Always 0.5 has
  Brier 0.25 on every question, so the shift is the mean question effect over the kind's
  questions and needs no Always 0.5 in the records.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from futureworld.evaluation import ForecastRecord
from futureworld.imputation import (
    IMPUTED_P,
    Eligibility,
    forecastbench_kind,
    forecaster_eligibility,
)

KINDS = ("market", "dataset")
ALWAYS_HALF_BRIER = 0.25
"""The Brier of forecasting 0.5: the rescaled score of Always 0.5 on every kind."""

Forecaster = tuple[str, int | None]
"""(agent, policy version)."""


def two_way_fixed_effects(
    observations: Sequence[tuple[Hashable, Hashable, float]],
) -> tuple[dict[Hashable, float], dict[Hashable, float]]:
    """Least-squares fit of brier_ij = a_i + b_j + u_ij over (forecaster i, question j, brier_ij)
    observations: (a per forecaster, b per question). ForecastBench fits the same model
    (`pf.feols("brier_score ~ 1 | question_pk + model_pk")`, `two_way_fixed_effects`).

    Solved exactly through the normal equations with b eliminated, C the (F, Q) matrix of
    observation counts, n_i, n_j its row and column sums, s_i, s_j the sums of brier:
        (diag(n_i) − C diag(n_j)⁻¹ Cᵀ) a = s_i − C diag(n_j)⁻¹ s_j,   b = (s_j − Cᵀ a) / n_j.
    The model fixes a and b only up to a constant moved from one to the other (the minimum-norm
    a is taken); a forecaster's mean of brier_ij − b_j moves with it, and the rescaling in
    `forecastbench_leaderboard` cancels it. Raises ValueError when forecasters and questions do
    not form one connected design (then no common difficulty scale exists).
    """
    if not observations:
        raise ValueError("the fixed-effects model needs at least one observation")
    forecasters = sorted({o[0] for o in observations}, key=repr)
    questions = sorted({o[1] for o in observations}, key=repr)
    fi = {f: k for k, f in enumerate(forecasters)}
    qj = {q: k for k, q in enumerate(questions)}
    rows = np.array([fi[o[0]] for o in observations])
    cols = np.array([qj[o[1]] for o in observations])
    y = np.array([o[2] for o in observations], dtype=np.float64)
    counts = np.zeros((len(forecasters), len(questions)))
    np.add.at(counts, (rows, cols), 1.0)
    s_f = np.bincount(rows, weights=y, minlength=len(forecasters))
    s_q = np.bincount(cols, weights=y, minlength=len(questions))
    n_q = counts.sum(axis=0)
    reduced = np.diag(counts.sum(axis=1)) - (counts / n_q) @ counts.T
    if np.linalg.matrix_rank(reduced) < len(forecasters) - 1:
        raise ValueError("forecasters and questions are not connected: no common difficulty")
    a = np.linalg.lstsq(reduced, s_f - (counts / n_q) @ s_q, rcond=None)[0]
    b = (s_q - counts.T @ a) / n_q
    return (
        {f: float(a[k]) for f, k in fi.items()},
        {q: float(b[k]) for q, k in qj.items()},
    )


@dataclass(frozen=True, kw_only=True)
class ForecastBenchRow:
    """ForecastBench's leaderboard numbers of one agent and version on imported questions."""

    agent: str
    policy_version: int | None
    eligibility: Eligibility
    """INELIGIBLE when any round is over the 5% rule (`ineligible_rounds`); still scored here."""
    ineligible_rounds: tuple[str, ...]
    imputed: float
    """Forecasts supplied by imputation (missing, unparsed) over its market and dataset rows."""
    imputed_share: float
    n_market: int
    n_dataset: int
    brier_market: float | None
    brier_dataset: float | None
    brier_overall: float | None
    """(brier_dataset + brier_market) / 2, None unless both kinds are scored."""
    difficulty_adjusted_market: float | None
    """Mean of brier_ij − b_j over its rows plus the kind's mean b_j (Always 0.5 → 0.25);
    None when the reference set leaves a question of the kind without an effect."""
    difficulty_adjusted_dataset: float | None
    difficulty_adjusted_overall: float | None
    brier_index_market: float | None
    """100 · (1 − √difficulty_adjusted_market): ForecastBench's Brier Index."""
    brier_index_dataset: float | None
    brier_index: float | None
    """ForecastBench's Brier Index: 100 · (1 − √difficulty_adjusted_overall)."""

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["eligibility"] = str(self.eligibility)
        out["ineligible_rounds"] = list(self.ineligible_rounds)
        return out


@dataclass(frozen=True, kw_only=True)
class ForecastBenchLeaderboard:
    rows: list[ForecastBenchRow]
    reference_set: dict[str, tuple[str, ...]]
    """Per kind, the forecasters ("agent vN") whose forecasts estimated the question effects."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "rows": [r.as_dict() for r in self.rows],
            "reference_set": {k: list(v) for k, v in self.reference_set.items()},
        }


def forecaster_label(forecaster: Forecaster) -> str:
    return f"{forecaster[0]} v{forecaster[1]}"


def question_round(record: ForecastRecord) -> str:
    """The ForecastBench round (forecast due date) of an imported question: its external id's
    prefix (futureworld.sources.forecastbench.round_external_id)."""
    if record.question is None:
        raise ValueError(f"a ForecastBench forecast of {record.agent} has no question id")
    return record.question.split("/", 1)[0]


def _with_missing_imputed(records: list[ForecastRecord]) -> list[ForecastRecord]:
    """The records plus one IMPUTED_P record for each question of a round that a forecaster
    active in that round did not forecast (ForecastBench's left join, then imputation)."""
    questions: dict[str, dict[tuple[str, str | None], ForecastRecord]] = {}
    seen: dict[tuple[Forecaster, str], set[tuple[str, str | None]]] = {}
    for r in records:
        key = (r.source, r.question)
        questions.setdefault(question_round(r), {}).setdefault(key, r)
        seen.setdefault(((r.agent, r.policy_version), question_round(r)), set()).add(key)
    out = list(records)
    for ((agent, version), round_), keys in sorted(seen.items(), key=repr):
        for key, example in questions[round_].items():
            if key not in keys:
                out.append(
                    replace(
                        example, agent=agent, policy_version=version, p_yes=IMPUTED_P,
                        sample_p=(), imputed=1, crowd_p=None, base_rate_p=None,
                    )
                )  # fmt: skip
    return out


CONSTANT_FORECASTS = frozenset({0.0, IMPUTED_P, 1.0})
"""ForecastBench's constant dummies: Always 0, Always 0.5, Always 1."""


def _is_constant(records: Sequence[ForecastRecord]) -> bool:
    values = {r.p_yes for r in records}
    return len(values) == 1 and values <= CONSTANT_FORECASTS


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _index(score: float | None) -> float | None:
    """ForecastBench's `apply_brier_index_transform`; None where its square root is NaN."""
    return None if score is None or score < 0 else 100 * (1 - math.sqrt(score))


def _overall(by_kind: dict[str, float | None]) -> float | None:
    market, dataset = by_kind["market"], by_kind["dataset"]
    return None if market is None or dataset is None else (dataset + market) / 2


def _question(record: ForecastRecord) -> tuple[str, str | None]:
    return (record.source, record.question)


def difficulty_adjusted(
    scored: dict[Forecaster, list[ForecastRecord]],
    reference: dict[Forecaster, list[ForecastRecord]],
) -> dict[Forecaster, float]:
    """The rescaled difficulty-adjusted Brier of each forecaster on one kind of question:
    mean over its rows of (p − y)² − b_j, plus the mean b_j over the kind's questions (so that
    Always 0.5 scores 0.25), b_j fitted on the `reference` forecasters' records. {} when the
    reference leaves a question of `scored` without an effect, or is not connected."""
    observations = [(f, _question(r), (r.p_yes - r.y) ** 2) for f, rs in reference.items()
                    for r in rs]  # fmt: skip
    if not observations:
        return {}
    try:
        _, effects = two_way_fixed_effects(observations)
    except ValueError:
        return {}
    every_question = {_question(r) for rs in scored.values() for r in rs}
    if not every_question <= effects.keys():
        return {}
    shift = float(np.mean([effects[q] for q in every_question]))
    return {
        f: float(np.mean([(r.p_yes - r.y) ** 2 - effects[_question(r)] for r in rs])) + shift
        for f, rs in scored.items()
    }


@dataclass(frozen=True, kw_only=True)
class UnscoredForecast:
    """A forecaster's forecast (imputed_share 0, or the unparsed share of its rollouts) or
    missing forecast (1) of an imported market question still open: not scored, but counted by
    the 5% rule, as ForecastBench tests every market row of a file, resolved or not (its
    "market" mask in `get_df_info`)."""

    agent: str
    policy_version: int | None
    source: str
    question: str
    imputed_share: float


OpenMarkets = Mapping[tuple[str, str], Mapping[Forecaster, float]]
"""Per open market question (source, external id): the imputed share of each forecaster's
forecast of it (forecasters without one are missing it)."""


def _open_market_rows(
    records: Sequence[ForecastRecord], open_markets: OpenMarkets
) -> list[UnscoredForecast]:
    """An UnscoredForecast per forecaster active in a round and open market question of that
    round: ForecastBench's file holds every row of the resolution set, imputed where missing."""
    active = sorted({((r.agent, r.policy_version), question_round(r)) for r in records}, key=repr)
    rows = []
    for f, round_ in active:
        for (source, question), shares in open_markets.items():
            if question.split("/", 1)[0] == round_:
                share = shares.get(f, 1.0)
                rows.append(UnscoredForecast(agent=f[0], policy_version=f[1], source=source,
                                             question=question, imputed_share=share))  # fmt: skip
    return rows


def round_eligibility(
    records: Sequence[ForecastRecord | UnscoredForecast],
    *,
    reference_agents: Collection[str] = (),
) -> dict[tuple[Forecaster, str], Eligibility]:
    """The 5% rule per forecaster and round: ForecastBench tests each forecast file (one
    forecaster, one due date) on its own."""
    by_round: dict[str, list[Any]] = {}
    for r in records:
        by_round.setdefault(question_round(r), []).append(r)
    return {
        ((agent, version), round_): verdict
        for round_, members in by_round.items()
        for (agent, version), verdict in forecaster_eligibility(
            members, reference_agents=reference_agents
        ).items()
    }


def forecastbench_leaderboard(
    records: Iterable[ForecastRecord],
    *,
    reference_agents: Collection[str] = (),
    open_markets: OpenMarkets | None = None,
) -> ForecastBenchLeaderboard:
    """ForecastBench's leaderboard over the forecasts of imported ForecastBench questions in
    `records` (others are ignored): one row per (agent, version), sorted. `reference_agents`
    are baselines, exempt from the 5% rule as ForecastBench's own are; the rule also counts the
    forecasts of the `open_markets` (imported market questions not yet resolved)."""
    fb = _with_missing_imputed([r for r in records if forecastbench_kind(r.source) is not None])
    unscored = _open_market_rows(fb, open_markets or {})
    verdicts = round_eligibility([*fb, *unscored], reference_agents=reference_agents)
    scored: dict[str, dict[Forecaster, list[ForecastRecord]]] = {k: {} for k in KINDS}
    for r in fb:
        scored[str(forecastbench_kind(r.source))].setdefault(
            (r.agent, r.policy_version), []
        ).append(r)
    reference_set: dict[str, tuple[str, ...]] = {}
    adjusted: dict[str, dict[Forecaster, float]] = {}
    for kind, by_forecaster in scored.items():
        eligible = {
            f: [r for r in rs if verdicts[(f, question_round(r))] is not Eligibility.INELIGIBLE]
            for f, rs in by_forecaster.items()
        }
        present = {f: rs for f, rs in sorted(eligible.items(), key=_forecaster_order) if rs}
        # constant forecasters say nothing about difficulty, unless they are all there is
        reference = {f: rs for f, rs in present.items() if not _is_constant(rs)} or present
        reference_set[kind] = tuple(forecaster_label(f) for f in reference)
        adjusted[kind] = difficulty_adjusted(by_forecaster, reference)
    forecasters = sorted(
        {f for by in scored.values() for f in by}, key=lambda f: _forecaster_order((f, None))
    )
    rows = []
    for f in forecasters:
        kinds = {k: scored[k].get(f, []) for k in KINDS}
        everything = [r for rs in kinds.values() for r in rs]
        mine = {rd: e for (g, rd), e in verdicts.items() if g == f}
        bad = tuple(sorted(rd for rd, e in mine.items() if e is Eligibility.INELIGIBLE))
        eligibility = Eligibility.INELIGIBLE if bad else next(iter(mine.values()))
        brier = {k: _mean([(r.p_yes - r.y) ** 2 for r in rs]) for k, rs in kinds.items()}
        da = {k: adjusted[k].get(f) for k in KINDS}
        imputed = sum(r.imputed_share for r in everything)
        rows.append(
            ForecastBenchRow(
                agent=f[0],
                policy_version=f[1],
                eligibility=eligibility,
                ineligible_rounds=bad,
                imputed=imputed,
                imputed_share=imputed / len(everything),
                n_market=len(kinds["market"]),
                n_dataset=len(kinds["dataset"]),
                brier_market=brier["market"],
                brier_dataset=brier["dataset"],
                brier_overall=_overall(brier),
                difficulty_adjusted_market=da["market"],
                difficulty_adjusted_dataset=da["dataset"],
                difficulty_adjusted_overall=_overall(da),
                brier_index_market=_index(da["market"]),
                brier_index_dataset=_index(da["dataset"]),
                brier_index=_index(_overall(da)),
            )
        )
    return ForecastBenchLeaderboard(rows=rows, reference_set=reference_set)


def _forecaster_order(item: tuple[Forecaster, Any]) -> tuple[str, bool, int]:
    (agent, version), _ = item
    return (agent, version is None, version or 0)


def leaderboard_rows_text(board: ForecastBenchLeaderboard) -> list[str]:
    """One line per row and one naming the reference set: what the CLI prints."""

    def fmt(value: float | None, digits: int = 4) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    lines = []
    for h in board.rows:
        flag = "" if h.eligibility is Eligibility.ELIGIBLE else f" [{h.eligibility}]"
        lines.append(
            f"ForecastBench {h.agent} v{h.policy_version}{flag}: "
            f"Brier Index {fmt(h.brier_index, 1)} "
            f"(difficulty-adjusted Brier {fmt(h.difficulty_adjusted_overall)}; "
            f"Brier overall {fmt(h.brier_overall)}, markets {h.n_market} {fmt(h.brier_market)}, "
            f"datasets {h.n_dataset} {fmt(h.brier_dataset)}); imputed {h.imputed:g} "
            f"({h.imputed_share:.1%})"
        )
    for kind, members in board.reference_set.items():
        lines.append(f"difficulty reference set ({kind}): {', '.join(members) or 'none'}")
    return lines
