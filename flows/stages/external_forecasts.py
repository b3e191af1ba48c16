"""Import an outside forecaster's forecast file (futureworld.sources.forecast_files) as a
read-only agent, so evaluate and the backtest score it beside every other agent.

The agent's backend is EXTERNAL: it does not generate, so no update, promotion gate or served
model ever touches it. Each forecast is stored the way the baselines' are (one token-free
rollout whose single turn is the exact answer, futureworld.baselines.baseline_trajectory),
with the file's forecast time as its `as_of`, so evaluate's as-of rules apply to it as to any
forecast.

Idempotent, with revisions as versions: a policy version of the agent is a state of its
forecasts. A forecast already stored in the newest version with the same probability and time
is left alone; forecasts of questions the version lacks are added to it (so importing a
second round's file extends the agent). When the file changes a stored forecast, the import
registers the next version holding the newest version's forecasts updated by the file (every
stored forecast the file does not hold is carried over), so a question never has two
forecasts in one version and the earlier state stays scored under its own version number, as
an update's parent does. The file's path and sha256 are the new version's checkpoint fields.
Everything is written in one transaction; nothing is written when no row is good.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.orm import Session

from flows.context import PipelineContext
from futureworld.baselines import Baseline, baseline_trajectory
from futureworld.domain import (
    Agent,
    BackendKind,
    PolicyVersion,
    Question,
    VersionStatus,
    utc_now,
)
from futureworld.sources.forecast_files import (
    MatchedForecast,
    default_agent_name,
    match_forecasts,
    read_forecast_file,
)
from futureworld.sources.forecast_rows import ForecastFileError, ForecastFormat, RowError
from storage.engine import session_scope
from storage.repositories.agents import (
    ensure_agent,
    get_agent,
    latest_policy_version,
    register_policy_version,
)
from storage.repositories.questions import latest_outcomes, list_questions, question_ids
from storage.repositories.rollouts import forecasts_of, insert_rollouts

EXTERNAL_MODEL = "forecast-file"
"""The base model every EXTERNAL agent is registered with: it has no model, only files."""


@dataclass(frozen=True)
class ForecastImportReport:
    agent: str
    policy_version: int | None
    """The version the file's forecasts are in; None when no row was good (nothing written)."""
    rows: int
    """Rows of the file, good and bad."""
    loaded: int
    """Forecasts of questions the agent's newest version had no forecast of, stored now."""
    unchanged: int
    """Forecasts already stored with the same probability and time."""
    updated: int
    """Forecasts whose probability or time the file changed (stored in a new version)."""
    carried: int = 0
    """Earlier forecasts the file does not hold, carried into the new version."""
    errors: list[RowError] = field(default_factory=list)
    """Every refused row, in line order."""


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ForecastFileError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ForecastFileError(f"{path}: a folder, not a file") from None
    except UnicodeDecodeError as error:
        raise ForecastFileError(f"{path}: not UTF-8 text ({error})") from None


def _same_time(a: datetime | None, b: datetime) -> bool:
    if a is None:
        return False
    return (a if a.tzinfo is not None else a.replace(tzinfo=UTC)) == b


def _external_agent(session: Session, name: str) -> Agent:
    """The EXTERNAL agent named `name`, registered if new; a name taken by another kind of
    agent, or reserved for a baseline, is refused."""
    if name in {b.value for b in Baseline}:
        raise ValueError(f"agent name {name!r} is a built-in baseline's; choose another --agent")
    try:
        existing = get_agent(session, name)
    except LookupError:
        return ensure_agent(
            session, Agent(name=name, base_model=EXTERNAL_MODEL, backend=BackendKind.EXTERNAL)
        )
    if existing.backend is not BackendKind.EXTERNAL:
        raise ValueError(
            f"agent {name!r} is a {existing.backend} agent; outside forecasts need an agent of "
            "their own: choose another --agent"
        )
    return existing


def import_forecasts(
    ctx: PipelineContext,
    path: Path,
    *,
    agent_name: str | None = None,
    file_format: ForecastFormat | None = None,
) -> ForecastImportReport:
    """Store the good rows of the forecast file at `path` as the forecasts of an EXTERNAL agent
    (`agent_name`, else the file's organization-model or stem) and report every bad row."""
    text = read_text(path)
    parsed = read_forecast_file(text, path.name, file_format)
    name = agent_name or default_agent_name(parsed, path.stem)
    with session_scope(ctx.engine) as session:
        ids = question_ids(session, {row.key for row in parsed.rows})
        questions = {
            (q.source, q.external_id): q for q in list_questions(session, ids=list(ids.values()))
        }
        revealed = {
            qid: o.resolved_at for qid, o in latest_outcomes(session, list(ids.values())).items()
        }
    matched = match_forecasts(parsed, questions, revealed)
    if not matched.forecasts:
        return ForecastImportReport(name, None, parsed.row_count, 0, 0, 0, 0, matched.errors)
    with session_scope(ctx.engine) as session:
        agent = _external_agent(session, name)
        assert agent.id is not None
        version = latest_policy_version(session, agent.id)
        stored = {
            f.question_id: f
            for f in forecasts_of(session, agent.id)
            if f.policy_version == version.version
        }
        new: list[MatchedForecast] = []
        changed: list[MatchedForecast] = []
        unchanged = 0
        for forecast in matched.forecasts:
            assert forecast.question.id is not None
            before = stored.get(forecast.question.id)
            if before is None:
                new.append(forecast)
            elif before.p_yes == forecast.row.p_yes and _same_time(
                before.as_of, forecast.row.forecast_at
            ):
                unchanged += 1
            else:
                changed.append(forecast)
        carried: list[tuple[Question, float | None, datetime | None]] = []
        if changed:
            in_file = {f.question.id for f in matched.forecasts}
            kept = [qid for qid in stored if qid not in in_file]
            by_id = {q.id: q for q in list_questions(session, ids=kept)}
            carried = [(by_id[q], stored[q].p_yes, stored[q].as_of) for q in kept]
            version = register_policy_version(
                session,
                PolicyVersion(
                    agent_id=agent.id,
                    version=version.version + 1,
                    parent_version=version.version,
                    checkpoint_path=str(path),
                    checkpoint_sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
                    created_at=utc_now(),
                    status=VersionStatus.PROMOTED,
                    status_reason=f"forecast file {path.name}: {len(changed)} forecast(s) revised",
                ),
            )
            writes = [(f.question, f.row.p_yes, f.row.forecast_at) for f in matched.forecasts]
            writes += carried
        else:
            writes = [(f.question, f.row.p_yes, f.row.forecast_at) for f in new]
        insert_rollouts(
            session,
            [
                baseline_trajectory(
                    question, p_yes, agent_id=agent.id, policy_version=version.version, as_of=at
                )
                for question, p_yes, at in writes
            ],
        )
    return ForecastImportReport(
        agent=agent.name,
        policy_version=version.version,
        rows=parsed.row_count,
        loaded=len(new),
        unchanged=unchanged,
        updated=len(changed),
        carried=len(carried),
        errors=matched.errors,
    )
