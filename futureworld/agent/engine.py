"""The rollout engine: many questions' groups in flight at once over one generation stream.

Jobs are pulled while the stream is full: groups are started (their prompts encoded, their
first turns queued) until as many requests wait behind the stream as it has in flight and
`LOOKAHEAD_ROLLOUTS` rollouts are unfinished, so prompts are built while requests run and a
caller that claims work per job holds about the lookahead's work, not the whole batch. Every turn of
every active rollout is one stream request with its own seed, offered in the order it became
ready (a next turn once its tool call has returned, behind the first turns queued before it),
and a group goes to `on_group` the moment its last rollout ends. Ready order, and first turns
queued ahead, because of the drain: when the oldest groups' next turns go first, the last
groups' first turns wait behind them and their second and third turns run at the end on a
near-empty stream. List-scheduling the scripted turns of 32 questions × G = 8 at search rate
0.5 and 3 turns on 32 slots keeps 0.86 of the slots busy in start order and 0.98 in ready
order with every first turn queued at once (benchmarks/predict_http.py's perfect client);
pulled a few groups at a time, ready order was no better than start order (0.84–0.86 of
max_concurrency with 0.2 s requests), with the lookahead 0.91–0.92. Groups then finish less
in the order they started.
Tool calls run on `TOOL_WORKERS` threads and their observations are appended on the engine's
thread, in call order, so a rollout's state changes only there. When the stream is stepped
(`GenerationStream.stepped`: the local backend's decode steps), a call made after step s is
taken back after step s + 1, which it ran beside, waiting for it if need be (or at once when
nothing is left in flight): which requests share a decode step is then a function of the
computation, not of how fast a query ran, so a seeded run repeats token for token. Before,
a call was taken back at the first check that found it finished; the rows of a step, and so
the float rounding of its batched forward, followed the machine's load, and two runs of one
seed of the research demo parted after round 2 (docs/results.md, "A research round profiled,
and what RL changes in the agent's answers"). Over HTTP a finished call wakes the stream and
is taken back at once: the server's own timing decides the order anyway. Identical calls of
a run (the same action, as-of and notice) share one corpus read and one tokenizing
(`_ToolCalls`).

Sampling is seeded per rollout (futureworld.agent.loop), so the engine's rollouts equal a
one-at-a-time loop's whatever else runs beside them. Failures are per group: a prompt too long
even after cutting, or a request the backend could not generate, fails its group
(`on_failure`); when a whole decode step raises, the groups in flight are re-run one at a time
so only the group that fails alone is failed. Groups of every question kind batch together:
each request stops at its kind's stop strings, the answer is parsed in its kind's format, and
beliefs are elicited only for kinds whose format has a belief prefix (binary).
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial

from transformers import PreTrainedTokenizerBase

from futureworld.agent.groups import (
    EngineStats,
    FailureKind,
    GroupFailure,
    GroupInFlight,
    GroupJob,
    OnFailure,
    OnGroup,
    group_trajectories,
    raise_failure,
    sampling_params,
)
from futureworld.agent.loop import (
    Observation,
    PromptTooLong,
    Rollout,
    append_generation,
    append_observation,
    belief_seed,
    fit_prompt,
    leads_into_last_turn,
    record_belief,
    run_tool,
    turn_seed,
)
from futureworld.agent.parsing import (
    Action,
    action_stop_strings,
)
from futureworld.agent.prompts import BELIEF_PREFIX, observation_frame
from futureworld.agent.tools import Corpus
from futureworld.answers import ANSWER_FORMATS
from futureworld.domain import (
    GenerationSettings,
    Question,
    QuestionKind,
    StopReason,
    Trajectory,
    utc_now,
)
from futureworld.policy.base import PolicyBackend
from futureworld.policy.streaming import GenerationError, GenerationStream, StreamRequest

LOOKAHEAD_ROLLOUTS = 256
"""Groups are started (their prompts encoded, their first turns queued) while fewer rollouts
than this are unfinished, so first turns wait ahead of the follow-ups that become ready after
them; the rest of the jobs are pulled as groups end. 256 is 32 questions at G = 8."""

TOOL_WORKERS = 4
"""Threads running tool calls (a corpus query, then tokenizing its observation) while the
engine's thread keeps the stream full."""


@dataclass
class _Request:
    key: int
    """Increasing as requests are made: the ready queue's order."""
    group: GroupInFlight
    rollout: Rollout
    stream_request: StreamRequest
    budget: int = 0
    belief_turn: int | None = None
    """For a belief side generation: the tool turn its answer belongs to."""
    submitted_at: float = 0.0


