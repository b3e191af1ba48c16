"""Promote: a registered policy version serves only after it passes the promotion gate
(ARCHITECTURE §9b); a person can overrule the gate either way. Owns which questions the gate
scores, how their forecasts are made and kept, and the status it records; the rules of the
verdict are futureworld.validation's (`judge_candidate`), the slice its `is_held_out`.

The gate scores a candidate on the held-out validation questions whose outcome is revealed by
`ctx.as_of` (binary ones: the Brier rule needs an outcome of 0 or 1), the most recently
resolved first, and judges its health (parse rate, extremes) on those and on the binary
questions posed by then whose outcome is still unknown, held out or not, the newest first
(GateOptions.max_unresolved): an agent's first updates have few resolved held-out questions,
and the early-resolving ones are not like the rest. An open question has no outcome to train
on, so an update has not learnt from it (a provisional estimator may have, which can only
flatter the candidate's parse rate); the Brier rule, which needs outcomes, stays on the
held-out slice. The fit rule scores the candidate, paired with its parent, on the resolved
questions its own update trained on (GateOptions.max_trained): a version worse on the very
outcomes it was fitted to did not learn from them, which needs no held-out outcome to see.
Each is forecast as of its own `info_cutoff_at`, so search sees only what was visible when
the question was posed, by the rollout engine the predict stage runs (every question in
flight at once), with the agent's generation settings and seeds that depend on the question
and sample only, so candidate and parent draw with common random numbers where the gate
forecasts both. The parent is scored on the same questions, paired: from its own stored
validation forecasts, else its stored rollouts of the question (its first forecast made by
then), else forecast the same way; the rules compare each question on as many rollouts a
side (futureworld.validation.equal_counts: the parent's 8 stored rollouts against the
candidate's 4 would have favoured the parent by Var(p)/8 a question).

Gate forecasts are never training data: they are not rollouts at all but kept on the version's
row (policy_version.validation_forecasts: question id → each rollout's P(yes)), so neither
replay, backfill nor evaluate ever reads them; and replay leaves out every held-out question
(select_replay_batch's `exclude_question_ids`, `validation_question_ids`), so the stored
rollouts the gate reuses are never trained on either. A re-run of the gate reuses what it kept.

A group the engine cannot forecast counts as unparsed on that side. If the candidate could not
forecast any question (its weights will not load, its server does not list it), the gate stops
with GateError and the version stays a candidate: that is not a verdict on its forecasts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from flows.context import PipelineContext
from flows.stages.serving import serve_version
from futureworld.domain import (
    Agent,
    Outcome,
    OutcomeStatus,
    ParseStatus,
    PolicyVersion,
    Question,
    QuestionKind,
    Trajectory,
    VersionStatus,
)
from futureworld.validation import (
    ForecastHealth,
    GateOptions,
    check_fraction,
    is_held_out,
    judge_candidate,
)
from storage.engine import run_transaction, session_scope
from storage.repositories.agents import (
    get_policy_version,
    list_policy_versions,
    record_validation_forecasts,
    set_version_status,
    validation_forecasts,
)
from storage.repositories.questions import (
    latest_outcomes,
    list_questions,
    open_binary_questions,
)
from storage.repositories.rollouts import ForecastGroup, forecast_groups
from storage.repositories.training import (
    held_out_question_ids,
    trained_question_ids,
    update_health,
)

NO_VALIDATION_DATA = "no validation data"
"""The reason recorded for a version promoted because no validation question was resolved."""
GATE_SEED_SALT = -1
"""Stands for the version in the gate's rollout seeds, so every version draws the same dice."""
_QUESTION_CHUNK = 500


class GateError(RuntimeError):
    """The gate could not judge a version (no forecast came back); it stays a candidate."""


@dataclass(frozen=True)
class GateReport:
    agent: str
    version: int
    parent_version: int | None
    status: VersionStatus
    reason: str
    questions: int = 0
    """Resolved validation questions, which the Brier rule scores (0: none yet)."""
    health_questions: int = 0
    """Validation questions forecast, resolved or not, which the health rules judge (0: no
    validation data)."""
    candidate: ForecastHealth | None = None
    parent: ForecastHealth | None = None
    brier_ci: tuple[float, float] | None = None
    parse_drop_ci: tuple[float, float] | None = None
    """The paired interval of parse_rate(parent) − parse_rate(candidate) (the parse rule's)."""
    forecast: dict[str, int] = field(default_factory=dict)
    """Questions forecast now, per side ("candidate", "parent"); the rest were reused."""
    fit_questions: int = 0
    """The update's own resolved training questions the fit rule scored (0: none)."""
    fit_ci: tuple[float, float] | None = None
    """The paired interval of Brier(candidate) − Brier(parent) on them (the fit rule's)."""


