"""The rollout engine against a slow reference: one rollout at a time, one turn per
`generate` call of one prompt, seeded per (question, version, sample) like the engine. The
engine batches every active rollout of every question into each decode step and refills as
rollouts end; its rollouts must be the reference's, token for token."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

import pytest
import torch

from futureworld.agent.engine import FailureKind, GroupFailure, GroupJob, RolloutEngine
from futureworld.agent.loop import (
    LAST_TURN_NOTICE,
    PromptTooLong,
    Rollout,
    append_generation,
    call_tool,
    fit_prompt,
    rollout_seed,
    turn_seed,
)
from futureworld.agent.parsing import ACTION_STOP_STRINGS
from futureworld.agent.prompts import encode_prompt, observation_frame
from futureworld.agent.tools import Corpus
from futureworld.domain import GenerationSettings, StopReason, Trajectory
from futureworld.policy.base import FinishReason, Generation, SamplingParams
from futureworld.policy.batching import ContinuousBatch
from futureworld.policy.local import LocalBackend
from futureworld.policy.streaming import SequentialStream
from futureworld.policy.tiny import init_tiny_model
from tests.agent.agent_doubles import (
    CUTOFF,
    RecordingCorpus,
    make_articles,
    make_question,
    teach_actions,
)

SETTINGS = GenerationSettings(temperature=0.8, max_turns=3, max_new_tokens=24)
VERSION = 5
TITLES = (
    "Will the central bank raise interest rates before April?",
    "Will oil prices fall below 60 dollars in March?",
    "Will the team win the final match of the season?",
)


@pytest.fixture(scope="module")
def taught_model(tmp_path_factory: pytest.TempPathFactory):
    backend = LocalBackend.from_pretrained(init_tiny_model(tmp_path_factory.mktemp("taught")))
    teach_actions(backend, make_question())
    return backend.model, backend.tokenizer


def _jobs(samples: int = 4) -> list[GroupJob]:
    return [
        GroupJob(
            question=make_question(id=10 + n, external_id=f"q{n}", title=title),
            samples=tuple(range(samples)),
            seeds=tuple(rollout_seed(0, 10 + n, VERSION, s) for s in range(samples)),
            as_of=CUTOFF + timedelta(days=3),
        )
        for n, title in enumerate(TITLES)
    ]


def _reference_rollouts(
    backend: LocalBackend, corpus: Corpus, job: GroupJob, settings: GenerationSettings
) -> list[Rollout]:
    """The slow loop: each rollout alone, each turn one `generate` call of one prompt."""
    tokenizer = backend.tokenizer
    closed = job.question.close_at
    as_of = job.as_of if closed is None else min(job.as_of, closed)
    prompt = encode_prompt(tokenizer, job.question, as_of=as_of)
    frame = observation_frame(tokenizer)
    out = []
    for sample, seed in zip(job.samples, job.seeds, strict=True):
        rollout = Rollout(index=sample, seed=seed)
        for turn_no in range(settings.max_turns):
            budget = settings.max_total_tokens - len(prompt) - len(rollout.completion)
            params = SamplingParams(
                temperature=settings.temperature,
                max_new_tokens=min(settings.max_new_tokens, budget),
                seed=turn_seed(seed, turn_no),
                stop=ACTION_STOP_STRINGS,
            )
            [generation] = backend.generate([prompt + rollout.completion], params)
            action = append_generation(rollout, generation, budget, tokenizer)
            if rollout.stop is not None:
                break
            if turn_no + 1 == settings.max_turns:
                rollout.stop = StopReason.MAX_TURNS
                break
            call_tool(rollout, action, corpus, as_of, prompt, frame, settings, tokenizer)
            if rollout.stop is not None:
                break
        out.append(rollout)
    return out


def _run(engine: RolloutEngine, jobs: Sequence[GroupJob]):
    groups: list[tuple[GroupJob, list[Trajectory]]] = []
    failures: list[GroupFailure] = []
    stats = engine.run(jobs, lambda job, group: groups.append((job, group)), failures.append)
    return groups, failures, stats


@pytest.mark.parametrize("max_batch_tokens", [65_536, 700])
def test_engine_rollouts_equal_the_one_at_a_time_loop(taught_model, max_batch_tokens: int):
    model, tokenizer = taught_model
    # 700 tokens hold two rows: rollouts of all three questions join as others end.
    backend = LocalBackend(model, tokenizer, max_batch_tokens=max_batch_tokens)
    streams: list[ContinuousBatch] = []

    def open_stream() -> ContinuousBatch:
        streams.append(LocalBackend.open_stream(backend))
        return streams[-1]

    backend.open_stream = open_stream  # type: ignore[method-assign]
    jobs = _jobs()
    corpus = RecordingCorpus(make_articles())
    engine = RolloutEngine(backend, corpus, SETTINGS, agent_id=3, policy_version=VERSION)
    groups, failures, stats = _run(engine, jobs)
    assert not failures and stats.groups == len(jobs)
    assert sorted(job.question.id for job, _ in groups) == [10, 11, 12]
    multi_turn = 0
    continued: set[tuple[int, ...]] = set()  # the distinct prompts of turns after the first
    for job, group in groups:
        reference = _reference_rollouts(backend, RecordingCorpus(make_articles()), job, SETTINGS)
        assert [t.sample_index for t in group] == list(job.samples)
        for trajectory, expected in zip(group, reference, strict=True):
            assert list(trajectory.completion_token_ids) == expected.completion
            assert list(trajectory.loss_mask) == expected.mask
            assert torch.allclose(
                torch.tensor(trajectory.behaviour_logprobs),
                torch.tensor(expected.logprobs),
                atol=1e-5,
            )
            assert [t.role for t in trajectory.turns] == [t.role for t in expected.turns]
            assert trajectory.stop_reason is expected.stop
            assert trajectory.sampling["seed"] == expected.seed
            multi_turn += any(t.role == "tool" for t in trajectory.turns)
            continued.update(
                (job.question.id, *trajectory.completion_token_ids[: t.token_start])
                for t in trajectory.turns[1:]
                if t.role == "assistant"
            )
    assert multi_turn > 0  # the comparison covers tool turns, not only one-turn answers
    # every turn after the first continued its conversation's kept keys and values (rows
    # with one prompt joining together look it up once); 700 tokens keep two conversations,
    # so most are dropped before their next turn, which then prefills them again
    hits = sum(s.kept.hits for s in streams)
    assert continued
    assert hits >= len(continued) if max_batch_tokens > 10_000 else hits < len(continued)
    # identical calls of the run shared one corpus read (and one tokenizing), as-of included
    calls = [  # (the search's as-of, the call's turn: the notice follows, tool, argument)
        (min(job.as_of, job.question.close_at or job.as_of), n, t.tool_name, t.tool_args)
        for job, group in groups
        for g in group
        for n, t in enumerate(t for t in g.turns if t.role == "tool")
    ]
    assert len(corpus.as_of_seen) == len(set(calls)) < len(calls)
    assert stats.tool_calls_shared == len(calls) - len(set(calls))


class SlowCorpus(RecordingCorpus):
    """Each query takes a random while up to `longest` s, drawn from its own generator."""

    def __init__(self, articles, delays: random.Random, longest: float) -> None:
        super().__init__(articles)
        self._delays, self._longest = delays, longest

    def search(self, query, as_of, k):
        time.sleep(self._delays.uniform(0.0, self._longest))
        return super().search(query, as_of, k)

    def open(self, article_id, as_of):
        time.sleep(self._delays.uniform(0.0, self._longest))
        return super().open(article_id, as_of)


def _recorded_run(model, tokenizer, corpus: Corpus):
    """The engine's run of 3 questions x 6 over `corpus` on the local backend: the keys of
    the rows of every decode step, each step's duration, and the groups."""
    backend = LocalBackend(model, tokenizer, max_batch_tokens=65_536)
    steps: list[tuple[int, ...]] = []
    durations: list[float] = []

    def open_stream() -> ContinuousBatch:
        stream = LocalBackend.open_stream(backend)
        advance = stream.advance

        def recorded():
            steps.append(tuple(sorted(r.request.key for r in stream._rows + stream._joining)))
            began = time.perf_counter()
            results = advance()
            durations.append(time.perf_counter() - began)
            return results

        stream.advance = recorded  # type: ignore[method-assign]
        return stream

    backend.open_stream = open_stream  # type: ignore[method-assign]
    engine = RolloutEngine(backend, corpus, SETTINGS, agent_id=3, policy_version=VERSION)
    groups, failures, _ = _run(engine, _jobs(samples=6))
    assert not failures
    return steps, durations, [(job.question.id, group) for job, group in groups]


