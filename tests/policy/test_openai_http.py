from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from futureworld.agent.engine import run_group
from futureworld.domain import GenerationSettings
from futureworld.policy.base import PolicyBackend, SamplingParams
from futureworld.policy.local import LocalBackend
from futureworld.policy.openai_http import (
    LOGPROBS_MODE,
    BackendError,
    NotServingError,
    OpenAIHttpBackend,
)
from tests.agent.agent_doubles import RecordingCorpus, make_articles, make_question
from tests.policy.completions_server import ServerState, serve_completions

PARAMS = SamplingParams(temperature=0.9, max_new_tokens=20, seed=40, stop=("</search>",))


def _prompts(backend: LocalBackend) -> list[list[int]]:
    encode = backend.tokenizer.encode
    return [
        encode("Question: rates?", add_special_tokens=False),
        encode("Hi", add_special_tokens=False),
    ]


def _client(url: str, model_dir: Path, **options: object) -> OpenAIHttpBackend:
    return OpenAIHttpBackend.from_tokenizer_dir(model_dir, base_url=url, model="tiny", **options)


@pytest.mark.parametrize("return_token_ids", [True, False])
def test_http_backend_returns_the_servers_tokens_and_logprobs(
    tiny_backend: LocalBackend, tiny_model_dir: Path, return_token_ids: bool
):
    state = ServerState(backend=tiny_backend, return_token_ids=return_token_ids)
    prompts = _prompts(tiny_backend)
    with serve_completions(state) as url:
        client = _client(url, tiny_model_dir)
        assert isinstance(client, PolicyBackend)
        generations = client.generate(prompts, PARAMS)
        client.close()
    # Prompt i is sent with seed + i, so the G identical prompts of a group differ.
    expected = [
        tiny_backend.generate([p], replace(PARAMS, seed=PARAMS.seed + i))[0]
        for i, p in enumerate(prompts)
    ]
    assert generations == expected
    sent = [body for path, body in state.requests if path == "/v1/completions"]
    assert sorted(body["prompt"] for body in sent) == sorted(prompts)
    for body in sent:
        assert body["return_tokens_as_token_ids"] is True
        assert body["skip_special_tokens"] is False and body["include_stop_str_in_output"] is True
        assert body["logprobs"] == 1 and body["stop"] == ["</search>"]


def test_identical_prompts_get_distinct_seeds(tiny_backend: LocalBackend, tiny_model_dir: Path):
    state = ServerState(backend=tiny_backend)
    prompt = _prompts(tiny_backend)[0]
    with serve_completions(state) as url:
        generations = _client(url, tiny_model_dir).generate([prompt] * 4, PARAMS)
    assert sorted(body["seed"] for _, body in state.requests) == [40, 41, 42, 43]
    assert len({g.token_ids for g in generations}) > 1


def test_a_500_is_retried_then_succeeds(tiny_backend: LocalBackend, tiny_model_dir: Path):
    state = ServerState(backend=tiny_backend, faults=["500"])
    prompt = _prompts(tiny_backend)[0]
    with serve_completions(state) as url:
        generation = _client(url, tiny_model_dir, backoff_s=0.01).generate([prompt], PARAMS)[0]
    assert len(state.requests) == 2
    assert generation == tiny_backend.generate([prompt], PARAMS)[0]


def test_a_stalled_server_times_out_and_fails_after_retries(
    tiny_backend: LocalBackend, tiny_model_dir: Path
):
    state = ServerState(backend=tiny_backend, faults=["stall", "stall"], stall_s=1.5)
    with serve_completions(state) as url:
        client = _client(url, tiny_model_dir, timeout_s=0.2, max_retries=1, backoff_s=0.0)
        started = time.perf_counter()
        with pytest.raises(BackendError, match=r"after 2 attempts.*Timeout"):
            client.generate([_prompts(tiny_backend)[0]], PARAMS)
        assert time.perf_counter() - started < 1.4
    assert len(state.requests) == 2


def test_a_client_error_is_not_retried(tiny_backend: LocalBackend, tiny_model_dir: Path):
    state = ServerState(backend=tiny_backend, faults=["400"])
    with serve_completions(state) as url:
        client = _client(url, tiny_model_dir)
        with pytest.raises(BackendError, match=r"HTTP 400.*bad request"):
            client.generate([_prompts(tiny_backend)[0]], PARAMS)
    assert len(state.requests) == 1


def test_a_model_the_server_does_not_serve_is_refused_before_sampling(
    tiny_backend: LocalBackend, tiny_model_dir: Path
):
    state = ServerState(backend=tiny_backend)
    with serve_completions(state) as url:
        client = _client(url, tiny_model_dir).with_model("agent-v2")
        with pytest.raises(NotServingError, match=r"serves \['tiny'\], not 'agent-v2'"):
            client.generate([_prompts(tiny_backend)[0]], PARAMS)
    assert state.requests == []  # nothing was sampled