def validation_question_ids(ctx: PipelineContext, fraction: float) -> frozenset[int]:
    """Ids of every stored question in the validation slice of `fraction`: what replay leaves
    out (`select_replay_batch(..., exclude_question_ids=...)`)."""
    check_fraction(fraction)
    with session_scope(ctx.engine) as session:
        return held_out_question_ids(session, _slice(fraction))


def _slice(fraction: float) -> Callable[[str, str], bool]:
    return lambda source, external_id: is_held_out(source, external_id, fraction)


def gate_version(
    ctx: PipelineContext, agent_name: str, version: int, options: GateOptions = GateOptions()
) -> GateReport:
    """Judge `version` of `agent_name` against its parent on the validation questions revealed
    by `ctx.as_of` (its health also on the questions posed and not yet resolved) and record the
    verdict: promoted (it serves from now on) or rejected (kept with its reason; the agent
    keeps serving its newest promoted version). With no question to judge it is promoted,
    reason NO_VALIDATION_DATA; with none resolved, the health rules alone decide. A
    version already promoted or rejected is judged again (its kept forecasts are reused)."""
    agent = ctx.agent(agent_name)
    assert agent.id is not None
    if not agent.backend.generates:
        raise ValueError(f"{agent.name} is a baseline: it has no versions to gate")
    with session_scope(ctx.engine) as session:
        candidate = get_policy_version(session, agent.id, version)
        if candidate.parent_version is None:
            raise ValueError(f"{agent.name} v{version} has no parent to be judged against")
        parent = get_policy_version(session, agent.id, candidate.parent_version)
    questions, outcomes = _validation_set(ctx, options)
    if not questions:
        reason = f"{NO_VALIDATION_DATA}: no question to judge by {ctx.as_of.isoformat()}"
        _decide(ctx, candidate, VersionStatus.PROMOTED, reason, questions=0)
        return GateReport(agent.name, version, parent.version, VersionStatus.PROMOTED, reason)
    validation_ids = {q.id for q in questions}
    trained, trained_outcomes = _trained_set(ctx, candidate, options)
    scored = questions + [q for q in trained if q.id not in validation_ids]
    # The rollouts per question follow the validation set's size (GateOptions.min_rollouts),
    # which the health rules judge; the trained questions get as many.
    per_question = options.samples_for(len(questions))
    mine, made, failures = _forecasts(
        ctx, agent, candidate, scored, per_question, reuse_rollouts=False
    )
    if failures and len(failures) == len(scored):
        raise GateError(
            f"{agent.name} v{version} could not forecast any of {len(scored)} validation "
            f"questions ({failures[0]}); it stays a candidate"
        )
    theirs, made_parent, _ = _forecasts(
        ctx, agent, parent, scored, per_question, reuse_rollouts=True
    )
    verdict = judge_candidate(
        mine,
        theirs,
        outcomes,
        options,
        health_ids=[q.id for q in questions if q.id is not None],
        trained_outcomes=trained_outcomes,
        parent_name=f"parent v{parent.version}",
    )
    status = VersionStatus.PROMOTED if verdict.promote else VersionStatus.REJECTED

    def record(session) -> None:
        record_validation_forecasts(
            session, agent.id, candidate.version, {q.id: mine[q.id] for q in made}
        )
        record_validation_forecasts(
            session, agent.id, parent.version, {q.id: theirs[q.id] for q in made_parent}
        )

    run_transaction(ctx.engine, record, what="gate: keep validation forecasts")
    _decide(
        ctx,
        candidate,
        status,
        verdict.reason,
        questions=len(outcomes),
        brier=verdict.candidate.brier,
        parse_rate=verdict.candidate.parse_rate,
    )
    return GateReport(
        agent.name,
        version,
        parent.version,
        status,
        verdict.reason,
        questions=len(outcomes),
        health_questions=len(questions),
        candidate=verdict.candidate,
        parent=verdict.parent,
        brier_ci=verdict.brier_ci,
        parse_drop_ci=verdict.parse_drop_ci,
        forecast={"candidate": len(made), "parent": len(made_parent)},
        fit_questions=verdict.fit_questions,
        fit_ci=verdict.fit_ci,
    )


def gate_candidates(
    ctx: PipelineContext, agent_name: str, options: GateOptions = GateOptions()
) -> list[GateReport]:
    """Gate every candidate version of the agent, oldest first (an update registers one; a
    crash between registering and gating leaves one for the next run)."""
    if not ctx.agent(agent_name).backend.generates:
        return []
    return [gate_version(ctx, agent_name, v, options) for v in candidate_versions(ctx, agent_name)]