def test_a_seeded_run_repeats_whatever_time_its_tool_calls_take(taught_model):
    """On the local backend a tool call's result joins the decode step after the one it ran
    beside, however long it took: the rows of every step, and every token and log-prob, are
    those of a run with instant queries when each query takes a random while of up to four
    decode steps of this machine. (When a result joined at the first check that found it
    finished, the steps' rows followed the machine's load and this failed.)"""
    model, tokenizer = taught_model
    steps, durations, groups = _recorded_run(model, tokenizer, RecordingCorpus(make_articles()))
    assert sum(any(t.role == "tool" for t in g.turns) for _, gs in groups for g in gs) > 4
    longest = 4 * sorted(durations)[len(durations) // 2]
    for delay_seed in (1, 2):
        corpus = SlowCorpus(make_articles(), random.Random(delay_seed), longest)
        slow_steps, _, slow_groups = _recorded_run(model, tokenizer, corpus)
        assert slow_steps == steps
        for (id_1, group_1), (id_2, group_2) in zip(groups, slow_groups, strict=True):
            assert id_1 == id_2
            for a, b in zip(group_1, group_2, strict=True):
                assert a.completion_token_ids == b.completion_token_ids
                assert a.behaviour_logprobs == b.behaviour_logprobs  # exactly: the same steps


class StaggeredBackend:
    """A stand-in model whose rollout with seed s searches s times, then answers: rollouts of
    one group end many turns apart. Turn t of seed s arrives as seed s + t·1000003."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self.fail_seeds: set[int] = set()

    @property
    def tokenizer(self):
        return self._tokenizer

    def describe(self) -> str:
        return "staggered"

    def open_stream(self) -> SequentialStream:
        return SequentialStream(self.generate)

    def generate(self, prompts, params: SamplingParams) -> list[Generation]:
        assert params.seed is not None
        turn, rollout = divmod(params.seed, 1_000_003)
        if rollout in self.fail_seeds:
            raise ConnectionError(f"server lost rollout {rollout}")
        reply = "<search>rates</search>" if turn < rollout else "<probability>0.3</probability>"
        ids = tuple(self._tokenizer.encode(reply, add_special_tokens=False))
        return [
            Generation(token_ids=ids, logprobs=(-0.5,) * len(ids), finish_reason=FinishReason.STOP)
            for _ in prompts
        ]


def test_a_group_ending_at_very_different_times_is_handed_over_once_complete(
    tiny_backend: LocalBackend,
):
    backend = StaggeredBackend(tiny_backend.tokenizer)
    settings = GenerationSettings(max_turns=8, max_new_tokens=16)
    slow = GroupJob(
        question=make_question(id=1), samples=(0, 1, 2, 3), seeds=(0, 2, 4, 6), as_of=CUTOFF
    )
    fast = GroupJob(
        question=make_question(id=2), samples=(0, 1, 2, 3), seeds=(0, 0, 1, 0), as_of=CUTOFF
    )
    engine = RolloutEngine(
        backend, RecordingCorpus(make_articles()), settings, agent_id=1, policy_version=0
    )
    groups, failures, _ = _run(engine, [slow, fast])
    assert not failures
    assert [job.question.id for job, _ in groups] == [2, 1]  # the fast group is out first
    _, slow_group = groups[1]
    assert [t.sample_index for t in slow_group] == [0, 1, 2, 3]
    assert [sum(turn.role == "tool" for turn in t.turns) for t in slow_group] == [0, 2, 4, 6]
    assert all(t.stop_reason is StopReason.ANSWERED and t.p_yes == 0.3 for t in slow_group)


class TwoSlotStream(SequentialStream):
    """Two requests in flight at most; each step takes long enough for the tool calls it
    follows to have finished. Records the (turn, key) of every request it takes."""

    def __init__(self, generate, step_s: float = 0.2) -> None:
        super().__init__(generate)
        self.offered: list[tuple[int, int]] = []
        self._step_s = step_s

    def offer(self, request) -> bool:
        if len(self._waiting) >= 2:
            return False
        self.offered.append((request.params.seed // 1_000_003, request.key))
        return super().offer(request)

    def advance(self):
        time.sleep(self._step_s)
        return super().advance()


def _three_turn_engine(backend) -> RolloutEngine:
    """The engine the ordering tests run: up to 3 turns of 16 tokens over the test articles."""
    return RolloutEngine(
        backend,
        RecordingCorpus(make_articles()),
        GenerationSettings(max_turns=3, max_new_tokens=16),
        agent_id=1,
        policy_version=0,
    )


def _on_two_slots(tiny_backend: LocalBackend, seeds: list[tuple[int, int]]):
    """Groups of two rollouts (question i + 1 with seeds[i]: how many times each searches)
    run through the engine on one TwoSlotStream, up to 3 turns: (groups, failures, stream)."""
    backend = StaggeredBackend(tiny_backend.tokenizer)
    streams: list[TwoSlotStream] = []

    def open_stream() -> TwoSlotStream:
        streams.append(TwoSlotStream(backend.generate))
        return streams[-1]

    backend.open_stream = open_stream  # type: ignore[method-assign]
    jobs = [
        GroupJob(question=make_question(id=i), samples=(0, 1), seeds=pair, as_of=CUTOFF)
        for i, pair in enumerate(seeds, start=1)
    ]
    engine = _three_turn_engine(backend)
    groups, failures, _ = _run(engine, jobs)
    [stream] = streams
    return groups, failures, stream


def test_the_observation_before_the_last_turn_says_to_answer(tiny_backend: LocalBackend):
    """With 3 turns: the observation after turn 0 leads into turn 1 (no notice), the one after
    turn 1 into the last turn (the notice); a tool call on the last turn ends unanswered."""
    backend = StaggeredBackend(tiny_backend.tokenizer)
    job = GroupJob(question=make_question(id=1), samples=(0, 1, 2), seeds=(1, 2, 3), as_of=CUTOFF)
    groups, failures, _ = _run(_three_turn_engine(backend), [job])
    assert not failures
    [(_, group)] = groups
    notices = [
        [LAST_TURN_NOTICE in turn.text for turn in t.turns if turn.role == "tool"] for t in group
    ]
    assert notices == [[False], [False, True], [False, True]]
    assert [t.stop_reason for t in group] == [
        StopReason.ANSWERED,
        StopReason.ANSWERED,
        StopReason.MAX_TURNS,
    ]
    last = next(turn for turn in group[1].turns[::-1] if turn.role == "tool")
    tokenizer = tiny_backend.tokenizer
    stored = group[1].completion_token_ids[last.token_start : last.token_end]
    assert LAST_TURN_NOTICE in tokenizer.decode(list(stored))  # in the tokens, not just the text


def test_requests_go_in_the_order_they_became_ready(tiny_backend: LocalBackend):
    """The next turns of the first group, ready once their searches return, wait behind the
    first turns encoded before them (while the stream was full): sending the oldest group's
    turns first made the last groups' later turns run on a draining stream."""
    # group 1 searches once
    groups, failures, stream = _on_two_slots(tiny_backend, [(1, 1), (0, 0), (0, 0)])
    assert not failures and len(groups) == 3
    assert sorted(turn for turn, _ in stream.offered) == [0] * 6 + [1] * 2
    keys = [key for _, key in stream.offered]  # made as each request became ready
    assert keys == sorted(keys)


def test_first_turns_of_the_lookahead_go_before_any_follow_up(tiny_backend: LocalBackend):
    """Groups start ahead of the stream up to LOOKAHEAD_ROLLOUTS unfinished rollouts, so
    every first turn of a batch smaller than that is sent before the searches' next turns:
    when next turns went ahead of later groups' first turns, those groups' own next turns
    ran at the end on a draining stream (benchmarks/predict_http.py: 0.85 -> 0.91 of
    max_concurrency, 32 questions, 3 turns, 0.2 s requests)."""
    # groups 1 and 2 search twice and once; five more answer at once
    groups, failures, stream = _on_two_slots(tiny_backend, [(2, 2), (1, 1)] + [(0, 0)] * 5)
    assert not failures and len(groups) == 7
    assert [turn for turn, _ in stream.offered] == [0] * 14 + [1] * 4 + [2] * 2


def test_jobs_are_pulled_only_up_to_the_lookahead(
    tiny_backend: LocalBackend, monkeypatch: pytest.MonkeyPatch
):
    """A caller that claims work per job pulled holds claims on about the lookahead's
    rollouts, not on the whole batch: a job is pulled only while fewer rollouts than
    LOOKAHEAD_ROLLOUTS are unfinished, so no more groups than that are ever open."""
    monkeypatch.setattr("futureworld.agent.engine.LOOKAHEAD_ROLLOUTS", 4)
    backend = StaggeredBackend(tiny_backend.tokenizer)
    # Each step outlasts the tool calls it follows (as in _on_two_slots): a rollout waiting on a
    # tool is neither ready nor in flight, and an engine with nothing ready pulls a job to keep
    # the stream fed, so with tools slower than steps more groups would be open.
    backend.open_stream = lambda: TwoSlotStream(backend.generate, step_s=0.05)  # type: ignore[method-assign]
    done: list[int] = []
    open_at_pull: list[int] = []

    def jobs():
        for i in range(1, 21):
            open_at_pull.append(i - 1 - len(done))
            yield GroupJob(question=make_question(id=i), samples=(0, 1), seeds=(1, 0), as_of=CUTOFF)

    engine = _three_turn_engine(backend)
    stats = engine.run(jobs(), lambda job, group: done.append(job.question.id))
    assert stats.groups == 20 and len(done) == 20
    assert max(open_at_pull) <= 3  # every open group holds an unfinished rollout


class FailsOnce(RecordingCorpus):
    """Its first search raises; the rest answer."""

    def search(self, query, as_of, k):
        self.fail = not self.as_of_seen
        return super().search(query, as_of, k)


def test_a_failed_tool_call_is_not_shared_with_calls_made_after_it_was_taken_back(
    tiny_backend: LocalBackend,
):
    """Identical calls share one corpus read, but not its failure once it is known: the first
    group's search fails (its rollout stops with the error); the third group, started after
    that, makes the same search and reads the corpus again."""
    backend = StaggeredBackend(tiny_backend.tokenizer)
    stream = TwoSlotStream(backend.generate, step_s=0.0)
    backend.open_stream = lambda: stream  # type: ignore[method-assign]
    corpus = FailsOnce(make_articles())
    engine = RolloutEngine(
        backend,
        corpus,
        GenerationSettings(max_turns=3, max_new_tokens=16),
        agent_id=1,
        policy_version=0,
    )
    jobs = [  # seed 1 searches once, seed 0 answers at once
        GroupJob(question=make_question(id=i), samples=(0,), seeds=(seed,), as_of=CUTOFF)
        for i, seed in ((1, 1), (2, 0), (3, 1))
    ]
    groups, failures, stats = _run(engine, jobs)
    assert not failures
    stops = {job.question.id: group[0].stop_reason for job, group in groups}
    assert stops == {1: StopReason.TOOL_ERROR, 2: StopReason.ANSWERED, 3: StopReason.ANSWERED}
    assert len(corpus.as_of_seen) == 2 and stats.tool_calls_shared == 0


def test_a_failing_request_fails_its_group_only(tiny_backend: LocalBackend):
    backend = StaggeredBackend(tiny_backend.tokenizer)
    backend.fail_seeds = {5}
    settings = GenerationSettings(max_turns=8, max_new_tokens=16)
    jobs = [
        GroupJob(question=make_question(id=1), samples=(0, 1), seeds=(0, 1), as_of=CUTOFF),
        GroupJob(question=make_question(id=2), samples=(0, 1), seeds=(2, 5), as_of=CUTOFF),
        GroupJob(question=make_question(id=3), samples=(0, 1), seeds=(3, 0), as_of=CUTOFF),
    ]
    engine = RolloutEngine(
        backend, RecordingCorpus(make_articles()), settings, agent_id=1, policy_version=0
    )
    groups, failures, stats = _run(engine, jobs)
    assert sorted(job.question.id for job, _ in groups) == [1, 3]
    assert [(f.job.question.id, f.kind) for f in failures] == [(2, FailureKind.GENERATION_ERROR)]
    assert "server lost rollout 5" in failures[0].detail
    assert (stats.groups, stats.failed) == (2, 1)


class BrokenStepBackend(StaggeredBackend):
    """Its stream's whole step raises while a poisoned rollout is in the batch."""

    def open_stream(self) -> SequentialStream:
        backend = self

        class Stream(SequentialStream):
            def advance(self):
                if any(r.params.seed % 1_000_003 in backend.fail_seeds for r in self._waiting):
                    self._waiting = []
                    raise RuntimeError("device error in a batched step")
                return super().advance()

        return Stream(self.generate)


def test_a_failing_batched_step_is_isolated_to_the_group_that_fails_alone(
    tiny_backend: LocalBackend,
):
    backend = BrokenStepBackend(tiny_backend.tokenizer)
    backend.fail_seeds = {7}
    jobs = [
        GroupJob(question=make_question(id=1), samples=(0, 1), seeds=(1, 2), as_of=CUTOFF),
        GroupJob(question=make_question(id=2), samples=(0, 1), seeds=(3, 7), as_of=CUTOFF),
        GroupJob(question=make_question(id=3), samples=(0, 1), seeds=(2, 1), as_of=CUTOFF),
    ]
    engine = RolloutEngine(
        backend,
        RecordingCorpus(make_articles()),
        GenerationSettings(max_turns=9, max_new_tokens=16),
        agent_id=1,
        policy_version=0,
    )
    groups, failures, _ = _run(engine, jobs)
    assert sorted(job.question.id for job, _ in groups) == [1, 3]
    assert [f.job.question.id for f in failures] == [2]
    assert "device error" in failures[0].detail
    for _, group in groups:  # re-run from scratch: complete, nothing doubled
        assert [t.stop_reason for t in group] == [StopReason.ANSWERED] * 2


def test_an_over_long_prompt_is_cut_background_first_then_criteria(tiny_backend: LocalBackend):
    tokenizer = tiny_backend.tokenizer
    question = make_question(
        background="Inflation rose again. " * 200, resolution_criteria="YES if higher. " * 100
    )
    full = len(encode_prompt(tokenizer, question, as_of=CUTOFF))
    short = replace(question, background="", resolution_criteria="")
    bare = len(encode_prompt(tokenizer, short, as_of=CUTOFF))
    criteria_only = len(encode_prompt(tokenizer, replace(question, background=""), as_of=CUTOFF))

    def fitted(max_total: int):
        settings = GenerationSettings(max_new_tokens=16, max_total_tokens=max_total)
        return fit_prompt(tokenizer, question, as_of=CUTOFF, settings=settings)

    roomy = fitted(full + 16)
    assert roomy.cut is None and len(roomy.ids) == full
    background_cut = fitted(criteria_only + 16 + 40)
    text = tokenizer.decode(background_cut.ids)
    assert "[…]" in text and "YES if higher. " * 100 in text
    assert background_cut.cut.startswith("background") and len(background_cut.ids) <= (
        criteria_only + 40
    )
    both_cut = fitted(bare + 16 + 20)
    assert "resolution_criteria" in both_cut.cut and "Inflation" not in tokenizer.decode(
        both_cut.ids
    )
    assert len(both_cut.ids) <= bare + 20
    with pytest.raises(PromptTooLong, match="after cutting"):
        fitted(bare + 16 - 1)


def test_a_prompt_too_long_fails_its_group_and_the_rest_go_on(tiny_backend: LocalBackend):
    backend = StaggeredBackend(tiny_backend.tokenizer)
    settings = GenerationSettings(max_turns=2, max_new_tokens=16, max_total_tokens=600)
    jobs = [
        GroupJob(
            question=make_question(id=1, title="Will it rain? " * 300),
            samples=(0,),
            seeds=(0,),
            as_of=CUTOFF,
        ),
        GroupJob(question=make_question(id=2), samples=(0,), seeds=(0,), as_of=CUTOFF),
    ]
    engine = RolloutEngine(
        backend, RecordingCorpus(make_articles()), settings, agent_id=1, policy_version=0
    )
    groups, failures, _ = _run(engine, jobs)
    assert [job.question.id for job, _ in groups] == [2]
    assert [(f.job.question.id, f.kind) for f in failures] == [(1, FailureKind.PROMPT_TOO_LONG)]
