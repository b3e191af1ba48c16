from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from futureworld.policy.base import FinishReason, Generation, PolicyBackend, SamplingParams
from futureworld.policy.batching import KEPT_BLOCK, KeptConversations
from futureworld.policy.local import LocalBackend
from futureworld.policy.streaming import StreamRequest


def _prompts(backend: LocalBackend) -> list[list[int]]:
    encode = backend.tokenizer.encode
    return [
        encode("Question: Will the central bank raise interest rates?", add_special_tokens=False),
        encode("Hi", add_special_tokens=False),
        encode("Prices of oil fell sharply on Monday while the dollar", add_special_tokens=False),
    ]


def _replay_logprobs(
    model: torch.nn.Module, prompt: list[int], generation: Generation, temperature: float
) -> torch.Tensor:
    """log softmax(logits / T) of the generated tokens, from one unpadded forward pass."""
    ids = torch.tensor([prompt + list(generation.token_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(generation.token_ids)[:, None]).squeeze(1)


def test_local_backend_satisfies_the_protocol(tiny_backend: LocalBackend):
    assert isinstance(tiny_backend, PolicyBackend)
    assert tiny_backend.describe().startswith("local:")


def test_batched_left_padded_logprobs_match_an_unpadded_replay(tiny_backend: LocalBackend):
    prompts = _prompts(tiny_backend)
    params = SamplingParams(temperature=0.7, max_new_tokens=24, seed=11)
    generations = tiny_backend.generate(prompts, params)
    for prompt, generation in zip(prompts, generations, strict=True):
        assert len(generation.token_ids) == len(generation.logprobs) > 0
        replay = _replay_logprobs(tiny_backend.model, prompt, generation, 0.7)
        assert torch.allclose(replay, torch.tensor(generation.logprobs), atol=1e-4)


def test_same_seed_reproduces_and_other_seed_differs(tiny_backend: LocalBackend):
    prompts = _prompts(tiny_backend)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=5)
    first = tiny_backend.generate(prompts, params)
    again = tiny_backend.generate(prompts, params)
    other = tiny_backend.generate(
        prompts, SamplingParams(temperature=1.0, max_new_tokens=16, seed=6)
    )
    assert first == again
    assert [g.token_ids for g in first] != [g.token_ids for g in other]


def test_generation_stops_right_after_a_stop_string(tiny_backend: LocalBackend):
    tokenizer = tiny_backend.tokenizer
    prompts = _prompts(tiny_backend) * 3
    # Very common characters as stop strings, so most rows hit one.
    params = SamplingParams(temperature=1.0, max_new_tokens=40, seed=1, stop=("e", "a"))
    generations = tiny_backend.generate(prompts, params)
    stopped = [g for g in generations if g.stop_string is not None]
    assert stopped
    for generation in stopped:
        assert generation.finish_reason is FinishReason.STOP
        text = tokenizer.decode(generation.token_ids)
        before = tokenizer.decode(generation.token_ids[:-1])
        assert generation.stop_string in text and "e" not in before and "a" not in before
    for generation in generations:
        if generation.finish_reason is FinishReason.LENGTH:
            assert len(generation.token_ids) == 40


def test_top_p_logprobs_are_of_the_renormalised_nucleus(tiny_backend: LocalBackend):
    prompts = _prompts(tiny_backend)
    full = SamplingParams(temperature=1.0, max_new_tokens=12, seed=2)
    nucleus = SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=12, seed=2)
    for prompt, generation in zip(prompts, tiny_backend.generate(prompts, nucleus), strict=True):
        unrestricted = _replay_logprobs(tiny_backend.model, prompt, generation, 1.0)
        # Renormalising over a nucleus of mass >= 0.5 raises log-probs by at most log 2.
        gain = torch.tensor(generation.logprobs) - unrestricted
        assert (gain >= -1e-5).all() and (gain <= torch.log(torch.tensor(2.0)) + 1e-5).all()
    assert tiny_backend.generate(prompts, full) != tiny_backend.generate(prompts, nucleus)


