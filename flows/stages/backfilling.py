"""Backfill rewards when outcomes arrive.

Backfill is exactly once per (rollout, reward function, outcome revision): pending work is
what the backfill queue names (rollouts stored, and rollouts of questions given an outcome
revision, since the last run) and still lacks a reward of a function that applies to its
question's kind; inserts ignore what already exists. So a run costs the new outcomes and
rollouts, not the resolved history. An annulled outcome voids the question's earlier rewards
(kept for audit, excluded from training and evaluation).

Decisions: the reward functions are handed the rollout's answer (p_yes, choice, quantiles,
parse status), not its token arrays or turns, which they do not read. On Postgres, binary
questions (the bulk of every day's outcomes) are scored in the database by the SQL twins of
their reward functions (storage.repositories.binary_rewards, tested against the Python
definitions): one statement a batch finds the queued rollouts, writes their rewards and
settles the queue, instead of reading each answer into Python and writing each reward back;
it also counts the queue's other work, and the pending query of the Python path and the void
of annulled questions run only when there is some. Choice and numeric questions, and every
kind on SQLite, are scored by the Python functions.
A question whose outcome a reward function rejects (a binary question resolved to 0.5) is
reported in `errors` and as a pipeline event; its rollouts stay queued and the rest of the
batch goes on.
Each batch of rollouts is its own transaction, so a crash keeps what was scored;
a transient database error retries the batch's write of the rewards already computed.
Only outcomes revealed by the context's as-of (resolved_at <= ctx.as_of: live, now; in a
backtest or a past-dated run, its clock) are scored or voided; the rest stay queued for a later
day. Every entrance reaches backfill through its context, so none can score its future.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from flows.context import PipelineContext
from flows.stages.problems import Problems
from futureworld.domain import Outcome, Question, QuestionKind, Reward, Trajectory, utc_now
from futureworld.rewards import (
    LOG_SCORE_UNPARSEABLE_REWARD,
    REWARD_FUNCTIONS,
    UNPARSEABLE_REWARD,
    applicable_rewards,
    rewards_for_kind,
)
from futureworld.scoring import LOG_SCORE_CLIP
from storage.engine import run_transaction
from storage.repositories.backfill_queue import (
    ApplicableRewards,
    PendingScore,
    rollouts_pending_rewards,
    settle_backfill_queue,
    void_annulled_rewards,
)
from storage.repositories.binary_rewards import (
    BINARY_REWARD_SQL,
    BinaryBatch,
    UnscorableOutcome,
    score_queued_binary_rewards,
)
from storage.repositories.questions import list_questions
from storage.repositories.rewards import insert_rewards, outcome_revisions, rollout_answers


@dataclass
class BackfillReport:
    rollouts_scored: int = 0
    rewards_inserted: int = 0
    rewards_voided: int = 0
    errors: list[str] = field(default_factory=list)


def reward_functions_by_kind() -> ApplicableRewards:
    """Question kind → the names of the registry's reward functions that score it."""
    return {kind: [str(fn) for fn in rewards_for_kind(kind)] for kind in QuestionKind}


PYTHON_BATCH_ROLLOUTS = 5000
"""Rollouts a transaction scores with the Python reward functions (their answers are read
into memory)."""
DATABASE_BATCH_ROLLOUTS = 50_000
"""Rollouts a transaction scores in the database (binary questions on Postgres): about a
second of work, where every statement also pays for finding its batch in the queue."""


def backfill_rewards(ctx: PipelineContext, *, batch_size: int | None = None) -> BackfillReport:
    """Score every queued rollout whose question has an outcome revision it lacks rewards
    for, with every reward function that applies to its kind; void the rewards of annulled
    questions. `batch_size` (rollouts a transaction) overrides both paths' defaults."""
    revealed_by = ctx.as_of
    applicable = reward_functions_by_kind()
    report = BackfillReport()
    problems = Problems(ctx.run_key, "backfill")
    other_work = True
    if _scored_in_database(ctx.engine.dialect.name):
        in_database = batch_size or DATABASE_BATCH_ROLLOUTS
        others = _score_binary_in_database(ctx, in_database, revealed_by, report, problems)
        other_work = others > 0
        applicable = {k: fns for k, fns in applicable.items() if k is not QuestionKind.BINARY}
    if other_work:  # on Postgres: only when the queue holds other kinds' work or annulments
        in_python = batch_size or PYTHON_BATCH_ROLLOUTS
        _score_in_python(ctx, applicable, in_python, revealed_by, report, problems)
        report.rewards_voided = run_transaction(
            ctx.engine,
            lambda session: void_annulled_rewards(session, as_of=revealed_by),
            what="backfill: void annulled",
        )
    if problems.events:
        report.errors = problems.lines
        problems.save(ctx.engine)
    return report


