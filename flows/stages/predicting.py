"""Predict: claim open questions for an agent's current policy version and persist G rollouts
per question. Baseline agents answer in one token-free turn; LLM agents run the multi-turn
loop (flows.stages.agents). Claims make concurrent workers safe and re-runs idempotent."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine

from futureworld.baselines import BASELINES, Baseline, baseline_trajectory
from futureworld.domain import Agent, Question, Trajectory, utc_now
from storage.engine import session_scope
from storage.repositories.agents import get_agent, latest_policy_version
from storage.repositories.questions import list_questions, open_questions_at, resolved_history
from storage.repositories.rollouts import (
    claim_questions,
    claim_workers,
    existing_samples,
    insert_rollouts,
    release_claims,
    release_worker_claims,
)

GroupRunner = Callable[[Question, Sequence[int]], list[Trajectory]]
"""Runs the missing sample indices of one question's group and returns their trajectories."""


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
    engine: Engine,
    agent_name: str,
    *,
    samples: int = 1,
    as_of: datetime | None = None,
    limit: int | None = None,
    worker: str | None = None,
    lease_s: float = 1800.0,
    claim_batch: int | None = None,
    runner_factory: Callable[[Agent, int, datetime], GroupRunner] | None = None,
    on_group: Callable[[int], None] | None = None,
) -> PredictReport:
    """Forecast every question open at `as_of` that this agent's current policy version has
    not forecast yet (or has fewer than `samples` rollouts for).

    `runner_factory(agent, policy_version, as_of)` builds the group runner for LLM agents; baseline
    agents need none. Questions are claimed `claim_batch` at a time (default: one group for
    LLM agents, so a crash loses at most one group; a thousand for the instant baselines).
    `on_group(n_rollouts)` is called after each group (progress).
    """
    as_of = as_of or utc_now()
    worker = worker or default_worker_id()
    release_dead_local_claims(engine)
    with session_scope(engine) as session:
        agent = get_agent(session, agent_name)
        version = latest_policy_version(session, agent.id).version
        candidates = [q.id for q in open_questions_at(session, as_of)]
    if agent.backend == "baseline":
        runner = _baseline_runner(engine, agent, version, as_of)
        samples, claim_batch = 1, claim_batch or 1000
    else:
        if runner_factory is None:
            raise ValueError(f"agent {agent_name!r} ({agent.backend}) needs a generation backend")
        runner = runner_factory(agent, version, as_of)
        claim_batch = claim_batch or 1

    n_questions = n_rollouts = 0
    while limit is None or n_questions < limit:
        batch = claim_batch if limit is None else min(claim_batch, limit - n_questions)
        with session_scope(engine) as session:
            claimed = claim_questions(
                session,
                candidates,
                agent_id=agent.id,
                policy_version=version,
                samples=samples,
                worker=worker,
                lease_s=lease_s,
                limit=batch,
                now=utc_now(),
            )
            have = existing_samples(session, claimed, agent.id, version)
            questions = {q.id: q for q in list_questions(session, ids=claimed)}
        if not claimed:
            break
        candidates = [q for q in candidates if q not in set(claimed)]
        trajectories: list[Trajectory] = []
        try:
            for question_id in claimed:
                missing = [i for i in range(samples) if i not in have.get(question_id, set())]
                group = runner(questions[question_id], missing)
                trajectories.extend(group)
                n_questions += 1
                if on_group is not None:
                    on_group(len(group))
        finally:
            # Persist what was generated even when a later group fails, then free the claims.
            with session_scope(engine) as session:
                n_rollouts += insert_rollouts(session, trajectories)
                release_claims(session, claimed, agent_id=agent.id, policy_version=version)
    return PredictReport(agent.name, version, n_questions, n_rollouts)


def _baseline_runner(engine: Engine, agent: Agent, version: int, as_of: datetime) -> GroupRunner:
    try:
        forecast = BASELINES[Baseline(agent.base_model)]
    except ValueError:
        known = ", ".join(b.value for b in Baseline)
        raise ValueError(
            f"agent {agent.name!r}: unknown baseline {agent.base_model!r} ({known})"
        ) from None
    with session_scope(engine) as session:
        history = resolved_history(session)

    def run(question: Question, missing: Sequence[int]) -> list[Trajectory]:
        if not missing:
            return []
        p_yes = forecast(question, history)
        return [
            baseline_trajectory(
                question, p_yes, agent_id=agent.id, policy_version=version, as_of=as_of
            )
        ]

    return run