_ToolKey = tuple[Action, datetime, bool]


@dataclass(frozen=True)
class _Call:
    key: _ToolKey
    future: Future[Observation]
    reused: bool
    """Asked again while or after the call ran: its observation, without its time."""


class _ToolCalls:
    """A run's tool calls, one per distinct (action, as-of, whether the last turn follows):
    a call asked again shares the first one's observation. The G rollouts of a question search
    with the same query and as-of more often than not, and each such call was a corpus query
    and a tokenizing of its results: in a research demo's run of seed 0, 2686 distinct calls
    answer the 8009 of its stored rollouts (docs/results.md, "A seeded research run
    repeats"). A run thus reads the corpus once per query: an article stored while it runs is
    seen by all of its identical queries or by none. A call that failed is forgotten once
    taken back, so a later one tries again."""

    def __init__(
        self,
        executor: ThreadPoolExecutor,
        corpus: Corpus,
        frame: tuple[str, str],
        settings: GenerationSettings,
        tokenizer: PreTrainedTokenizerBase,
    ) -> None:
        self._executor = executor
        self._run_tool = partial(
            run_tool, corpus=corpus, frame=frame, settings=settings, tokenizer=tokenizer
        )
        self._futures: dict[_ToolKey, Future[Observation]] = {}
        self.shared = 0

    def call(self, action: Action, as_of: datetime, last_turn_next: bool) -> _Call:
        key = (action, as_of, last_turn_next)
        future = self._futures.get(key)
        if future is not None:
            self.shared += 1
            return _Call(key, future, reused=True)
        future = self._executor.submit(
            self._run_tool, action, as_of=as_of, last_turn_next=last_turn_next
        )
        self._futures[key] = future
        return _Call(key, future, reused=False)

    def take(self, call: _Call) -> Observation:
        """The call's observation (waiting for it)."""
        observation = call.future.result()
        if observation.error is not None and self._futures.get(call.key) is call.future:
            del self._futures[call.key]
        return replace(observation, tool_s=0.0) if call.reused else observation


