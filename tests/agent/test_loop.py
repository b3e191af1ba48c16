from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
import torch

from futureworld.agent.engine import run_group
from futureworld.agent.prompts import BELIEF_PREFIX, encode_prompt
from futureworld.domain import GenerationSettings, ParseStatus, StopReason, Trajectory
from futureworld.policy.local import LocalBackend
from futureworld.policy.tiny import init_tiny_model
from tests.agent.agent_doubles import (
    CUTOFF,
    RecordingCorpus,
    ScriptedBackend,
    make_articles,
    make_question,
    teach_actions,
)

TEMPERATURE = 0.8
SEED = 17
LATER = CUTOFF + timedelta(days=10)


@pytest.fixture(scope="module")
def taught_backend(tmp_path_factory: pytest.TempPathFactory) -> LocalBackend:
    backend = LocalBackend.from_pretrained(init_tiny_model(tmp_path_factory.mktemp("taught")))
    teach_actions(backend, make_question())
    return backend


def _settings(**kw) -> GenerationSettings:
    return GenerationSettings(temperature=TEMPERATURE, **kw)


def _run(backend, corpus=None, samples=2, config=None, **kw) -> list[Trajectory]:
    return run_group(
        kw.pop("question", make_question()),
        backend,
        corpus or RecordingCorpus(make_articles()),
        samples=samples,
        seed=SEED,
        agent_id=3,
        policy_version=5,
        as_of=kw.pop("as_of", LATER),
        settings=config or _settings(),
    )


def _assert_mask_covers_exactly_the_assistant_turns(trajectory: Trajectory) -> None:
    generated = set()
    for turn in trajectory.turns:
        if turn.role == "assistant":
            generated.update(range(turn.token_start, turn.token_end))
    assert {i for i, m in enumerate(trajectory.loss_mask) if m == 1} == generated
    spans = [(t.token_start, t.token_end) for t in trajectory.turns]
    assert spans[0][0] == 0 and spans[-1][1] == len(trajectory.completion_token_ids)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    for position, mask in enumerate(trajectory.loss_mask):
        if mask == 0:
            assert trajectory.behaviour_logprobs[position] == 0.0


def test_real_tiny_model_rollouts_replay_to_their_behaviour_logprobs(
    taught_backend: LocalBackend,
):
    trajectories = _run(taught_backend, samples=6, config=_settings(max_new_tokens=24))
    assert any(any(t.role == "tool" for t in tr.turns) for tr in trajectories)
    for trajectory in trajectories:
        _assert_mask_covers_exactly_the_assistant_turns(trajectory)
        prompt = list(trajectory.prompt_token_ids)
        ids = torch.tensor([prompt + list(trajectory.completion_token_ids)])
        with torch.no_grad():
            logits = taught_backend.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        logp = torch.log_softmax(logits.float() / TEMPERATURE, dim=-1)
        replay = logp.gather(1, ids[0, len(prompt) :, None]).squeeze(1)
        mask = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
        stored = torch.tensor(trajectory.behaviour_logprobs)
        assert torch.allclose(replay[mask], stored[mask], atol=1e-4)
        assert trajectory.sampling["temperature"] == TEMPERATURE
        assert trajectory.timings["generate_s"] > 0


def test_untrained_tiny_model_runs_through_the_loop(tiny_backend: LocalBackend):
    trajectories = _run(tiny_backend, samples=4, config=_settings(max_new_tokens=16))
    assert [t.sample_index for t in trajectories] == [0, 1, 2, 3]
    for trajectory in trajectories:
        assert trajectory.idempotency_key.startswith("q7-a3-v5-s")
        assert trajectory.stop_reason in set(StopReason)
        _assert_mask_covers_exactly_the_assistant_turns(trajectory)


def test_observations_enter_the_context_once_as_tokenized_once(tiny_backend: LocalBackend):
    tokenizer = tiny_backend.tokenizer
    scripted = ScriptedBackend(
        tokenizer, [["<search>central bank rates</search>"], ["So <probability>0.7</probability>"]]
    )
    trajectory = _run(scripted, samples=1)[0]
    assert trajectory.stop_reason is StopReason.ANSWERED
    assert (trajectory.p_yes, trajectory.parse_status) == (0.7, ParseStatus.OK)
    assert [t.role for t in trajectory.turns] == ["assistant", "tool", "assistant"]
    tool = trajectory.turns[1]
    observation = list(trajectory.completion_token_ids[tool.token_start : tool.token_end])
    assert observation == tokenizer.encode(tool.text, add_special_tokens=False)
    assert "Central bank holds rates steady" in tool.text and tool.tool_result_ids
    completion = list(trajectory.completion_token_ids)
    occurrences = [
        i for i in range(len(completion)) if completion[i : i + len(observation)] == observation
    ]
    assert occurrences == [tool.token_start]
    # Tokens in, tokens out: turn 2 saw exactly the prompt plus everything appended so far.
    second_context = scripted.calls[1][0][0]
    assert second_context == list(trajectory.prompt_token_ids) + completion[: tool.token_end]
    pairs = zip(trajectory.behaviour_logprobs, trajectory.loss_mask, strict=True)
    generated = [lp for lp, m in pairs if m]
    assert generated == sorted(generated, reverse=True) and all(lp < 0 for lp in generated)
    _assert_mask_covers_exactly_the_assistant_turns(trajectory)


