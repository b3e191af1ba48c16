"""The one protocol every generation backend implements, and its value types.

A backend turns batches of prompt token ids into sampled token ids with their behaviour
log-probs. It knows nothing of questions, tools or the agent loop (that is `agent/`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # transformers loads with a backend, not with the types
    from transformers import PreTrainedTokenizerBase

    from futureworld.policy.streaming import GenerationStream

ADAPTER_CONFIG_FILE = "adapter_config.json"
"""peft's marker file: a checkpoint directory holding it is a LoRA adapter."""


def is_lora_adapter(checkpoint: Path) -> bool:
    """Whether a checkpoint directory is a LoRA adapter (over its agent's base model) rather
    than a full model directory."""
    return (Path(checkpoint) / ADAPTER_CONFIG_FILE).is_file()


class FinishReason(StrEnum):
    STOP = "stop"
    """The end-of-sequence token or a stop string ended the generation."""
    LENGTH = "length"
    """`max_new_tokens` ran out first."""


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How one `generate` call samples. Behaviour log-probs are always
    log softmax(logits / temperature) over the distribution actually sampled from."""

    temperature: float = 1.0
    """Softmax temperature T > 0; log-probs are taken at this temperature."""
    top_p: float = 1.0
    """Nucleus mass. 1.0 (default) means no truncation, so μ is exactly softmax(logits / T)."""
    max_new_tokens: int = 256
    """Upper bound on generated tokens per prompt."""
    seed: int | None = None
    """Seed for this call; None draws fresh randomness. In a batch, row i samples with
    seed + i, and what a row samples depends on its own seed alone, not on the batch."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends after the token that completes one (it is kept)."""

    def __post_init__(self) -> None:
        if not self.temperature > 0.0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if isinstance(self.stop, str) or any(not s for s in self.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(self.stop))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form stored on each trajectory's `sampling`."""
        data = asdict(self)
        data["stop"] = list(self.stop)
        return data


@dataclass(frozen=True, kw_only=True)
class Generation:
    """One sampled continuation of one prompt."""

    token_ids: tuple[int, ...]
    """Generated ids, ending with the eos id or the token that completed a stop string."""
    logprobs: tuple[float, ...]
    """log μ(token) per generated token, at the sampling temperature; same length as ids."""
    finish_reason: FinishReason
    stop_string: str | None = None
    """The stop string that ended the generation, if one did."""

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(
                f"generation has {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs"
            )


@runtime_checkable
class PolicyBackend(Protocol):
    """Batched token-in/token-out sampling from one policy."""

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The policy's tokenizer, for encoding prompts and observations."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        """Sample one continuation per prompt; the result is aligned with `prompts`."""
        ...

    def open_stream(self) -> GenerationStream:
        """A stream that takes requests while others run (futureworld.policy.streaming)."""
        ...

    def describe(self) -> str:
        """A short name for logs: backend kind, model and adapter."""
        ...


def find_stop(text: str, stops: Sequence[str]) -> str | None:
    """The stop string that occurs earliest in `text`, or None."""
    best: tuple[int, str] | None = None
    for stop in stops:
        at = text.find(stop)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    return None if best is None else best[1]