class RolloutEngine:
    """Runs groups of rollouts for one policy version over one backend and corpus."""

    def __init__(
        self,
        backend: PolicyBackend,
        corpus: Corpus,
        settings: GenerationSettings,
        *,
        agent_id: int,
        policy_version: int,
    ) -> None:
        self._backend = backend
        self._corpus = corpus
        self._settings = settings
        self._agent_id = agent_id
        self._policy_version = policy_version
        tokenizer = backend.tokenizer
        self._tokenizer = tokenizer
        self._frame = observation_frame(tokenizer, settings.observation_role)
        self._belief_ids = tokenizer.encode(BELIEF_PREFIX, add_special_tokens=False)
        self._stops = {kind: action_stop_strings(kind) for kind in QuestionKind}
        self._keys = 0
        self._orders = 0

    def run(
        self,
        jobs: Iterable[GroupJob],
        on_group: OnGroup,
        on_failure: OnFailure | None = None,
    ) -> EngineStats:
        """Run every job's rollouts, handing each group to `on_group` as soon as it is
        complete and each failed group to `on_failure` (default: raise its error)."""
        stats = EngineStats()
        with ThreadPoolExecutor(TOOL_WORKERS, thread_name_prefix="rollout-tool") as executor:
            tools = _ToolCalls(executor, self._corpus, self._frame, self._settings, self._tokenizer)
            self._run(iter(jobs), on_group, on_failure or raise_failure, stats, tools, alone=False)
        stats.tool_calls_shared = tools.shared
        return stats

    def _run(
        self,
        jobs: Iterator[GroupJob],
        on_group: OnGroup,
        on_failure: OnFailure,
        stats: EngineStats,
        tools: _ToolCalls,
        *,
        alone: bool,
    ) -> None:
        streams: list[GenerationStream] = [self._backend.open_stream()]
        """The stream in use (a tool finishing wakes it); replaced after a failed step."""
        ready: deque[_Request] = deque()
        """Requests waiting for the stream, in the order they were made (keys increase)."""
        in_flight: dict[int, _Request] = {}
        active: dict[int, GroupInFlight] = {}
        calls: deque[tuple[_Call, _Request, int]] = deque()
        """Tool calls running and the step they were made after, taken back in the order they
        were made (as inline calls were), so what a rollout's next turn sees never depends on
        which query ran faster."""
        stepped = streams[0].stepped
        steps = 0
        exhausted = False

        def settle(request: _Request, follow_ups: list[_Request]) -> None:
            for follow_up in follow_ups:
                ready.append(follow_up)
            group = request.group
            if request.rollout.done:
                group.remaining -= 1
                if group.remaining == 0:
                    del active[group.order]
                    on_group(group.job, self._trajectories(group))
                    stats.groups += 1

        def waiting_rollouts() -> int:
            return sum(group.remaining for group in active.values())

        def start_next() -> bool:
            nonlocal exhausted
            job = None if exhausted else next(jobs, None)
            if job is None:
                exhausted = True
                return False
            group = self._start(job, on_failure, stats)
            if group is not None:
                active[group.order] = group
                for rollout in group.rollouts:
                    ready.append(self._turn_request(group, rollout))
            return True

        try:
            while True:
                # Stepped: every call made after an earlier step (all of them when nothing is
                # in flight), finished or not; else the calls that have finished.
                through = steps if not in_flight else steps - 1
                while calls and (calls[0][2] <= through if stepped else calls[0][0].future.done()):
                    call, request, _ = calls.popleft()
                    observation = tools.take(call)
                    if not request.group.failed:
                        settle(request, self._after_tool(request, observation))
                stream = streams[0]
                while True:
                    while ready and ready[0].group.failed:
                        ready.popleft()
                    if not ready:
                        if start_next():
                            continue
                        break
                    if not stream.offer(ready[0].stream_request):
                        # Full: have the next groups' first turns encoded and waiting, so a
                        # slot that frees is refilled at once, not after a prompt is built,
                        # and queued ahead of the follow-ups the running turns will make.
                        while (
                            len(ready) < stream.in_flight or waiting_rollouts() < LOOKAHEAD_ROLLOUTS
                        ) and start_next():
                            pass
                        break
                    request = ready.popleft()
                    request.submitted_at = time.perf_counter()
                    in_flight[request.key] = request
                    stats.requests += 1
                if not in_flight:
                    if calls:
                        wait_futures([calls[0][0].future])
                        continue
                    if ready:  # The stream contract: an empty stream takes any request.
                        raise RuntimeError(f"{self._backend.describe()} refused a request")
                    break
                try:
                    results = stream.advance()
                    steps += 1
                except Exception as error:  # A whole step failed: no row to blame yet.
                    stream.close()
                    suspects = sorted(active.values(), key=lambda g: g.order)
                    ready.clear()
                    in_flight.clear()
                    active.clear()
                    calls.clear()
                    if alone:
                        for group in suspects:
                            self._fail(group, FailureKind.GENERATION_ERROR, error, on_failure)
                            stats.failed += 1
                    else:
                        for group in suspects:
                            self._run(
                                iter([group.job]), on_group, on_failure, stats, tools, alone=True
                            )
                    streams[0] = self._backend.open_stream()
                    continue
                for result in results:
                    request = in_flight.pop(result.key)
                    group = request.group
                    if group.failed:
                        continue
                    if result.generation is None:
                        error = result.error or GenerationError("no generation")
                        self._fail(group, FailureKind.GENERATION_ERROR, error, on_failure)
                        stats.failed += 1
                        del active[group.order]
                        continue
                    stats.generated_tokens += len(result.generation.token_ids)
                    action = self._apply(request, result.generation)
                    if action is None:
                        settle(request, [])
                        continue
                    last_turn_next = leads_into_last_turn(request.rollout.turn_no, self._settings)
                    call = tools.call(action, group.search_as_of, last_turn_next)
                    if not stepped:
                        call.future.add_done_callback(lambda _: streams[0].wake())
                    calls.append((call, request, steps))
        finally:
            streams[0].close()

    def _start(
        self, job: GroupJob, on_failure: OnFailure, stats: EngineStats
    ) -> GroupInFlight | None:
        """Encode (and if need be cut) the job's prompt; a prompt that cannot fit fails."""
        question = job.question
        closed = question.close_at
        search_as_of = job.as_of if closed is None else min(job.as_of, closed)
        self._orders += 1
        try:
            fitted = fit_prompt(
                self._tokenizer, question, as_of=search_as_of, settings=self._settings
            )
        except PromptTooLong as error:
            stats.failed += 1
            group = GroupInFlight(job, self._orders, [], [], search_as_of, 0.0, 0)
            self._fail(group, FailureKind.PROMPT_TOO_LONG, error, on_failure)
            return None
        if fitted.cut is not None:
            stats.cut_prompts.append((job, fitted.cut))
        rollouts = [
            Rollout(index=index, seed=seed)
            for index, seed in zip(job.samples, job.seeds, strict=True)
        ]
        return GroupInFlight(
            job=job,
            order=self._orders,
            prompt=fitted.ids,
            rollouts=rollouts,
            search_as_of=search_as_of,
            started=time.perf_counter(),
            remaining=len(rollouts),
        )

    def _fail(
        self, group: GroupInFlight, kind: FailureKind, error: BaseException, on_failure: OnFailure
    ) -> None:
        group.failed = True
        on_failure(GroupFailure(group.job, kind, f"{type(error).__name__}: {error}"))

    def _next_key(self) -> int:
        self._keys += 1
        return self._keys

    def _turn_request(self, group: GroupInFlight, rollout: Rollout) -> _Request:
        settings = self._settings
        budget = settings.max_total_tokens - len(group.prompt) - len(rollout.completion)
        max_new = min(settings.max_new_tokens, budget)
        seed = turn_seed(rollout.seed, rollout.turn_no)
        params = sampling_params(settings, max_new, seed, self._stops[group.job.question.kind])
        key = self._next_key()
        prompt = (*group.prompt, *rollout.completion)
        stream_request = StreamRequest(key=key, prompt=prompt, params=params)
        return _Request(key, group, rollout, stream_request, budget=budget)

    def _belief_request(self, group: GroupInFlight, rollout: Rollout) -> _Request:
        settings = self._settings
        closing = ANSWER_FORMATS[group.job.question.kind].closing_tag
        seed = belief_seed(rollout.seed, rollout.turn_no)
        params = sampling_params(settings, settings.belief_max_new_tokens, seed, (closing,))
        key = self._next_key()
        prompt = (*group.prompt, *rollout.completion, *self._belief_ids)
        stream_request = StreamRequest(key=key, prompt=prompt, params=params)
        rollout.beliefs_pending += 1
        return _Request(
            key,
            group,
            rollout,
            stream_request,
            belief_turn=len(rollout.turns) - 1,
        )

    def _apply(self, request: _Request, generation) -> Action | None:
        """Apply a finished request to its rollout; the tool call it asks for, if any (a
        rollout that stops, or a belief, asks for none)."""
        rollout, group = request.rollout, request.group
        elapsed = time.perf_counter() - request.submitted_at
        rollout.generate_s += elapsed
        if request.belief_turn is not None:
            record_belief(rollout, request.belief_turn, generation, self._tokenizer)
            rollout.beliefs_pending -= 1
            return None
        kind = group.job.question.kind
        action = append_generation(rollout, generation, request.budget, self._tokenizer, kind)
        if rollout.stop is not None:
            return None
        if rollout.turn_no + 1 == self._settings.max_turns:
            rollout.stop = StopReason.MAX_TURNS
            return None
        return action

    def _after_tool(self, request: _Request, observation: Observation) -> list[_Request]:
        """Append the tool's observation; the requests it leads to (belief, next turn)."""
        rollout, group = request.rollout, request.group
        append_observation(rollout, observation, len(group.prompt), self._settings)
        if rollout.stop is not None:
            return []
        follow_ups = []
        elicits = ANSWER_FORMATS[group.job.question.kind].belief_prefix is not None
        if self._settings.elicit_beliefs and elicits:  # binary's format alone elicits beliefs
            follow_ups.append(self._belief_request(group, rollout))
        rollout.turn_no += 1
        follow_ups.append(self._turn_request(group, rollout))
        return follow_ups

    def _trajectories(self, group: GroupInFlight) -> list[Trajectory]:
        return group_trajectories(
            group,
            settings=self._settings,
            stop=self._stops[group.job.question.kind],
            backend=self._backend,
            agent_id=self._agent_id,
            policy_version=self._policy_version,
        )


def run_group(
    question: Question,
    backend: PolicyBackend,
    corpus: Corpus,
    *,
    samples: int,
    agent_id: int,
    policy_version: int,
    settings: GenerationSettings = GenerationSettings(),
    seed: int | None = None,
    as_of: datetime | None = None,
) -> list[Trajectory]:
    """The `samples` rollouts of one question, through the engine; sample i's rollout seed
    is seed + i (random without a seed). Raises when the group cannot be forecast."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    base = secrets.randbits(32) if seed is None else seed
    job = GroupJob(
        question=question,
        samples=tuple(range(samples)),
        seeds=tuple(base + i for i in range(samples)),
        as_of=utc_now() if as_of is None else as_of,
    )
    groups: list[list[Trajectory]] = []
    RolloutEngine(backend, corpus, settings, agent_id=agent_id, policy_version=policy_version).run(
        [job], lambda _job, trajectories: groups.append(trajectories)
    )
    return groups[0]
