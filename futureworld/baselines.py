"""Baseline forecasters: crowd, base rate and uniform. They write one-turn, token-free
trajectories through the same path the LLM agents use, so every stage (backfill,
evaluation) treats them alike and they stand as reference points in every score table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from enum import StrEnum

from futureworld.domain import ParseStatus, Question, StopReason, Trajectory, Turn, utc_now


class Baseline(StrEnum):
    CROWD = "crowd"
    """The crowd / market probability at the question's cut-off."""
    BASE_RATE = "base-rate"
    """The frequency of YES among questions of the same source resolved before the cut-off."""
    UNIFORM = "uniform"
    """Always 0.5."""


ResolvedHistory = Sequence[tuple[str, datetime, float]]
"""(source, resolved_at, outcome value) of binary questions resolved so far."""


def base_rate(question: Question, history: ResolvedHistory) -> float:
    """YES frequency of same-source outcomes resolved strictly before the cut-off; 0.5 if none."""
    values = [
        value
        for source, resolved_at, value in history
        if source == question.source and resolved_at < question.info_cutoff_at
    ]
    return sum(values) / len(values) if values else 0.5


def _crowd(question: Question, _history: ResolvedHistory) -> float | None:
    return question.crowd_probability


def _uniform(_question: Question, _history: ResolvedHistory) -> float:
    return 0.5


def baseline_trajectory(
    question: Question,
    p_yes: float | None,
    *,
    agent_id: int,
    policy_version: int,
    as_of: datetime | None,
) -> Trajectory:
    """One assistant turn holding the answer; a missing crowd probability is a missing answer."""
    assert question.id is not None, "baseline forecasts need stored questions"
    text = "" if p_yes is None else f"<probability>{p_yes:.6g}</probability>"
    return Trajectory(
        question_id=question.id,
        agent_id=agent_id,
        policy_version=policy_version,
        sample_index=0,
        turns=(Turn(index=0, role="assistant", text=text),),
        p_yes=p_yes,
        parse_status=ParseStatus.OK if p_yes is not None else ParseStatus.MISSING,
        stop_reason=StopReason.ANSWERED if p_yes is not None else StopReason.NO_ACTION,
        created_at=utc_now(),
        as_of=as_of,
    )


BASELINES: dict[Baseline, Callable[[Question, ResolvedHistory], float | None]] = {
    Baseline.CROWD: _crowd,
    Baseline.BASE_RATE: base_rate,
    Baseline.UNIFORM: _uniform,
}