def test_an_answer_from_another_model_is_refused(tiny_backend: LocalBackend, tiny_model_dir: Path):
    # a server restarted on another version between the check and the request
    state = ServerState(backend=tiny_backend, answer_as="agent-v1")
    with serve_completions(state) as url:
        client = _client(url, tiny_model_dir)
        with pytest.raises(NotServingError, match="answered with model 'agent-v1', not 'tiny'"):
            client.generate([_prompts(tiny_backend)[0]], PARAMS)


def test_load_adapter_registers_it_and_selects_it_by_model_name(
    tiny_backend: LocalBackend, tiny_model_dir: Path
):
    state = ServerState(backend=tiny_backend)
    with serve_completions(state) as url:
        client = _client(url, tiny_model_dir)
        client.load_adapter("policy-v3", "/checkpoints/v3")
        adapter_client = client.with_model("policy-v3")
        adapter_client.generate([_prompts(tiny_backend)[0]], PARAMS)
        client.unload_adapter("policy-v3")
    assert state.requests[0] == (
        "/v1/load_lora_adapter",
        {"lora_name": "policy-v3", "lora_path": "/checkpoints/v3"},
    )
    assert state.requests[1][1]["model"] == "policy-v3"
    assert adapter_client.describe().endswith("/policy-v3")
    assert state.adapters == {}


def test_connection_refused_is_a_clear_error(tiny_model_dir: Path):
    client = _client("http://127.0.0.1:9", tiny_model_dir, max_retries=1, backoff_s=0.0)
    with pytest.raises(BackendError, match="ConnectError"):
        client.generate([[1, 2, 3]], PARAMS)


def test_agent_loop_runs_over_http_with_faithful_logprobs(
    tiny_backend: LocalBackend, tiny_model_dir: Path
):
    state = ServerState(backend=tiny_backend)
    settings = GenerationSettings(temperature=0.9, max_new_tokens=12)
    with serve_completions(state) as url:
        trajectories = run_group(
            make_question(),
            _client(url, tiny_model_dir),
            RecordingCorpus(make_articles()),
            samples=3,
            seed=3,
            agent_id=1,
            policy_version=2,
            settings=settings,
        )
    assert len(trajectories) == 3
    for trajectory in trajectories:
        prompt = list(trajectory.prompt_token_ids)
        ids = torch.tensor([prompt + list(trajectory.completion_token_ids)])
        with torch.no_grad():
            logits = tiny_backend.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
        replay = torch.log_softmax(logits / settings.temperature, -1).gather(
            1, ids[0, len(prompt) :, None]
        )
        mask = torch.tensor(trajectory.loss_mask, dtype=torch.bool)
        stored = torch.tensor(trajectory.behaviour_logprobs)
        assert mask.any() and torch.allclose(replay.squeeze(1)[mask], stored[mask], atol=1e-4)
        assert trajectory.sampling["backend"].startswith("openai:")


def test_the_backend_takes_processed_logprobs_with_every_other_processor_off(
    tiny_backend: LocalBackend, tiny_model_dir: Path
):
    """vLLM returns raw log-probs (before temperature) unless the server runs with
    --logprobs-mode processed_logprobs; the backend states it needs the processed ones, and
    switches off the processors a checkpoint's generation_config would add."""
    assert LOGPROBS_MODE == "processed_logprobs"
    prompt = _prompts(tiny_backend)[0]
    params = replace(PARAMS, temperature=0.6, stop=())
    received = {}
    for mode in ("processed_logprobs", "raw_logprobs"):
        state = ServerState(backend=tiny_backend, logprobs_mode=mode)
        with serve_completions(state) as url:
            [received[mode]] = _client(url, tiny_model_dir).generate([prompt], params)
        [(_, body)] = state.requests
        assert (body["top_k"], body["min_p"], body["repetition_penalty"]) == (-1, 0.0, 1.0)
        assert (body["frequency_penalty"], body["presence_penalty"]) == (0.0, 0.0)
    processed, raw = received["processed_logprobs"], received["raw_logprobs"]
    assert processed.token_ids == raw.token_ids  # same seed, same tokens
    ids = torch.tensor([prompt + list(processed.token_ids)])
    with torch.no_grad():
        logits = tiny_backend.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    chosen = ids[0, len(prompt) :, None]
    at_temperature = torch.log_softmax(logits / 0.6, -1).gather(1, chosen).squeeze(1)
    untempered = torch.log_softmax(logits, -1).gather(1, chosen).squeeze(1)
    # Processed: log μ at the sampling temperature, what training needs. Raw: not that.
    assert torch.allclose(torch.tensor(processed.logprobs), at_temperature, atol=1e-4)
    assert torch.allclose(torch.tensor(raw.logprobs), untempered, atol=1e-4)
    assert not torch.allclose(torch.tensor(raw.logprobs), at_temperature, atol=1e-2)
