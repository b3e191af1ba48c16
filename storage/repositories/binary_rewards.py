"""Binary rewards scored in Postgres: the SQL twins of futureworld.rewards' brier and log score.

Backfill's bulk is binary questions; reading each answer into Python and writing each reward
back costs several times what the database needs to compute them where they lie. So on
Postgres the binary reward functions also exist as SQL expressions over a rollout `r` and its
outcome `o` (`BINARY_REWARD_SQL`), and `insert_binary_rewards` writes a batch's rewards of
every function in one INSERT … SELECT. The Python functions stay the definition: the SQL is
their transcription, and `tests/flows/test_backfilling.py` holds one to the other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, text, tuple_
from sqlalchemy.orm import Session

from storage.repositories.rewards import PendingScore
from storage.tables import OutcomeRow, QuestionRow

_OK = "(r.parse_status = 'ok' AND r.p_yes IS NOT NULL)"
_SQUARED_ERROR = "((r.p_yes - o.value) * (r.p_yes - o.value))"
_CLIPPED = "LEAST(GREATEST(r.p_yes, :clip_low), :clip_high)"
_LOG_SCORE = f"(CASE WHEN o.value = 1 THEN ln({_CLIPPED}) ELSE ln(1 - {_CLIPPED}) END)"
_UNPARSED = "jsonb_build_object('outcome', o.value, 'parse_failed', 1.0)"
BINARY_REWARD_SQL: dict[str, tuple[str, str]] = {
    "brier": (
        f"CASE WHEN {_OK} THEN -{_SQUARED_ERROR} ELSE :unparseable END",
        f"CASE WHEN {_OK} THEN jsonb_build_object('p_yes', r.p_yes, 'outcome', o.value, "
        f"'brier', {_SQUARED_ERROR}) ELSE {_UNPARSED} END",
    ),
    "log_score": (
        f"CASE WHEN {_OK} THEN {_LOG_SCORE} ELSE :log_unparseable END",
        f"CASE WHEN {_OK} THEN jsonb_build_object('p_yes', r.p_yes, 'outcome', o.value, "
        f"'log_score', {_LOG_SCORE}) ELSE {_UNPARSED} END",
    ),
}
"""(value, components) of the binary reward functions of futureworld.rewards as Postgres
expressions over a rollout r and its outcome o, so that backfill scores binary questions in
the database instead of row by row in Python. They are the Python definitions transcribed
(brier_reward: −(p − y)², −1.25 unparseable; log_score_reward: ln p̃ or ln(1 − p̃) with p̃
clipped, ln 0.01 − 0.25 unparseable), and `tests/flows/test_backfilling.py` holds
them to the Python functions on random answers: Brier bit for bit, the log score to 1e-15
(ln(1 − p̃) where Python uses log1p(−p̃))."""

_INSERT_BINARY = """
INSERT INTO reward
    (rollout_id, reward_fn, outcome_revision, value, components, voided, provisional, created_at)
SELECT p.rollout_id, f.fn, p.revision, {value}, {components}, false, false, :now
FROM unnest(CAST(:rollouts AS integer[]), CAST(:revisions AS integer[])) AS p(rollout_id, revision)
JOIN rollout r ON r.id = p.rollout_id
JOIN outcome o ON o.question_id = r.question_id AND o.revision = p.revision
CROSS JOIN unnest(CAST(:fns AS text[])) AS f(fn)
WHERE o.value IN (0, 1)
ON CONFLICT (rollout_id, reward_fn, outcome_revision) DO NOTHING
"""
"""Every function's rewards of a batch in one statement: one join of the pending rollouts to
their answers and outcomes, each row then written once per function."""


def _by_function(reward_fns: Sequence[str], part: int) -> str:
    """CASE over f.fn choosing each function's value (part 0) or components (part 1)."""
    whens = " ".join(f"WHEN '{fn}' THEN {BINARY_REWARD_SQL[fn][part]}" for fn in reward_fns)
    return f"CASE f.fn {whens} END"


@dataclass(frozen=True)
class UnscorableOutcome:
    question_id: int
    revision: int
    source: str
    external_id: str
    value: float | None
    rollouts: int


def insert_binary_rewards(
    session: Session,
    pending: Sequence[PendingScore],
    reward_fns: Sequence[str],
    constants: Mapping[str, float],
    now: datetime,
) -> tuple[int, list[PendingScore], list[UnscorableOutcome]]:
    """Score pending rollouts of binary questions in Postgres with `BINARY_REWARD_SQL`
    (`constants`: unparseable, log_unparseable, clip_low, clip_high); an existing reward is
    left alone. Returns the rewards inserted, the pending items scored, and the outcomes that
    are not 0 or 1 (their rollouts are left out, to stay queued)."""
    if not pending:
        return 0, [], []
    params = {
        "rollouts": [p.rollout_id for p in pending],
        "revisions": [p.outcome_revision for p in pending],
        "now": now,
        **constants,
    }
    connection = session.connection()
    sql = _INSERT_BINARY.format(
        value=_by_function(reward_fns, 0), components=_by_function(reward_fns, 1)
    )
    inserted = int(connection.execute(text(sql), {**params, "fns": list(reward_fns)}).rowcount or 0)
    if inserted == len(pending) * len(reward_fns):
        return inserted, list(pending), []  # every row written: no outcome was unscorable
    keys = sorted({(p.question_id, p.outcome_revision) for p in pending})
    bad = connection.execute(
        select(
            OutcomeRow.question_id,
            OutcomeRow.revision,
            QuestionRow.source,
            QuestionRow.external_id,
            OutcomeRow.value,
        )
        .join(QuestionRow, QuestionRow.id == OutcomeRow.question_id)
        .where(
            tuple_(OutcomeRow.question_id, OutcomeRow.revision).in_(keys),
            OutcomeRow.value.not_in([0.0, 1.0]) | OutcomeRow.value.is_(None),
        )
    ).all()
    unscorable = {(q, rev) for q, rev, *_ in bad}
    scored = [p for p in pending if (p.question_id, p.outcome_revision) not in unscorable]
    counts = Counter((p.question_id, p.outcome_revision) for p in pending)
    return (
        inserted,
        scored,
        [
            UnscorableOutcome(q, rev, source, external_id, value, counts[(q, rev)])
            for q, rev, source, external_id, value in bad
        ],
    )
