"""Baseline forecasters: crowd, base rate and uniform. They write one-turn, token-free
trajectories through the same path the LLM agents use, so every stage (backfill,
evaluation) treats them alike and they stand as reference points in every score table.

Every question kind has a crowd and a uniform baseline; the base rate is binary-only (a YES
frequency says nothing about which option or what number). A baseline's forecast is P(yes)
(binary), a probability per option (choice) or the values at QUANTILE_LEVELS (numeric), or
None when it has none for the question (a missing answer). Its turn text is the kind's exact
answer (futureworld.answers), so parsing the text gives back the forecast; the crowd's and the
uniform forecast of each kind are the kind's answer format's `crowd` and `uniform`.

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

from futureworld.answers import ANSWER_FORMATS, Forecast, ParsedAnswer
from futureworld.domain import (
    ParseStatus,
    Question,
    QuestionKind,
    StopReason,
    Trajectory,
    Turn,
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


BASE_RATES: dict[QuestionKind, Callable[[Question, ResolvedHistory], Forecast]] = {
    QuestionKind.BINARY: base_rate,
}
"""The kinds a base rate is defined for, and its formula; other kinds get no forecast."""


def _base_rate(question: Question, history: ResolvedHistory) -> Forecast | None:
    rate = BASE_RATES.get(question.kind)
    return None if rate is None else rate(question, history)


def _crowd(question: Question, _history: ResolvedHistory) -> Forecast | None:
    return ANSWER_FORMATS[question.kind].crowd(question)


def _uniform(question: Question, _history: ResolvedHistory) -> Forecast:
    return ANSWER_FORMATS[question.kind].uniform(question)


def baseline_trajectory(
    question: Question,
    forecast: Forecast | None,
    *,
    agent_id: int,
    policy_version: int,
    as_of: datetime | None,
) -> Trajectory:
    """One assistant turn holding the answer; a missing forecast is a missing answer."""
    assert question.id is not None, "baseline forecasts need stored questions"
    answers = ANSWER_FORMATS[question.kind]
    if forecast is None:
        text, answer = "", ParsedAnswer(status=ParseStatus.MISSING)
    else:
        text, answer = (
            answers.write(forecast, question, exact=True),
            answers.answer(forecast, question),
        )
    return Trajectory(
        question_id=question.id,
        agent_id=agent_id,
        policy_version=policy_version,
        sample_index=0,
        turns=(Turn(index=0, role="assistant", text=text),),
        p_yes=answer.p_yes,
        choice=answer.choice,
        probabilities=answer.probabilities,
        quantiles=answer.quantiles,
        parse_status=answer.status,
        stop_reason=StopReason.ANSWERED if forecast is not None else StopReason.NO_ACTION,
        created_at=utc_now(),
        as_of=as_of,
    )


BASELINES: dict[Baseline, Callable[[Question, ResolvedHistory], Forecast | None]] = {
    Baseline.CROWD: _crowd,
    Baseline.BASE_RATE: _base_rate,
    Baseline.UNIFORM: _uniform,
}
