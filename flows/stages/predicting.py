"""Predict: claim open questions for an agent's current policy version and persist G rollouts
per question, from the agent's forecaster (flows.forecasters: the LLM loop or a baseline).
Claims make concurrent workers safe and re-runs idempotent."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Engine

from flows.context import PipelineContext
from flows.forecasters import FORECASTERS
from futureworld.domain import Trajectory, utc_now
from storage.engine import session_scope
from storage.repositories.questions import list_questions, open_questions_at
from storage.repositories.rollouts import (
    claim_questions,
    claim_workers,
    existing_samples,
    insert_rollouts,
    release_claims,
    release_worker_claims,
)


@dataclass(frozen=True)
class PredictReport:
    agent: str
    policy_version: int
    questions: int
    rollouts: int


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def release_dead_local_claims(engine: Engine) -> int:
    """Free the claims of predict workers on this host whose process is gone (killed midway),
    so a rerun picks their groups up at once instead of waiting for the lease to expire."""
    host = socket.gethostname()
    with session_scope(engine) as session:
        dead = [w for w in claim_workers(session, f"{host}:") if not _alive(w.rsplit(":", 1)[1])]
        return release_worker_claims(session, dead)


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def predict(
    ctx: PipelineContext,
    agent_name: str,
    *,
    samples: int = 1,
    limit: int | None = None,
    on_group: Callable[[int], None] | None = None,
) -> PredictReport:
    """Forecast every question open at `ctx.as_of` that this agent's current policy version
    has not forecast yet (or has fewer than `samples` rollouts for).

    Questions are claimed `forecaster.claim_batch` at a time (one group for LLM agents, so
    a crash loses at most one group; a thousand for the instant baselines).
    `on_group(n_rollouts)` is called after each group (progress).
    """
    engine = ctx.engine
    worker = ctx.settings.worker_id or default_worker_id()
    release_dead_local_claims(engine)
    agent = ctx.agent(agent_name)
    version = ctx.current_version(agent)
    with session_scope(engine) as session:
        candidates = [q.id for q in open_questions_at(session, ctx.as_of)]
    forecaster = FORECASTERS[agent.backend](ctx, agent, version)
    if forecaster.max_samples is not None:
        samples = min(samples, forecaster.max_samples)

    n_questions = n_rollouts = 0
    while limit is None or n_questions < limit:
        batch = forecaster.claim_batch
        if limit is not None:
            batch = min(batch, limit - n_questions)
        with session_scope(engine) as session:
            claimed = claim_questions(
                session,
                candidates,
                agent_id=agent.id,
                policy_version=version.version,
                samples=samples,
                worker=worker,
                lease_s=ctx.settings.claim_lease_s,
                limit=batch,
                now=utc_now(),
            )
            have = existing_samples(session, claimed, agent.id, version.version)
            questions = {q.id: q for q in list_questions(session, ids=claimed)}
        if not claimed:
            break
        candidates = [q for q in candidates if q not in set(claimed)]
        trajectories: list[Trajectory] = []
        try:
            for question_id in claimed:
                missing = [i for i in range(samples) if i not in have.get(question_id, set())]
                group = forecaster.forecast(questions[question_id], missing)
                trajectories.extend(group)
                n_questions += 1
                if on_group is not None:
                    on_group(len(group))
        finally:
            # Persist what was generated even when a later group fails, then free the claims.
            with session_scope(engine) as session:
                n_rollouts += insert_rollouts(session, trajectories)
                release_claims(session, claimed, agent_id=agent.id, policy_version=version.version)
    return PredictReport(agent.name, version.version, n_questions, n_rollouts)
