"""Binary rewards scored in Postgres: the SQL twins of futureworld.rewards' brier and log score.

Backfill's bulk is binary questions; reading each answer into Python and writing each reward
back costs several times what the database needs to compute them where they lie. So on
Postgres the binary reward functions also exist as SQL expressions over a rollout `r` and its
outcome `o` (`BINARY_REWARD_SQL`), and `score_queued_binary_rewards` does a batch of
backfill in one statement: one scan of the queue finds the workable rollouts (those whose
question's current outcome is resolved or annulled), writes every function's rewards of the
binary ones and settles their queue rows, and counts what it left to the other paths (choice
and numeric questions, annulments), so backfill runs those only when there is such work.
Finding the work, scoring it and settling it as separate statements (the queued ids and
revisions shipped to Python and back in between, and the queue scanned once more for each of
the other paths) cost as much again as writing the rewards. The Python functions stay the
definition: the SQL is their transcription, and `tests/flows/test_backfilling.py` holds one
to the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import TextClause, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from futureworld.domain import OutcomeStatus, QuestionKind

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

_WORKABLE = """
    SELECT q.rollout_id, q.question_id, k.kind, o.revision, o.status, o.value
    FROM backfill_queue q
    JOIN question k ON k.id = q.question_id
    CROSS JOIN LATERAL (
        SELECT c.revision, c.status, c.value FROM outcome c
        WHERE c.question_id = q.question_id{revealed}
        ORDER BY c.revision DESC
        LIMIT 1
    ) o
    WHERE q.rollout_id > :after AND o.revision >= q.outcome_revision
      AND o.status IN (:resolved, :annulled)
"""
"""Queued rollouts (after `after`) whose question's current outcome (its highest revision,
revealed by `as_of` where `revealed` says so) is resolved or annulled at a revision no older
than the queued one: backfill's work, of every kind. The current outcome is an index probe
per question (memoised across its rollouts), not a scan of the outcome table."""
_SCORE_QUEUED = f"""
WITH workable AS MATERIALIZED (
    {_WORKABLE}
    ORDER BY q.rollout_id
    LIMIT :limit
),
scorable AS (
    SELECT * FROM workable WHERE kind = :binary AND status = :resolved AND value IN (0, 1)
),
inserted AS (
    INSERT INTO reward
        (rollout_id, reward_fn, outcome_revision, value, components, voided, provisional,
         created_at, made_at)
    SELECT o.rollout_id, f.fn, o.revision, {{value}}, {{components}}, false, false, :now,
           :made_at
    FROM scorable o
    JOIN rollout r ON r.id = o.rollout_id
    CROSS JOIN unnest(CAST(:fns AS text[])) AS f(fn)
    {{on_conflict}}
    RETURNING 1
),
settled AS (
    DELETE FROM backfill_queue b USING scorable s
    WHERE b.rollout_id = s.rollout_id AND b.outcome_revision <= s.revision
)
SELECT (SELECT count(*) FROM inserted),
       (SELECT count(*) FROM scorable),
       count(*),
       max(rollout_id),
       count(*) FILTER (WHERE kind <> :binary OR status <> :resolved),
       count(*) FILTER (WHERE kind = :binary AND status = :resolved
                        AND (value IS NULL OR value NOT IN (0, 1)))
FROM workable
"""
"""One batch of backfill as one statement: the next `limit` workable queued rollouts (by id),
every reward function's rewards of those of binary questions resolved 0 or 1, and their queue
rows settled; it counts the rest of the batch (other kinds, annulments) and the binary
rollouts whose outcome is not 0 or 1, which stay queued. `on_conflict` is empty (a plain
insert) or leaves an existing reward alone. Every statement of a WITH sees the same snapshot,
so the DELETE settles exactly the rollouts the INSERT scored or found already scored."""
_SKIP_EXISTING = "ON CONFLICT (rollout_id, reward_fn, outcome_revision) DO NOTHING"
_REVEALED = " AND c.resolved_at <= :as_of"
_UNSCORABLE = f"""
SELECT w.question_id, w.revision, k.source, k.external_id, w.value, count(*)
FROM ({_WORKABLE}) w
JOIN question k ON k.id = w.question_id
WHERE w.rollout_id <= :last AND w.kind = :binary AND w.status = :resolved
  AND (w.value IS NULL OR w.value NOT IN (0, 1))
GROUP BY w.question_id, w.revision, k.source, k.external_id, w.value
ORDER BY w.question_id
"""
"""The outcomes of binary questions a batch of `_SCORE_QUEUED` left unscored (not 0 or 1),
with their questions and how many queued rollouts each holds."""


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


@dataclass(frozen=True)
class BinaryBatch:
    """What one batch of `score_queued_binary_rewards` did."""

    rewards_inserted: int
    rollouts_scored: int
    resume_after: int | None
    """The highest queued rollout id the batch looked at, where the next batch starts; None
    when the batch reached the end of the queue."""
    other_work: int
    """Workable rollouts of the batch left to the other paths: of choice and numeric
    questions (scored in Python) and of annulled questions (voided)."""
    unscorable: list[UnscorableOutcome]


def score_queued_binary_rewards(
    session: Session,
    reward_fns: Sequence[str],
    constants: Mapping[str, float],
    now: datetime,
    *,
    after: int = 0,
    limit: int = 50_000,
    as_of: datetime | None = None,
    made_at: datetime | None = None,
) -> BinaryBatch:
    """Score the binary questions' rollouts among the next `limit` workable queued rollouts
    (rollout id > `after`) in Postgres with `BINARY_REWARD_SQL` and settle their queue rows,
    in one statement (`constants`: unparseable, log_unparseable, clip_low, clip_high). A
    rollout whose outcome is not 0 or 1 stays queued and is returned among the unscorable
    outcomes. With `as_of` only outcome revisions resolved by then count. `now` is the wall
    clock of the write (created_at), `made_at` the pipeline's instant (the run's as-of)."""
    workable = {"revealed": "" if as_of is None else _REVEALED}
    params: dict[str, object] = {
        "after": after,
        "limit": limit,
        "binary": str(QuestionKind.BINARY),
        "resolved": str(OutcomeStatus.RESOLVED),
        "annulled": str(OutcomeStatus.ANNULLED),
        "as_of": as_of,
        "now": now,
        "made_at": made_at,
        "fns": list(reward_fns),
        **constants,
    }

    def statement(on_conflict: str) -> TextClause:
        value, components = _by_function(reward_fns, 0), _by_function(reward_fns, 1)
        return text(
            _SCORE_QUEUED.format(
                value=value, components=components, on_conflict=on_conflict, **workable
            )
        )

    try:
        # The queue names unscored work, so a plain insert nearly always succeeds, and costs
        # less than ON CONFLICT's probe of the unique index before every row.
        with session.begin_nested():  # (the savepoint is taken by the connection() within)
            row = session.connection().execute(statement(""), params).one()
    except IntegrityError:  # a concurrent backfill scored some first: skip what exists
        row = session.connection().execute(statement(_SKIP_EXISTING), params).one()
    inserted, scored, looked_at, last, others, bad = row
    unscorable: list[UnscorableOutcome] = []
    if bad:
        rows = session.connection().execute(
            text(_UNSCORABLE.format(**workable)), {**params, "last": last}
        )
        unscorable = [UnscorableOutcome(*r) for r in rows]
    resume_after = last if looked_at == limit else None
    return BinaryBatch(int(inserted), int(scored), resume_after, int(others), unscorable)