def candidate_versions(ctx: PipelineContext, agent_name: str) -> list[int]:
    """The agent's versions still waiting for the gate, oldest first."""
    agent = ctx.agent(agent_name)
    with session_scope(ctx.engine) as session:
        return [
            v.version
            for v in list_policy_versions(session, agent.id)
            if v.status is VersionStatus.CANDIDATE
        ]


def promote_version(
    ctx: PipelineContext, agent_name: str, version: int, reason: str = ""
) -> PolicyVersion:
    """A person promotes a version, whatever the gate said: the agent serves it unless a newer
    one is promoted."""
    return _by_hand(ctx, agent_name, version, VersionStatus.PROMOTED, reason or "promoted")


def reject_version(
    ctx: PipelineContext, agent_name: str, version: int, reason: str
) -> PolicyVersion:
    """A person rejects a version (not version 0, the base): it is kept and never served; the
    agent serves its newest promoted version, which the next update starts from."""
    if not reason.strip():
        raise ValueError("a rejection needs a reason")
    return _by_hand(ctx, agent_name, version, VersionStatus.REJECTED, reason)


def version_lineage(ctx: PipelineContext, agent_name: str) -> list[PolicyVersion]:
    """Every registered version of the agent, oldest first, with its status and gate record."""
    agent = ctx.agent(agent_name)
    with session_scope(ctx.engine) as session:
        return list_policy_versions(session, agent.id)


def version_health(ctx: PipelineContext, agent_name: str) -> dict[int, dict[str, float]]:
    """Each version an update produced → that update's health (its summary and the means of
    its steps' entropy, clip fraction, kl_prox, grad norm and sampler gap:
    storage.repositories.training.update_health)."""
    agent = ctx.agent(agent_name)
    with session_scope(ctx.engine) as session:
        return update_health(session, agent.id)


def _by_hand(
    ctx: PipelineContext, agent_name: str, version: int, status: VersionStatus, reason: str
) -> PolicyVersion:
    agent = ctx.agent(agent_name)
    text = f"by hand: {' '.join(reason.split())}"
    return run_transaction(
        ctx.engine,
        lambda session: set_version_status(session, agent.id, version, status, text),
        what=f"{status} {agent.name} v{version}",
    )


def _decide(
    ctx: PipelineContext,
    version: PolicyVersion,
    status: VersionStatus,
    reason: str,
    *,
    questions: int,
    brier: float | None = None,
    parse_rate: float | None = None,
) -> None:
    run_transaction(
        ctx.engine,
        lambda session: set_version_status(
            session,
            version.agent_id,
            version.version,
            status,
            reason,
            validation_questions=questions,
            validation_brier=brier,
            validation_parse_rate=parse_rate,
        ),
        what=f"gate: {status} v{version.version}",
    )


def _validation_set(
    ctx: PipelineContext, options: GateOptions
) -> tuple[list[Question], dict[int, float]]:
    """The binary questions the gate forecasts and the outcomes of those resolved by
    `ctx.as_of`: the held-out ones resolved by then (newest resolution first, at most
    `options.max_questions`), then the open ones (posed and past their cut-off, no outcome
    yet; newest cut-off first, at most `options.max_unresolved`)."""
    with session_scope(ctx.engine) as session:
        held = held_out_question_ids(session, _slice(options.validation_fraction))
        resolved, outcomes = _resolved_among(session, held, ctx.as_of, options.max_questions)
        unresolved = open_binary_questions(session, as_of=ctx.as_of, limit=options.max_unresolved)
    return resolved + unresolved, outcomes


def _trained_set(
    ctx: PipelineContext, candidate: PolicyVersion, options: GateOptions
) -> tuple[list[Question], dict[int, float]]:
    """The binary questions the candidate's update trained on whose outcome is revealed by
    `ctx.as_of`, the most recently resolved first (at most `options.max_trained`), and those
    outcomes: what the fit rule scores; none for a version no update made."""
    if candidate.training_run_id is None or options.max_trained == 0:
        return [], {}
    with session_scope(ctx.engine) as session:
        ids = trained_question_ids(session, candidate.training_run_id)
        return _resolved_among(session, ids, ctx.as_of, options.max_trained)


def _resolved_among(
    session, ids: Collection[int], as_of: datetime, limit: int | None
) -> tuple[list[Question], dict[int, float]]:
    """The binary questions of `ids` whose outcome is revealed as resolved by `as_of`, the
    most recently resolved first, at most `limit` (None: all), and their outcomes."""
    revealed = [
        outcome
        for qid, outcome in latest_outcomes(session, as_of=as_of).items()
        if qid in ids and outcome.status is OutcomeStatus.RESOLVED
    ]
    revealed.sort(key=lambda o: (o.resolved_at, o.question_id), reverse=True)
    chosen = _binary_questions(session, revealed, as_of, limit)
    values = {o.question_id: float(o.value) for o in revealed if o.value is not None}
    return chosen, {q.id: values[q.id] for q in chosen if q.id is not None}