def test_adapter_is_loaded_and_merged(tiny_model_dir: Path, tmp_path: Path):
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    peft_model = get_peft_model(
        base,
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    peft_model.save_pretrained(tmp_path / "adapter")
    plain = LocalBackend.from_pretrained(tiny_model_dir)
    adapted = LocalBackend.from_pretrained(tiny_model_dir, adapter_dir=tmp_path / "adapter")
    assert adapted.describe().endswith("+adapter")
    ids = torch.tensor([_prompts(plain)[0]])
    with torch.no_grad():
        expected = peft_model(input_ids=ids).logits
        assert torch.allclose(adapted.model(input_ids=ids).logits, expected, atol=1e-4)
        assert not torch.allclose(plain.model(input_ids=ids).logits, expected, atol=1e-3)


def test_missing_model_or_adapter_directory_is_a_clear_error(tiny_model_dir: Path, tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        LocalBackend.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="not a peft adapter"):
        LocalBackend.from_pretrained(tiny_model_dir, adapter_dir=tmp_path)


def test_sampling_params_reject_bad_values():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=1.5)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop="</search>")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="logprobs"):
        Generation(token_ids=(1, 2), logprobs=(0.0,), finish_reason=FinishReason.STOP)


def test_a_group_sharing_one_prompt_samples_distinct_faithful_rows(tiny_backend: LocalBackend):
    prompt = _prompts(tiny_backend)[0]
    params = SamplingParams(temperature=1.2, max_new_tokens=16, seed=9)
    generations = tiny_backend.generate([prompt] * 4, params)
    assert len({g.token_ids for g in generations}) == 4
    for generation in generations:
        replay = _replay_logprobs(tiny_backend.model, prompt, generation, 1.2)
        assert torch.allclose(replay, torch.tensor(generation.logprobs), atol=1e-4)


def _prefilled_tokens(model: torch.nn.Module) -> tuple[list[int], object]:
    """Counts the tokens of every multi-token forward (prefills) of `model`."""
    counted: list[int] = []

    def hook(_module, _args, kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.shape[1] > 1:
            counted.append(int(ids.numel()))

    return counted, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("max_batch_tokens", [100_000, 2 * (60 + 12)])
def test_prompts_sharing_a_prefix_prefill_it_once_and_sample_as_if_alone(
    tiny_backend: LocalBackend, max_batch_tokens: int
):
    """Distinct prompts with a common 40-token head: the head is prefilled once (and kept for
    rows joining later, when the budget admits two rows at a time), yet every row samples
    exactly what it samples alone, with log-probs equal to an unpadded replay."""
    encode = tiny_backend.tokenizer.encode
    head = encode("You are a careful forecaster. " * 6, add_special_tokens=False)[:40]
    tails = ["Will oil rise?", "Will the bank cut rates this week?", "Rain?", "Will it snow?"]
    prompts = [head + encode(t, add_special_tokens=False) for t in tails]
    assert max(len(p) for p in prompts) <= 60
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=21)
    backend = LocalBackend(
        tiny_backend.model, tiny_backend.tokenizer, max_batch_tokens=max_batch_tokens
    )
    alone = [
        tiny_backend.generate([p], SamplingParams(temperature=1.0, max_new_tokens=12, seed=21 + i))
        for i, p in enumerate(prompts)
    ]
    counted, handle = _prefilled_tokens(tiny_backend.model)
    try:
        together = backend.generate(prompts, params)
    finally:
        handle.remove()
    assert [g.token_ids for g in together] == [a[0].token_ids for a in alone]
    for prompt, generation in zip(prompts, together, strict=True):
        replay = _replay_logprobs(tiny_backend.model, prompt, generation, 1.0)
        assert torch.allclose(replay, torch.tensor(generation.logprobs), atol=1e-5)
    whole = sum(len(p) - 1 for p in prompts)
    assert sum(counted) < whole - 2 * len(head)  # the head once, not four times


