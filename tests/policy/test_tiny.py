from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from futureworld.policy.tiny import ACTION_TAGS, init_tiny_model


def test_tiny_model_reloads_offline_with_action_tags_as_single_tokens(tiny_model_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    assert (tiny_model_dir / "model.safetensors").is_file()
    assert model.config.model_type == "qwen2"
    assert model.config.vocab_size == len(tokenizer)
    for tag in ACTION_TAGS:
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1
    text = "<search>rates</search> then <probability>0.5</probability>"
    assert tokenizer.decode(tokenizer.encode(text), skip_special_tokens=True) == text


def test_tiny_chat_template_renders_chatml(tiny_model_dir: Path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == "<|im_end|>"


def test_same_seed_gives_same_weights_and_extra_texts_join_the_vocabulary(tmp_path: Path):
    started = time.perf_counter()
    a = init_tiny_model(tmp_path / "a", seed=3, extra_texts=["zyxwvut " * 5])
    b = init_tiny_model(tmp_path / "b", seed=3, extra_texts=["zyxwvut " * 5])
    c = init_tiny_model(tmp_path / "c", seed=4)
    assert time.perf_counter() - started < 20
    weights = [
        AutoModelForCausalLM.from_pretrained(d, local_files_only=True).state_dict()
        for d in (a, b, c)
    ]
    key = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(weights[0][key], weights[1][key])
    assert not torch.equal(weights[0][key], weights[2][key])
    tokenizer = AutoTokenizer.from_pretrained(a, local_files_only=True)
    assert len(tokenizer.encode("zyxwvut", add_special_tokens=False)) == 1
