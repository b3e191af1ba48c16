"""The rollout engine on every question kind: one stream runs binary, choice and numeric
groups side by side; each turn stops at its kind's stop strings, the final answer is parsed in
its kind's format into the trajectory, and beliefs are elicited on binary questions only."""

from __future__ import annotations

from futureworld.agent.engine import GroupJob, RolloutEngine
from futureworld.agent.parsing import action_stop_strings
from futureworld.domain import (
    GenerationSettings,
    NumericSpec,
    ParseStatus,
    QuestionKind,
    StopReason,
    Trajectory,
)
from futureworld.policy.base import FinishReason, Generation, SamplingParams
from futureworld.policy.local import LocalBackend
from futureworld.policy.streaming import SequentialStream
from tests.agent.agent_doubles import CUTOFF, RecordingCorpus, make_articles, make_question

ANSWERS = {
    "</probability>": "<probability>0.3</probability>",
    "</probabilities>": "<probabilities>A: 0.2, B: 0.5, C: 0.3</probabilities>",
    "</quantiles>": "<quantiles>5%: 10, 25%: 14, 50%: 17, 75%: 21, 95%: 30</quantiles>",
}


class KindScriptBackend:
    """A stand-in model that searches on its first turn, then answers in the format whose
    closing tag is among the request's stop strings (or, with `wrong`, always in the binary
    format); a belief request (no tool stop strings) answers "0.6</probability>"."""

    def __init__(self, tokenizer, *, wrong: bool = False) -> None:
        self._tokenizer = tokenizer
        self.wrong = wrong
        self.requests: list[SamplingParams] = []

    @property
    def tokenizer(self):
        return self._tokenizer

    def describe(self) -> str:
        return "kind-script"

    def open_stream(self) -> SequentialStream:
        return SequentialStream(self.generate)

    def generate(self, prompts, params: SamplingParams) -> list[Generation]:
        self.requests.append(params)
        assert params.seed is not None
        if "</search>" not in params.stop:
            reply = "0.6</probability>"
        elif params.seed % 1_000_003 == params.seed:  # turn 0
            reply = "<search>bank rates</search>"
        elif self.wrong:
            reply = ANSWERS["</probability>"]
        else:
            [closing] = [s for s in params.stop if s in ANSWERS]
            reply = ANSWERS[closing]
        ids = tuple(self._tokenizer.encode(reply, add_special_tokens=False))
        return [
            Generation(token_ids=ids, logprobs=(-0.5,) * len(ids), finish_reason=FinishReason.STOP)
            for _ in prompts
        ]


def _kind_jobs() -> list[GroupJob]:
    binary = make_question(id=1)
    choice = make_question(
        id=2,
        external_id="c",
        title="Which bank moves first?",
        kind=QuestionKind.CHOICE,
        options=("North", "South", "East"),
    )
    numeric = make_question(
        id=3,
        external_id="n",
        title="What will the policy rate be?",
        kind=QuestionKind.NUMERIC,
        extra=NumericSpec(lower=0.0, upper=100.0, unit="bp").to_extra(),
    )
    return [
        GroupJob(question=q, samples=(0, 1), seeds=(11 * q.id, 11 * q.id + 1), as_of=CUTOFF)
        for q in (binary, choice, numeric)
    ]


def _run(backend, settings: GenerationSettings) -> dict[QuestionKind, list[Trajectory]]:
    engine = RolloutEngine(
        backend, RecordingCorpus(make_articles()), settings, agent_id=1, policy_version=0
    )
    jobs = _kind_jobs()
    groups: dict[QuestionKind, list[Trajectory]] = {}
    stats = engine.run(jobs, lambda job, group: groups.__setitem__(job.question.kind, group))
    assert stats.groups == 3 and stats.failed == 0
    return groups


def test_each_kind_answers_in_its_own_format_through_one_stream(tiny_backend: LocalBackend):
    backend = KindScriptBackend(tiny_backend.tokenizer)
    groups = _run(backend, GenerationSettings(max_turns=4, max_new_tokens=32))
    for kind, group in groups.items():
        for t in group:
            assert t.stop_reason is StopReason.ANSWERED and t.parse_status is ParseStatus.OK
            assert [turn.role for turn in t.turns] == ["assistant", "tool", "assistant"]
            assert t.sampling["stop"] == list(action_stop_strings(kind))
    assert all(t.p_yes == 0.3 and t.choice is None for t in groups[QuestionKind.BINARY])
    for t in groups[QuestionKind.CHOICE]:
        assert t.choice == 1 and t.p_yes == 0.5
        assert t.probabilities == (0.2, 0.5, 0.3) and t.quantiles == ()
    for t in groups[QuestionKind.NUMERIC]:
        assert t.quantiles == (10.0, 14.0, 17.0, 21.0, 30.0)
        assert t.p_yes is None and t.choice is None and t.probabilities == ()
    # Every turn request carried its own question's stop strings, never another kind's.
    turn_stops = {tuple(p.stop) for p in backend.requests}
    assert turn_stops == {action_stop_strings(kind) for kind in QuestionKind}


def test_beliefs_are_elicited_on_binary_questions_only(tiny_backend: LocalBackend):
    backend = KindScriptBackend(tiny_backend.tokenizer)
    groups = _run(backend, GenerationSettings(max_turns=4, max_new_tokens=32, elicit_beliefs=True))
    beliefs = {
        kind: [turn.belief for t in group for turn in t.turns if turn.role == "tool"]
        for kind, group in groups.items()
    }
    assert beliefs[QuestionKind.BINARY] == [0.6, 0.6]
    assert beliefs[QuestionKind.CHOICE] == [None, None]
    assert beliefs[QuestionKind.NUMERIC] == [None, None]
    belief_requests = [p for p in backend.requests if "</search>" not in p.stop]
    assert len(belief_requests) == 2  # one per binary rollout's tool turn


def test_another_kinds_answer_ends_the_rollout_without_an_answer(tiny_backend: LocalBackend):
    backend = KindScriptBackend(tiny_backend.tokenizer, wrong=True)
    groups = _run(backend, GenerationSettings(max_turns=4, max_new_tokens=32))
    assert all(t.parse_status is ParseStatus.OK for t in groups[QuestionKind.BINARY])
    for kind in (QuestionKind.CHOICE, QuestionKind.NUMERIC):
        for t in groups[kind]:
            assert t.stop_reason is StopReason.NO_ACTION
            assert t.parse_status is ParseStatus.WRONG_FORMAT
            assert t.p_yes is None and t.choice is None and t.quantiles == ()