def _score_in_python(
    ctx: PipelineContext,
    applicable: ApplicableRewards,
    batch_size: int,
    revealed_by: datetime,
    report: BackfillReport,
    problems: Problems,
) -> None:
    """Every pending rollout of the kinds in `applicable`, scored by the Python reward
    functions a batch (a transaction to read, one to write) at a time."""
    engine = ctx.engine
    pending = run_transaction(
        engine,
        lambda session: rollouts_pending_rewards(session, applicable, as_of=revealed_by),
        what="backfill: pending rollouts",
    )
    questions: dict[int, Question] = {}
    for start in range(0, len(pending), batch_size):
        chunk = pending[start : start + batch_size]

        def read(session: Session, chunk: list[PendingScore] = chunk) -> tuple[Any, Any]:
            missing = sorted({p.question_id for p in chunk} - questions.keys())
            questions.update((q.id, q) for q in list_questions(session, ids=missing))
            outcomes = outcome_revisions(
                session, {(p.question_id, p.outcome_revision) for p in chunk}
            )
            return outcomes, rollout_answers(session, [p.rollout_id for p in chunk])

        # Read, score in memory, write: a transient error retries the write of the same
        # rewards (kept in memory), and the reward key makes the write exactly once.
        outcomes, answers = run_transaction(engine, read, what="backfill: read chunk")
        rewards, scored = _score(chunk, questions, outcomes, answers, problems, revealed_by)

        def write(
            session: Session, rewards: list[Reward] = rewards, scored: list[PendingScore] = scored
        ) -> int:
            inserted = insert_rewards(session, rewards)
            settle_backfill_queue(session, scored)
            return inserted

        report.rewards_inserted += run_transaction(engine, write, what="backfill: write rewards")
        report.rollouts_scored += len(scored)


def _scored_in_database(dialect: str) -> bool:
    """Binary questions are scored by SQL on Postgres when every reward function of the kind
    has its SQL twin (storage.repositories.binary_rewards.BINARY_REWARD_SQL)."""
    return dialect == "postgresql" and all(
        str(fn) in BINARY_REWARD_SQL for fn in rewards_for_kind(QuestionKind.BINARY)
    )


def _score_binary_in_database(
    ctx: PipelineContext,
    batch_size: int,
    revealed_by: datetime,
    report: BackfillReport,
    problems: Problems,
) -> int:
    """Every queued rollout of a binary question with a resolved outcome, scored and settled
    by `score_queued_binary_rewards` one batch (a transaction) at a time, in rollout order.
    Returns how many workable queued rollouts it left to the other paths."""
    fns = [str(fn) for fn in rewards_for_kind(QuestionKind.BINARY)]
    constants = {
        "unparseable": UNPARSEABLE_REWARD,
        "log_unparseable": LOG_SCORE_UNPARSEABLE_REWARD,
        "clip_low": LOG_SCORE_CLIP[0],
        "clip_high": LOG_SCORE_CLIP[1],
    }
    unscorable: dict[tuple[int, int], UnscorableOutcome] = {}
    other_work = 0
    after: int | None = 0
    while after is not None:

        def score(session: Session, after: int = after) -> BinaryBatch:
            return score_queued_binary_rewards(
                session,
                fns,
                constants,
                utc_now(),
                after=after,
                limit=batch_size,
                as_of=revealed_by,
                made_at=revealed_by,
            )

        batch = run_transaction(ctx.engine, score, what="backfill: binary rewards")
        report.rewards_inserted += batch.rewards_inserted
        report.rollouts_scored += batch.rollouts_scored
        other_work += batch.other_work
        for bad in batch.unscorable:  # a question's rollouts may span batches
            seen = unscorable.get((bad.question_id, bad.revision))
            rollouts = bad.rollouts + (seen.rollouts if seen else 0)
            unscorable[(bad.question_id, bad.revision)] = replace(bad, rollouts=rollouts)
        after = batch.resume_after
    for bad in unscorable.values():
        problems.add(
            bad.source,
            "unscorable_outcome",
            f"question {bad.external_id} (id {bad.question_id}) outcome revision "
            f"{bad.revision}: binary question {bad.source}/{bad.external_id} has outcome "
            f"{bad.value}; expected 0 or 1; its {bad.rollouts} rollouts stay queued",
        )
    return other_work


def _score(
    chunk: list[PendingScore],
    questions: dict[int, Question],
    outcomes: dict[tuple[int, int], Outcome],
    answers: dict[int, Trajectory],
    problems: Problems,
    made_at: datetime,
) -> tuple[list[Reward], list[PendingScore]]:
    """Every applicable reward of the chunk's rollouts, question by question; a question
    whose scoring fails is reported and left out whole. Returns the rewards and the pending
    items they score."""
    by_question: dict[tuple[int, int], list[PendingScore]] = defaultdict(list)
    for item in chunk:
        by_question[(item.question_id, item.outcome_revision)].append(item)
    rewards: list[Reward] = []
    scored: list[PendingScore] = []
    now = utc_now()
    for (question_id, revision), items in by_question.items():
        question, outcome = questions[question_id], outcomes[(question_id, revision)]
        fns = applicable_rewards(question)
        try:
            found = [
                Reward(
                    rollout_id=item.rollout_id,
                    reward_fn=str(fn),
                    outcome_revision=revision,
                    value=value.value,
                    components=value.components,
                    created_at=now,
                    made_at=made_at,
                )
                for item in items
                for fn in fns
                if (value := REWARD_FUNCTIONS[fn](answers[item.rollout_id], question, outcome))
                is not None
            ]
        except ValueError as error:
            problems.add(
                question.source,
                "unscorable_outcome",
                f"question {question.external_id} (id {question_id}) outcome revision "
                f"{revision}: {error}; its {len(items)} rollouts stay queued",
            )
            continue
        rewards += found
        scored += items
    return rewards, scored
