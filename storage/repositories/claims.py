"""Predict-time claims on (question, agent, policy version): who is generating which group,
until when. Candidate question rows are locked with `FOR UPDATE SKIP LOCKED` on Postgres, so
concurrent workers never claim the same group.

Claims across hosts: a claim names its worker (`host:pid` by default, or the configured
worker id, which names the host) and carries a lease. A claim whose lease expired is taken
over by the next worker that asks, whichever host it runs on; the first worker may still
write the group late, which the rollouts' idempotency keys absorb (exactly once), and it
frees only claims it still holds."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from futureworld.domain import utc_now
from storage.repositories._sql import dialect, insert
from storage.repositories.rollouts import existing_samples
from storage.tables import PredictionClaimRow, QuestionRow


def claim_questions(
    session: Session,
    candidate_ids: Sequence[int],
    *,
    agent_id: int,
    policy_version: int,
    samples: int,
    worker: str,
    lease_s: float,
    limit: int | None,
    now: datetime | None = None,
) -> list[int]:
    """Claim up to `limit` candidate questions that still lack samples for this policy version
    and hold no live claim by another worker. The candidate rows are locked with
    `FOR UPDATE SKIP LOCKED` on Postgres, so concurrent workers never claim the same group.
    Call inside its own short transaction; release with `release_claims` when done."""
    if not candidate_ids:
        return []
    now = now or utc_now()
    have = existing_samples(session, candidate_ids, agent_id, policy_version)
    needed = [q for q in candidate_ids if len(have.get(q, ())) < samples]
    if not needed:
        return []
    statement = select(QuestionRow.id).where(QuestionRow.id.in_(needed)).order_by(QuestionRow.id)
    if dialect(session) == "postgresql":
        statement = statement.with_for_update(skip_locked=True)
    locked = list(session.scalars(statement))
    session.execute(
        delete(PredictionClaimRow).where(
            PredictionClaimRow.agent_id == agent_id,
            PredictionClaimRow.policy_version == policy_version,
            PredictionClaimRow.lease_expires_at <= now,
        )
    )
    held = set(
        session.scalars(
            select(PredictionClaimRow.question_id).where(
                PredictionClaimRow.agent_id == agent_id,
                PredictionClaimRow.policy_version == policy_version,
                PredictionClaimRow.question_id.in_(locked),
                PredictionClaimRow.worker != worker,
            )
        )
    )
    order = {q: i for i, q in enumerate(candidate_ids)}
    claimable = sorted((q for q in locked if q not in held), key=order.__getitem__)[:limit]
    if claimable:
        session.execute(
            insert(session, PredictionClaimRow)
            .values(
                [
                    {
                        "question_id": q,
                        "agent_id": agent_id,
                        "policy_version": policy_version,
                        "worker": worker,
                        "lease_expires_at": now + timedelta(seconds=lease_s),
                    }
                    for q in claimable
                ]
            )
            .on_conflict_do_nothing()
        )
    return claimable


def release_claims(
    session: Session,
    question_ids: Sequence[int],
    *,
    agent_id: int,
    policy_version: int,
    worker: str,
) -> int:
    """Drop this worker's claims on these questions. A claim another worker took over after
    this one's lease expired is left alone: the late worker's write of the same group is
    absorbed by the rollouts' idempotency keys, and the new holder finishes and frees it."""
    result = session.execute(
        delete(PredictionClaimRow).where(
            PredictionClaimRow.agent_id == agent_id,
            PredictionClaimRow.policy_version == policy_version,
            PredictionClaimRow.question_id.in_(list(question_ids)),
            PredictionClaimRow.worker == worker,
        )
    )
    return int(result.rowcount or 0)


def renew_claims(
    session: Session,
    question_ids: Sequence[int],
    *,
    agent_id: int,
    policy_version: int,
    worker: str,
    lease_s: float,
    now: datetime | None = None,
) -> int:
    """Extend this worker's live claims on these questions to `now + lease_s` (a heartbeat
    of a worker still generating them). Returns how many it still holds."""
    now = now or utc_now()
    result = session.execute(
        update(PredictionClaimRow)
        .where(
            PredictionClaimRow.agent_id == agent_id,
            PredictionClaimRow.policy_version == policy_version,
            PredictionClaimRow.question_id.in_(list(question_ids)),
            PredictionClaimRow.worker == worker,
        )
        .values(lease_expires_at=now + timedelta(seconds=lease_s))
    )
    return int(result.rowcount or 0)


def held_claims(session: Session) -> int:
    """Claims held right now, by any worker (0 when every predict run has finished)."""
    return int(session.scalar(select(func.count()).select_from(PredictionClaimRow)) or 0)


def claim_workers(session: Session, prefix: str) -> list[str]:
    """Workers holding claims whose id starts with `prefix` (e.g. this host's)."""
    statement = select(PredictionClaimRow.worker).where(
        PredictionClaimRow.worker.startswith(prefix)
    )
    return sorted(set(session.scalars(statement)))


def release_worker_claims(session: Session, workers: Sequence[str]) -> int:
    """Drop every claim of these (dead) workers; their groups become claimable again."""
    if not workers:
        return 0
    result = session.execute(
        delete(PredictionClaimRow).where(PredictionClaimRow.worker.in_(list(workers)))
    )
    return int(result.rowcount or 0)
