"""Agent-loop overhead: rollouts/s of `run_group` against raw `model.generate`.

Same tiny model, same prompt, same batch (G copies of the question's prompt) and the same
number of decode steps (raw generate is forced to the loop's longest turn). The loop's
extra cost is its own decode loop, stop-string checks, parsing and trajectory building;
its saving is encoding the group's shared prompt once instead of G times.
Target: overhead ratio (loop time / raw time) <= 1.15. About a minute on 2 idle cores.

    .venv/bin/python benchmarks/agent_loop.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import torch
from raw_generate import raw_generate

from futureworld.agent.engine import run_group
from futureworld.agent.prompts import encode_prompt
from futureworld.agent.tools import InMemoryCorpus
from futureworld.domain import GenerationSettings, Question
from futureworld.policy.local import LocalBackend
from futureworld.policy.tiny import init_tiny_model

CASES = ((8, 64), (32, 64), (8, 128))
"""(G rollouts, max new tokens)."""
REPEATS = 4
"""Best of REPEATS: the minimum time is the least disturbed by other work on the machine."""


def _question() -> Question:
    now = datetime(2026, 3, 1, tzinfo=UTC)
    return Question(
        source="bench",
        external_id="1",
        title="Will the central bank raise interest rates before April?",
        background="Inflation rose for the third month in a row.",
        resolution_criteria="YES if the policy rate is higher on 2026-04-30.",
        created_at=now,
        info_cutoff_at=now,
        resolve_by=now + timedelta(days=60),
        id=1,
    )


def _time_loop(
    backend: LocalBackend, samples: int, new_tokens: int, seed: int
) -> tuple[float, int]:
    settings = GenerationSettings(temperature=1.0, max_turns=1, max_new_tokens=new_tokens)
    started = time.perf_counter()
    trajectories = run_group(
        _question(),
        backend,
        InMemoryCorpus([]),
        samples=samples,
        settings=settings,
        seed=seed,
        agent_id=1,
        policy_version=0,
        as_of=_question().info_cutoff_at,
    )
    elapsed = time.perf_counter() - started
    return elapsed, max(len(t.completion_token_ids) for t in trajectories)


@torch.inference_mode()
def _time_raw(backend: LocalBackend, prompt: list[int], samples: int, steps: int) -> float:
    input_ids = torch.tensor([prompt] * samples)
    started = time.perf_counter()
    raw_generate(
        backend.model,
        input_ids,
        torch.ones_like(input_ids),
        steps=steps,
        pad_token_id=backend.tokenizer.pad_token_id,
    )
    return time.perf_counter() - started


def main() -> None:
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        backend = LocalBackend.from_pretrained(init_tiny_model(Path(tmp)))
    prompt = encode_prompt(backend.tokenizer, _question(), as_of=_question().info_cutoff_at)
    print(f"tiny model, prompt {len(prompt)} tokens, torch threads {torch.get_num_threads()}")
    header = (
        f"{'G':>4} {'max new':>8} {'steps':>6} {'raw rollouts/s':>15} "
        f"{'loop rollouts/s':>16} {'ratio':>7}"
    )
    print(header)
    print("-" * len(header))
    for samples, new_tokens in CASES:
        _time_loop(backend, samples, new_tokens, seed=0)  # warm-up
        loop_times, raw_times, all_steps = [], [], []
        for repeat in range(REPEATS):
            loop_s, steps = _time_loop(backend, samples, new_tokens, seed=repeat)
            raw_s = _time_raw(backend, prompt, samples, steps)
            loop_times.append(loop_s)
            raw_times.append(raw_s)
            all_steps.append(steps)
        print(
            f"{samples:>4} {new_tokens:>8} {statistics.median(all_steps):>6.0f} "
            f"{samples / min(raw_times):>15.1f} {samples / min(loop_times):>16.1f} "
            f"{min(loop_times) / min(raw_times):>7.3f}"
        )


if __name__ == "__main__":
    main()
