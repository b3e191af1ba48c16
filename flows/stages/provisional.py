"""Provisional rewards (provisional_consensus): after predict, every unresolved binary group of
an agent gets a label-free reward per rollout, so `train --estimator provisional_consensus` can
learn before outcomes arrive; once an outcome is revealed the question's provisional rewards
are voided and the real ones (backfill) replay as usual.

The reward of rollout i with forecast p_i is its reward function's expectation under the
group's shared consensus ŷ standing in for P(y = 1):
    R̂_i = ŷ · R(p_i, y = 1) + (1 − ŷ) · R(p_i, y = 0)
(for Brier, −(p_i − ŷ)² − ŷ(1 − ŷ)). ŷ is the reliability-weighted mean of the agent's
parsed forecasts of the question made by its group's version or earlier, the group's own
included (futureworld.rl.advantages.group_consensus: one ŷ for the whole group, so the
expectation's ŷ(1 − ŷ) term cannot rank its members); a
forecast's weight is its version's inverse shrunk Brier on outcomes revealed by the stage's
as-of (version_reliability). An unparseable rollout has no vote and gets its function's
unparseable reward (which does not depend on y).

Decisions: a provisional reward is written once per (rollout, reward function) and never
recomputed (later versions' forecasts do not reach back into an earlier group's consensus
anyway); a rollout with no other parsed forecast of its question has no consensus and gets
none (its group may then be too small to replay). A question whose rewards cannot be computed
is named in `errors` and the rest go on. The stage is idempotent.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np
from sqlalchemy.orm import Session

from flows.context import PipelineContext
from futureworld.domain import (
    Outcome,
    OutcomeStatus,
    Question,
    ReplayBatch,
    Reward,
    Trajectory,
)
from futureworld.rewards import DEFAULT_REWARD, REWARD_FUNCTIONS, RewardFn, RewardFunction
from futureworld.rl.advantages import group_consensus, version_reliability
from storage.engine import session_scope
from storage.repositories.provisional import (
    PROVISIONAL_REVISION,
    PoolForecast,
    select_provisional_batch,
    unresolved_forecasts,
    version_track_record,
    void_provisional_rewards,
)
from storage.repositories.questions import list_questions
from storage.repositories.rewards import insert_rewards, rollout_answers


@dataclass
class ProvisionalReport:
    agent: str
    rewards_written: int = 0
    rewards_voided: int = 0
    """Provisional rewards of questions whose outcome has been revealed since."""
    without_consensus: int = 0
    """Rollouts left without a provisional reward: no other parsed forecast to agree with."""
    errors: list[str] = field(default_factory=list)


def write_provisional_rewards(
    ctx: PipelineContext, agent_name: str, *, reward_fn: RewardFn = DEFAULT_REWARD
) -> ProvisionalReport:
    """Void the provisional rewards of questions revealed by `ctx.as_of`, then write the
    missing provisional `reward_fn` rewards of the agent's unresolved binary forecasts."""
    agent = ctx.agent(agent_name)
    assert agent.id is not None
    report = ProvisionalReport(agent.name)
    with session_scope(ctx.engine) as session:
        report.rewards_voided = void_provisional_rewards(session, as_of=ctx.as_of)
        pool = unresolved_forecasts(session, agent.id, reward_fn=str(reward_fn), as_of=ctx.as_of)
        record = version_track_record(session, agent.id, as_of=ctx.as_of)
    by_question: dict[int, list[PoolForecast]] = {}
    for forecast in pool:
        by_question.setdefault(forecast.question_id, []).append(forecast)
    pending = {q: f for q, f in by_question.items() if any(not x.has_provisional for x in f)}
    if not pending:
        return report
    with session_scope(ctx.engine) as session:
        questions = {q.id: q for q in list_questions(session, ids=sorted(pending))}
        answers = rollout_answers(
            session, [x.rollout_id for f in pending.values() for x in f if not x.has_provisional]
        )
    weight_of = {v: version_reliability(total, n) for v, (total, n) in record.items()}
    rewards: list[Reward] = []
    for question_id, forecasts in pending.items():
        try:
            made, missing = _question_rewards(
                questions[question_id], forecasts, answers, weight_of, reward_fn
            )
        except Exception as error:  # One question's failure is named; the rest go on.
            report.errors.append(f"question {question_id}: {type(error).__name__}: {error}")
            continue
        rewards.extend(made)
        report.without_consensus += missing
    rewards = [replace(r, made_at=ctx.as_of) for r in rewards]
    with session_scope(ctx.engine) as session:
        report.rewards_written = insert_rewards(session, rewards)
    return report