def _binary_questions(
    session, revealed: Sequence[Outcome], as_of: datetime, limit: int | None
) -> list[Question]:
    """The binary questions of `revealed`'s outcomes, in their order, posed and past their
    cut-off by `as_of`, at most `limit` (None: all); read in chunks (a bound IN list)."""
    chosen: list[Question] = []
    for start in range(0, len(revealed), _QUESTION_CHUNK):
        chunk = [o.question_id for o in revealed[start : start + _QUESTION_CHUNK]]
        by_id = {q.id: q for q in list_questions(session, ids=chunk)}
        for qid in chunk:
            question = by_id.get(qid)
            if question is None or question.kind is not QuestionKind.BINARY:
                continue
            if question.created_at > as_of or question.info_cutoff_at > as_of:
                continue
            chosen.append(question)
        if limit is not None and len(chosen) >= limit:
            break
    return chosen[:limit]


def _forecasts(
    ctx: PipelineContext,
    agent: Agent,
    version: PolicyVersion,
    questions: Sequence[Question],
    per_question: int,
    *,
    reuse_rollouts: bool,
) -> tuple[dict[int, tuple[float | None, ...]], list[Question], list[str]]:
    """(question id → each rollout's P(yes), the questions forecast now, why each group that
    failed did): the version's kept validation forecasts, then (`reuse_rollouts`) its stored
    rollouts, then new forecasts, `per_question` rollouts each."""
    with session_scope(ctx.engine) as session:
        kept = validation_forecasts(session, agent.id, version.version)
        stored = _stored_rollouts(session, agent, version, ctx.as_of) if reuse_rollouts else {}
    samples: dict[int, tuple[float | None, ...]] = {}
    missing: list[Question] = []
    for question in questions:
        assert question.id is not None
        found = kept.get(question.id) or stored.get(question.id)
        if found:
            samples[question.id] = found
        else:
            missing.append(question)
    failures: list[str] = []
    if missing:
        made, failures = _forecast_now(ctx, agent, version, missing, per_question)
        samples.update(made)
    return samples, missing, failures


def _stored_rollouts(
    session, agent: Agent, version: PolicyVersion, as_of: datetime
) -> dict[int, tuple[float | None, ...]]:
    """The version's first forecast (one group: one forecast time) of each question made by
    `as_of`, from its stored rollouts."""
    first: dict[int, ForecastGroup] = {}
    for group in forecast_groups(session, agent.id):
        if group.policy_version != version.version or group.as_of is None or group.as_of > as_of:
            continue
        earliest = first.get(group.question_id)
        if earliest is None or group.as_of < earliest.as_of:  # type: ignore[operator]
            first[group.question_id] = group
    return {qid: group.answers for qid, group in first.items()}


def _forecast_now(
    ctx: PipelineContext,
    agent: Agent,
    version: PolicyVersion,
    questions: Sequence[Question],
    samples: int,
) -> tuple[dict[int, tuple[float | None, ...]], list[str]]:
    """Each question forecast by `version` as of its own info_cutoff_at, through the rollout
    engine on the version's backend; a group that fails counts as unparsed (and says why)."""
    from futureworld.agent.engine import GroupFailure, GroupJob, RolloutEngine
    from futureworld.agent.loop import rollout_seed

    assert agent.id is not None
    try:
        serve_version(ctx, agent, version)  # an HTTP agent's server must list the version
    except Exception as error:
        raise GateError(
            f"{agent.name} v{version.version} could not be served to the gate: {error}"
        ) from error
    seed = agent.generation.seed
    jobs = [
        GroupJob(
            question=question,
            samples=tuple(range(samples)),
            seeds=tuple(rollout_seed(seed, question.id, GATE_SEED_SALT, i) for i in range(samples)),
            as_of=min(question.info_cutoff_at, ctx.as_of),
        )
        for question in questions
        if question.id is not None
    ]
    engine = RolloutEngine(
        ctx.backend(agent, version),
        ctx.corpus,
        agent.generation,
        agent_id=agent.id,
        policy_version=version.version,
    )
    out: dict[int, tuple[float | None, ...]] = {}
    failures: list[str] = []

    def done(job: GroupJob, group: list[Trajectory]) -> None:
        out[job.question.id] = tuple(
            t.p_yes if t.parse_status is ParseStatus.OK else None for t in group
        )

    def failed(failure: GroupFailure) -> None:
        out[failure.job.question.id] = (None,) * samples
        failures.append(f"question {failure.job.question.id}: {failure.kind}: {failure.detail}")

    engine.run(jobs, done, failed)
    return out, failures