def _finish(stream, requests) -> dict[int, Generation]:
    """Offer `requests` to `stream` and advance it until all of them finished."""
    for request in requests:
        assert stream.offer(request)
    results: dict[int, Generation] = {}
    while stream.in_flight:
        for result in stream.advance():
            assert result.generation is not None, result.error
            results[result.key] = result.generation
    return results


def test_a_conversations_next_turn_prefills_only_what_follows_its_kept_row(
    tiny_backend: LocalBackend,
):
    """A row that finished leaves its keys and values; the conversation's next turn (the row's
    prompt, its tokens and an observation) prefills only the observation, beside a fresh
    prompt joining with it, and both sample exactly what they sample alone, with log-probs
    equal to an unpadded replay."""
    encode = tiny_backend.tokenizer.encode
    first = tuple(
        encode("Question: Will the central bank raise rates? " * 3, add_special_tokens=False)
    )
    params = SamplingParams(temperature=1.0, max_new_tokens=20, seed=4)
    stream = tiny_backend.open_stream()
    [turn] = _finish(stream, [StreamRequest(key=0, prompt=first, params=params)]).values()
    assert stream.kept.tokens == len(first) + len(turn.token_ids) - 1
    observation = tuple(
        encode("Results: [3] Markets rally as election nears.", add_special_tokens=False)
    )
    second = (*first, *turn.token_ids, *observation)
    fresh = tuple(encode("Prices of oil fell sharply on Monday", add_special_tokens=False))
    counted, handle = _prefilled_tokens(tiny_backend.model)
    try:
        together = _finish(
            stream,
            [
                StreamRequest(key=1, prompt=second, params=replace(params, seed=5)),
                StreamRequest(key=2, prompt=fresh, params=replace(params, seed=6)),
            ],
        )
    finally:
        handle.remove()
        stream.close()
    assert stream.kept.hits == 1
    # one prefill of two rows, each as wide as the wider suffix: the observation or the
    # fresh prompt (its last token is the pending input), never the whole conversation
    assert counted == [2 * max(len(observation), len(fresh) - 1)]
    for key, prompt in ((1, second), (2, fresh)):
        [alone] = tiny_backend.generate([prompt], replace(params, seed=4 + key))
        assert together[key].token_ids == alone.token_ids
        replay = _replay_logprobs(tiny_backend.model, list(prompt), together[key], 1.0)
        assert torch.allclose(replay, torch.tensor(together[key].logprobs), atol=1e-5)


def test_kept_conversations_find_the_longest_kept_row_and_drop_the_continued_first():
    def layers(n: int):
        return [(torch.full((1, 2, n, 4), float(n)), torch.zeros((1, 2, n, 4)))]

    kept = KeptConversations(max_tokens=6 * KEPT_BLOCK)
    short = tuple(range(KEPT_BLOCK + 3))
    long = tuple(range(3 * KEPT_BLOCK + 1))
    other = tuple(range(100, 100 + KEPT_BLOCK))
    for tokens in (short, long, other):
        kept.put(tokens, layers(len(tokens)))
    assert kept.tokens == len(short) + len(long) + len(other)
    prompt = (*long, 7, 7)
    found, found_layers = kept.longest(prompt)
    assert found == long and found_layers[0][0].shape[2] == len(long)
    assert kept.longest((*short, 1))[0] == short  # a prompt extending only the shorter row
    assert kept.longest(long)[0] == short  # a prompt must extend a row: not `long` itself
    assert kept.longest(other) is None
    assert kept.longest((*range(KEPT_BLOCK), 9, 9)) is None  # diverges inside short's 2nd block
    # over the bound, the rows already continued go first (short, the last one continued,
    # then long), and the one still waiting for its next turn stays
    kept.put(tuple(range(200, 200 + 2 * KEPT_BLOCK)), layers(2 * KEPT_BLOCK))
    assert kept.longest((*short, 1)) is None and kept.longest((*long, 1)) is None
    assert kept.longest((*other, 1))[0] == other
    assert kept.tokens == len(other) + 2 * KEPT_BLOCK <= 6 * KEPT_BLOCK