@pytest.mark.parametrize(
    ("replies", "stop_reason", "parse_status"),
    [
        (["I am not sure what to do."], StopReason.NO_ACTION, ParseStatus.MISSING),
        (["<probability>very likely</probability>"], StopReason.ANSWERED, ParseStatus.MALFORMED),
        (["<probability>1.5</probability>"], StopReason.ANSWERED, ParseStatus.OUT_OF_RANGE),
        (["\\boxed{0}"], StopReason.ANSWERED, ParseStatus.OK),
        (["<search>rates</search>"], StopReason.MAX_TURNS, ParseStatus.MISSING),
        (["<open>999</open>"], StopReason.MAX_TURNS, ParseStatus.MISSING),
    ],
)
def test_scripted_behaviour_ends_with_the_right_stop_reason(
    tiny_backend: LocalBackend, replies: list[str], stop_reason: StopReason, parse_status
):
    scripted = ScriptedBackend(tiny_backend.tokenizer, [replies])
    trajectories = _run(scripted, samples=3, config=_settings(max_turns=3))
    for trajectory in trajectories:
        assert trajectory.stop_reason is stop_reason
        assert trajectory.parse_status is parse_status
        _assert_mask_covers_exactly_the_assistant_turns(trajectory)
    if stop_reason is StopReason.MAX_TURNS:
        assert [t.role for t in trajectories[0].turns] == ["assistant", "tool"] * 2 + ["assistant"]
    if replies == ["<open>999</open>"]:
        assert "No article with id 999" in trajectories[0].turns[1].text


def test_a_failing_corpus_ends_the_rollout_with_tool_error(tiny_backend: LocalBackend):
    scripted = ScriptedBackend(tiny_backend.tokenizer, [["<search>rates</search>"]])
    corpus = RecordingCorpus(make_articles(), fail=True)
    trajectory = _run(scripted, corpus, samples=1)[0]
    assert trajectory.stop_reason is StopReason.TOOL_ERROR
    assert "full-text index unavailable" in trajectory.turns[-1].text
    assert trajectory.turns[-1].token_start == trajectory.turns[-1].token_end


def test_running_out_of_total_tokens_stops_with_max_tokens(tiny_backend: LocalBackend):
    scripted = ScriptedBackend(tiny_backend.tokenizer, [["<open>4</open>"]])
    prompt_len = len(
        encode_prompt(tiny_backend.tokenizer, make_question(), as_of=make_question().info_cutoff_at)
    )
    config = _settings(max_new_tokens=16, max_total_tokens=prompt_len + 60)
    trajectory = _run(scripted, samples=1, config=config)[0]
    assert trajectory.stop_reason is StopReason.MAX_TOKENS
    used = len(trajectory.prompt_token_ids) + len(trajectory.completion_token_ids)
    assert used <= prompt_len + 60


def test_long_observations_are_cut_in_the_middle_with_a_marker(tiny_backend: LocalBackend):
    scripted = ScriptedBackend(tiny_backend.tokenizer, [["<open>4</open>"], ["\\boxed{0.4}"]])
    trajectory = _run(scripted, samples=1, config=_settings(max_observation_tokens=40))[0]
    tool = trajectory.turns[1]
    assert "tokens omitted" in tool.text and tool.text.rstrip().endswith("assistant")
    assert "Long bank report" in tool.text and tool.token_end - tool.token_start < 100
    assert trajectory.p_yes == 0.4


def test_search_never_sees_articles_after_the_questions_close(tiny_backend: LocalBackend):
    """A forecast searches as of its own instant, never past the question's close (here the
    close is the cut-off, and the forecast runs ten days later)."""
    corpus = RecordingCorpus(make_articles())
    scripted = ScriptedBackend(
        tiny_backend.tokenizer, [["<search>central bank raises rates</search>"], ["<open>3</open>"]]
    )
    question = make_question(close_at=CUTOFF)
    trajectory = _run(
        scripted, corpus, samples=1, config=_settings(max_turns=3), question=question
    )[0]
    assert corpus.as_of_seen == [CUTOFF, CUTOFF]
    assert 3 not in trajectory.turns[1].tool_result_ids
    assert "raises rates by a quarter point" not in trajectory.turns[1].text
    assert "No article with id 3" in trajectory.turns[3].text
    assert trajectory.as_of == LATER
    prompt_text = tiny_backend.tokenizer.decode(trajectory.prompt_token_ids)
    assert "As of: 2026-03-01" in prompt_text and "Resolves by: 2026-04-10" in prompt_text


def test_beliefs_are_elicited_on_a_side_copy_after_each_tool_turn(tiny_backend: LocalBackend):
    tokenizer = tiny_backend.tokenizer
    scripted = ScriptedBackend(
        tokenizer, [["<search>rates</search>"], ["<probability>0.55</probability>"]]
    )
    config = _settings(elicit_beliefs=True)
    trajectories = _run(scripted, samples=2, config=config)
    belief_prefix = tokenizer.encode(BELIEF_PREFIX, add_special_tokens=False)
    contexts = [context for call in scripted.belief_calls for context in call]
    for context, trajectory in zip(contexts, trajectories, strict=True):
        tool = trajectory.turns[1]
        assert tool.belief == 0.6 and trajectory.p_yes == 0.55
        full = list(trajectory.prompt_token_ids) + list(trajectory.completion_token_ids)
        assert context == full[: len(trajectory.prompt_token_ids) + tool.token_end] + belief_prefix
        assert "Current estimate" not in tokenizer.decode(trajectory.completion_token_ids)


def test_invalid_inputs_are_rejected_with_clear_errors(tiny_backend: LocalBackend):
    with pytest.raises(ValueError, match="has no id"):
        _run(tiny_backend, question=make_question(id=None))
    with pytest.raises(ValueError, match="max_total_tokens"):
        _settings(max_new_tokens=100, max_total_tokens=50)
    with pytest.raises(ValueError, match="prompt has"):
        _run(tiny_backend, config=_settings(max_new_tokens=8, max_total_tokens=20))