def _question_rewards(
    question: Question,
    forecasts: list[PoolForecast],
    answers: dict[int, Trajectory],
    weight_of: dict[int, float],
    reward_fn: RewardFn,
) -> tuple[list[Reward], int]:
    """The provisional rewards of one question's forecasts that lack one, and how many were
    left without a consensus."""
    assert question.id is not None
    score = REWARD_FUNCTIONS[reward_fn]
    prior = version_reliability(0.0, 0)
    voters = [f for f in forecasts if f.p_yes is not None]
    rewards: list[Reward] = []
    missing = 0
    for version in sorted({f.policy_version for f in forecasts if not f.has_provisional}):
        pool = [f for f in voters if f.policy_version <= version]
        pool_p = np.asarray([f.p_yes for f in pool], dtype=np.float64)
        pool_w = np.asarray([weight_of.get(f.policy_version, prior) for f in pool])
        targets = [f for f in forecasts if f.policy_version == version and not f.has_provisional]
        own_p = np.asarray([0.5 if f.p_yes is None else f.p_yes for f in targets])
        own_w = np.asarray(
            [0.0 if f.p_yes is None else weight_of.get(version, prior) for f in targets]
        )
        y_hat = group_consensus(pool_p, pool_w, own_p, own_w)
        for forecast, consensus in zip(targets, y_hat, strict=True):
            if not np.isfinite(consensus):
                missing += 1
                continue
            value, components = _expected_reward(
                score, answers[forecast.rollout_id], question, float(consensus)
            )
            rewards.append(
                Reward(
                    rollout_id=forecast.rollout_id,
                    reward_fn=str(reward_fn),
                    outcome_revision=PROVISIONAL_REVISION,
                    value=value,
                    components=components,
                    provisional=True,
                )
            )
    return rewards, missing


def _expected_reward(
    score: RewardFunction, trajectory: Trajectory, question: Question, y_hat: float
) -> tuple[float, dict[str, float]]:
    """E[R(p, y)] for y ~ Bernoulli(ŷ), from the reward function at y = 1 and y = 0."""
    assert question.id is not None
    at = question.created_at
    values = []
    for y in (1.0, 0.0):
        outcome = Outcome(
            question_id=question.id,
            revision=PROVISIONAL_REVISION,
            status=OutcomeStatus.RESOLVED,
            value=y,
            resolved_at=at,
        )
        result = score(trajectory, question, outcome)
        if result is None:
            raise ValueError(f"reward function does not score a {question.kind} question")
        values.append(result.value)
    value = y_hat * values[0] + (1.0 - y_hat) * values[1]
    return value, {"consensus": y_hat, "reward_if_yes": values[0], "reward_if_no": values[1]}


def with_provisional_groups(
    session: Session,
    batch: ReplayBatch,
    agent_id: int,
    *,
    reward_fns: Sequence[str],
    current_version: int,
    as_of: datetime,
    max_groups: int | None,
    reuse: bool,
    exclude_question_ids: Collection[int] = frozenset(),
) -> ReplayBatch:
    """provisional_consensus's replay: the resolved groups of `batch` (real rewards) and the
    groups unresolved at `as_of` on their provisional rewards, oldest group first, cut at
    `max_groups`; none of `exclude_question_ids` (the validation slice)."""
    provisional = [
        select_provisional_batch(
            session,
            agent_id,
            reward_fn=fn,
            current_version=current_version,
            as_of=as_of,
            max_groups=max_groups,
            reuse=reuse,
            exclude_question_ids=exclude_question_ids,
        )
        for fn in reward_fns
    ]
    real = {group[0].trajectory.group_key for group in batch.groups}
    # A group never trains twice in one update: one whose real reward replay already found
    # (an outcome stored with a resolved_at after `as_of`) is not also taken provisionally.
    unresolved = [g for b in provisional for g in b.groups if g[0].trajectory.group_key not in real]
    groups = sorted(
        (*batch.groups, *unresolved),
        key=lambda g: (g[0].trajectory.created_at, g[0].trajectory.id or 0),
    )
    chosen = groups if max_groups is None else groups[:max_groups]
    return ReplayBatch(
        groups=tuple(chosen),
        skipped_small_groups=batch.skipped_small_groups
        + sum(b.skipped_small_groups for b in provisional),
        remaining_groups=batch.remaining_groups
        + sum(b.remaining_groups for b in provisional)
        + len(groups)
        - len(chosen),
    )
