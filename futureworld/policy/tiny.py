"""A tiny Qwen2-architecture causal LM and a locally trained byte-level BPE tokenizer.

Built from a config in seconds with no download, so tests, benchmarks and the offline
demo run the real generation and training code paths. The weights are random.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

ACTION_TAGS: tuple[str, ...] = (
    "<search>",
    "</search>",
    "<open>",
    "</open>",
    "<probability>",
    "</probability>",
)
"""Added as whole tokens so every action boundary is one token id."""

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, the format of the Qwen2 family, so prompts look the same on the tiny and real models."""

_BUILTIN_CORPUS: tuple[str, ...] = (
    "You are a forecasting agent. Research the question and answer with a probability.",
    "Question: Will the central bank raise interest rates before the end of the month?",
    "Background: inflation rose for the third month in a row, according to the statistics office.",
    "Resolution criteria: resolves YES if the announced policy rate is higher than today.",
    "Search the news corpus with <search>query</search> and read an article with <open>12</open>.",
    "Answer with <probability>0.73</probability> where the number is the chance of YES.",
    "Results: [3] 2026-01-05 Markets rally as election nears. [7] 2026-01-04 Storm hits coast.",
    "The team won the final match of the season and the coach signed a new contract.",
    "Prices of oil, gold and wheat fell sharply on Monday while the dollar gained.",
    "The minister said the government expects growth of 2.5 percent next year.",
    "Current estimate: 0.1 0.25 0.5 0.75 0.9 0.05 0.95 0.333 0.6 0.42",
    "Today is 2026-03-14. The question resolves by 2026-04-30. As of the cut-off date.",
    "The company reported earnings above expectations; shares rose 4% in early trading.",
    "Scientists announced a new vaccine trial with results expected in the spring.",
    "January February March April May June July August September October November December",
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday 0123456789 yes no maybe",
)


def train_tokenizer(texts: Sequence[str], *, vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `texts`, with ChatML special tokens and the action tags."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=[PAD_TOKEN, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the small corpus lets frequent words merge into whole tokens.
    core.train_from_iterator(list(texts) * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
    # Not special: they must survive decode(skip_special_tokens=True), like real text.
    tokenizer.add_tokens(list(ACTION_TAGS), special_tokens=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def init_tiny_model(
    out_dir: Path,
    *,
    seed: int = 0,
    extra_texts: Sequence[str] = (),
    vocab_size: int = 2048,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_positions: int = 4096,
) -> Path:
    """Write a tiny Qwen2 model and its tokenizer to `out_dir`; return `out_dir`.

    Reload with `AutoModelForCausalLM.from_pretrained(out_dir, local_files_only=True)` and
    `AutoTokenizer.from_pretrained(out_dir, local_files_only=True)`. Same seed, same weights.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer([*_BUILTIN_CORPUS, *extra_texts], vocab_size=vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
