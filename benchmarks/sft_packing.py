"""Supervised warm start on demonstrations, a row each against packed several to a row
(`TrainConfig.pack_single_rollouts`), in one process on the same data.

The data is the research demo's warm start at a small size (whole reference-researcher
rollouts and first-turn drills, flows.demo.researcher); each configuration trains the same
tiny model from the same weights, alternately, `--repeats` times. Prints wall seconds, rows and
forwarded positions per step and the first and last step's loss of each (the losses must agree:
packing changes how the step is computed, not what).

    .venv/bin/python benchmarks/sft_packing.py --whole-days 2 --drill-days 8
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from transformers import AutoTokenizer

from flows.demo import researcher
from flows.demo.config import DemoConfig
from futureworld.policy.tiny import init_tiny_model
from futureworld.rl.trainer import train_sft
from futureworld.torch_threads import set_torch_threads
from futureworld.world import World


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--whole-days", type=int, default=2)
    parser.add_argument("--drill-days", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    set_torch_threads(override=1)
    config = DemoConfig(
        research=True,
        research_sft_days=args.whole_days,
        research_drill_days=args.drill_days,
        research_sft_epochs=args.epochs,
    )
    world = World(config.world_config(seed=10_000, questions_per_day=config.sft_questions_per_day))
    questions = researcher.warm_start_questions(world, args.whole_days + args.drill_days)
    whole = [q for q in questions if q[0].day < args.whole_days]
    texts = researcher.tokenizer_texts(world, whole, config.generation, config.researcher, seed=0)
    work = Path(tempfile.mkdtemp())
    model = init_tiny_model(work / "model", seed=0, extra_texts=texts)
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    demonstrations = researcher.research_demonstrations(
        tokenizer,
        world,
        questions,
        config.generation,
        config.researcher,
        seed=0,
        drills_from_day=args.whole_days,
    )
    print(f"{len(demonstrations)} demonstrations ({len(whole)} whole), {args.epochs} epochs")
    base = dataclasses.replace(config.warm_start.config, temperature=1.0)
    for run in range(args.repeats * 2):
        pack = run % 2 == 1
        train = dataclasses.replace(base, pack_single_rollouts=pack)
        started = time.perf_counter()
        result = train_sft(model, demonstrations, train, work / f"run-{run}")
        seconds = time.perf_counter() - started
        steps = result.metrics
        print(
            f"packed={pack!s:5} {seconds:6.1f} s  steps {len(steps)}  "
            f"rows/step {sum(m['rows'] for m in steps) / len(steps):5.1f}  "
            f"positions/step {sum(m['positions'] for m in steps) / len(steps):6.0f}  "
            f"loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
