"""Export: an agent's forecasts of one ForecastBench question set as a forecast file in
ForecastBench's submission format (futureworld.sources.forecastbench_export), for the public
leaderboard or to re-score from the files alone.

Decisions: the question set file names the round; its questions are found in the store by
their round-prefixed external ids, so it must have been imported (`import forecastbench`).
The policy version is `version`, else the newest version of the agent that forecast any of
the set's questions. A question's forecast is the mean P(yes) of that version's parsed
rollouts of it; questions it did not forecast are left out (ForecastBench imputes them).
The set's questions in the store are its round's (storage.repositories.questions.
round_question_ids, the definition every `--round` command uses); a `round` given by the
caller must be the set's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from flows.context import PipelineContext
from flows.stages.importing import read_file
from futureworld.sources.forecastbench import ForecastBenchFormatError, parse_question_set
from futureworld.sources.forecastbench_export import ForecastKey, Submission, forecast_file
from storage.engine import session_scope
from storage.repositories.questions import question_ids, round_question_ids
from storage.repositories.rollouts import forecasts_of


@dataclass(frozen=True)
class ExportReport:
    agent: str
    policy_version: int
    forecasts: int
    """Entries written (market questions plus dataset question × resolution date)."""
    questions: int
    """Forecastable entries of the set (the denominator of ForecastBench's coverage)."""
    document: dict[str, Any]


def export_forecastbench(
    ctx: PipelineContext,
    agent_name: str,
    question_set: Path,
    *,
    version: int | None = None,
    organization: str = "FutureWorld",
    model: str | None = None,
    model_organization: str = "FutureWorld",
    round: date | None = None,
) -> ExportReport:
    """The forecast file of `agent_name` on the question set at `question_set` (which must be
    of `round` when given)."""
    text = read_file(question_set)
    parsed = parse_question_set(text, str(question_set))
    if round is not None and parsed.forecast_due_date != round:
        raise ForecastBenchFormatError(
            f"{question_set}: a question set of round {parsed.forecast_due_date}, not of "
            f"--round {round}"
        )
    document = json.loads(text)
    agent = ctx.agent(agent_name)
    keys = {(q.source, q.external_id): q for q in parsed.questions}
    with session_scope(ctx.engine) as session:
        scope = round_question_ids(session, parsed.forecast_due_date)
        ids = {key: i for key, i in question_ids(session, keys).items() if i in scope}
        if not ids:
            raise ForecastBenchFormatError(
                f"{question_set}: none of its questions is stored; import it first with "
                "`futureworld import forecastbench`"
            )
        wanted = {question_id: keys[key] for key, question_id in ids.items()}
        forecasts = [f for f in forecasts_of(session, agent.id) if f.question_id in wanted]
    versions = sorted({f.policy_version for f in forecasts})
    if version is None:
        if not versions:
            raise ValueError(
                f"agent {agent.name!r} has no forecasts of {parsed.question_set_name}; run "
                f"`futureworld predict --agent {agent.name} --as-of "
                f"{parsed.forecast_due_date}` first"
            )
        version = versions[-1]
    elif version not in versions:
        raise ValueError(
            f"agent {agent.name!r} version {version} has no forecasts of "
            f"{parsed.question_set_name} (versions with forecasts: {versions or 'none'})"
        )
    sums: dict[int, list[float]] = {}
    for f in forecasts:
        if f.policy_version == version and f.p_yes is not None:
            sums.setdefault(f.question_id, []).append(f.p_yes)
    by_key: dict[ForecastKey, float] = {}
    for question_id, values in sums.items():
        question = wanted[question_id]
        day = question.extra.get("resolution_date")
        key = (
            question.extra["upstream_source"],
            question.extra["upstream_id"],
            None if day is None else date.fromisoformat(day),
        )
        by_key[key] = sum(values) / len(values)
    who = Submission(
        organization=organization,
        model=model or f"{agent.name}-v{version}",
        model_organization=model_organization,
    )
    out = forecast_file(document, by_key, who)
    return ExportReport(
        agent=agent.name,
        policy_version=version,
        forecasts=len(out["forecasts"]),
        questions=len(parsed.questions),
        document=out,
    )
