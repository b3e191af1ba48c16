"""Baseline forecasters: crowd, base rate and uniform. They write one-turn, token-free
trajectories through the same path the LLM agents use, so every stage (backfill,
evaluation) treats them alike and they stand as reference points in every score table.

Every question kind has a crowd and a uniform baseline; the base rate is binary-only (a YES
frequency says nothing about which option or what number). A baseline's forecast is P(yes)
(binary), a probability per option (choice) or the values at QUANTILE_LEVELS (numeric), or
None when it has none for the question (a missing answer). Its turn text is the answer in the
kind's own format, so parsing the text gives back the forecast.

- crowd: the platform's P(yes), answer probabilities or quantiles at harvest
  (Question.crowd_probability / Question.crowd_forecast).
- base rate: the posterior mean of P(yes) under a Beta prior, from the same source's outcomes
  resolved before the cut-off, (yes + c/2) / (n + c) with c = BASE_RATE_PSEUDO_COUNT.
- uniform: 0.5; 1/k for each of k options; the quantiles of a uniform distribution over the
  numeric range (on ln x for a log scale), lower + τ·(upper − lower).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime
from enum import StrEnum

from futureworld.domain import (
    QUANTILE_LEVELS,
    ParseStatus,
    Question,
    QuestionKind,
    StopReason,
    Trajectory,
    Turn,
    option_label,
    utc_now,
)


class Baseline(StrEnum):
    CROWD = "crowd"
    """The crowd / market forecast at the question's cut-off (every kind)."""
    BASE_RATE = "base-rate"
    """The smoothed frequency of YES among binary questions of the same source resolved
    before the cut-off (`base_rate`; binary questions only)."""
    UNIFORM = "uniform"
    """0.5, equal option probabilities, or the uniform distribution over the numeric range."""


ResolvedHistory = Sequence[tuple[str, datetime, float]]
"""(source, resolved_at, outcome value) of binary questions resolved so far."""

Forecast = float | tuple[float, ...] | None
"""P(yes) (binary), probabilities per option (choice), quantiles (numeric), or none."""


BASE_RATE_PSEUDO_COUNT = 2.0
"""c, the prior's weight in outcomes: a Beta(c/2, c/2) prior on a source's YES rate, mean 0.5.
With c = 2 it is Beta(1, 1), the uniform prior (Laplace's rule of succession). The raw
frequency forecast certainty (P = 0 or 1) from a single resolved outcome, the worst Brier
score there is when the next one goes the other way; the prior keeps the rate inside (0, 1)
and moves it off 0.5 only as a source's outcomes accumulate."""


def base_rate(question: Question, history: ResolvedHistory) -> float:
    """Posterior mean of the YES rate of the question's source under the Beta(c/2, c/2) prior:

        P(yes) = (yes + c/2) / (n + c),    c = BASE_RATE_PSEUDO_COUNT

    over the n same-source outcomes resolved strictly before the cut-off, `yes` of them YES
    (0.5 when n = 0; 1/3 after one NO with c = 2)."""
    values = [
        value
        for source, resolved_at, value in history
        if source == question.source and resolved_at < question.info_cutoff_at
    ]
    c = BASE_RATE_PSEUDO_COUNT
    return (math.fsum(values) + c / 2) / (len(values) + c)


def _base_rate(question: Question, history: ResolvedHistory) -> float | None:
    return base_rate(question, history) if question.kind is QuestionKind.BINARY else None


def _crowd(question: Question, _history: ResolvedHistory) -> Forecast:
    if question.kind is QuestionKind.BINARY:
        return question.crowd_probability
    return question.crowd_forecast


def uniform_quantiles(question: Question) -> tuple[float, ...]:
    """The quantiles at QUANTILE_LEVELS of the uniform distribution over the numeric range."""
    spec = question.numeric_spec
    if spec.log_scale:
        lo, hi = math.log(spec.lower), math.log(spec.upper)
        return tuple(math.exp(lo + t * (hi - lo)) for t in QUANTILE_LEVELS)
    return tuple(spec.lower + t * (spec.upper - spec.lower) for t in QUANTILE_LEVELS)


def _uniform(question: Question, _history: ResolvedHistory) -> Forecast:
    if question.kind is QuestionKind.CHOICE:
        k = len(question.choice_spec.options)
        return (1.0 / k,) * k
    if question.kind is QuestionKind.NUMERIC:
        return uniform_quantiles(question)
    return 0.5


def answer_text(question: Question, forecast: Forecast) -> str:
    """The forecast in the answer format of the question's kind ("" for none)."""
    if forecast is None:
        return ""
    if question.kind is QuestionKind.BINARY:
        return f"<probability>{forecast:.6g}</probability>"
    assert isinstance(forecast, tuple)
    if question.kind is QuestionKind.CHOICE:
        # Plain decimals: the choice format takes no exponent.
        entries = (f"{option_label(i)}: {p:.12f}" for i, p in enumerate(forecast))
        return f"<probabilities>{', '.join(entries)}</probabilities>"
    pairs = zip(QUANTILE_LEVELS, forecast, strict=True)
    levels = (f"{round(t * 100, 6):g}%: {q!r}" for t, q in pairs)
    return f"<quantiles>{', '.join(levels)}</quantiles>"


def _answer_fields(question: Question, forecast: Forecast) -> dict[str, object]:
    if question.kind is QuestionKind.BINARY:
        return {"p_yes": forecast}
    assert isinstance(forecast, tuple)
    if question.kind is QuestionKind.CHOICE:
        total = math.fsum(forecast)
        probabilities = tuple(p / total for p in forecast)
        choice = max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))
        return {
            "probabilities": probabilities,
            "choice": choice,
            "p_yes": probabilities[choice],
        }
    return {"quantiles": tuple(forecast)}


def baseline_trajectory(
    question: Question,
    forecast: Forecast,
    *,
    agent_id: int,
    policy_version: int,
    as_of: datetime | None,
) -> Trajectory:
    """One assistant turn holding the answer; a missing forecast is a missing answer."""
    assert question.id is not None, "baseline forecasts need stored questions"
    answered = forecast is not None
    return Trajectory(
        question_id=question.id,
        agent_id=agent_id,
        policy_version=policy_version,
        sample_index=0,
        turns=(Turn(index=0, role="assistant", text=answer_text(question, forecast)),),
        **(_answer_fields(question, forecast) if answered else {}),  # type: ignore[arg-type]
        parse_status=ParseStatus.OK if answered else ParseStatus.MISSING,
        stop_reason=StopReason.ANSWERED if answered else StopReason.NO_ACTION,
        created_at=utc_now(),
        as_of=as_of,
    )


BASELINES: dict[Baseline, Callable[[Question, ResolvedHistory], Forecast]] = {
    Baseline.CROWD: _crowd,
    Baseline.BASE_RATE: _base_rate,
    Baseline.UNIFORM: _uniform,
}
