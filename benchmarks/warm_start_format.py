"""The demo's warm start alone, on several seeds and sizes: how much of the round-0 panel it
answers in the strict format, and its Brier there.

Each (seed, days, epochs) trains the demo's tiny model from scratch on `days` days of the
reference's forecasts for `epochs` epochs (flows.demo.warm_start, the code `make demo` runs)
and forecasts the demo's held-out panel once per question at the demo's temperature, exactly
as the demo's round 0 does (flows.demo.rounds.score_round). A parse rate below 0.90 there
fails the demo's "every round answers at least 90% of the panel" before any RL update.

    .venv/bin/python benchmarks/warm_start_format.py --seeds 0-7 --sizes 5x20,10x15

Prints one row per run and, per size, the lowest and mean parse rate over the seeds; writes
them as JSON to `--out`. The warm start's seconds are wall time on whatever the machine is
doing: compare sizes within one invocation.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from sweeps import parse_seeds

from flows.context import build_context, open_engine
from flows.demo.config import LEARNER, DemoConfig
from flows.demo.panel import CYCLE_HOUR, build_panel, panel_world
from flows.demo.rounds import round_policy, score_round
from flows.demo.warm_start import warm_start
from flows.settings import Settings
from futureworld.scoring import brier
from futureworld.world import World


def measure(seed: int, days: int, epochs: int, work: Path) -> dict[str, float | None]:
    """One warm start of the demo's seed `seed` and its round-0 panel score (Brier None when
    no answer parsed)."""
    config = DemoConfig(research=False, seed=seed, sft_days=days, sft_epochs=epochs, out_dir=work)
    state = work / "state"
    state.mkdir(parents=True)
    world = World(
        config.world_config(
            seed=seed,
            questions_per_day=config.questions_per_day,
            max_horizon_days=config.max_horizon_days,
        )
    )
    at = world.day_start(0) + timedelta(hours=CYCLE_HOUR)
    settings = Settings(data_dir=state, db_url=f"sqlite:///{state / 'demo.db'}")
    started = time.perf_counter()
    warm_start(config, settings, as_of=at)
    warm_s = time.perf_counter() - started
    engine = open_engine(settings)
    ctx = build_context(settings, engine, as_of=at)
    panel = build_panel(
        panel_world(config.world_config(seed=seed), config.panel_questions),
        config.panel_questions,
    )
    score, _ = score_round(round_policy(ctx, LEARNER), panel, {}, 0, config)
    engine.dispose()
    return {
        "seed": seed,
        "days": days,
        "epochs": epochs,
        "parse_rate": score.parse_rate,
        "brier": brier(score.p_yes, score.y) if score.p_yes else None,
        "warm_start_s": round(warm_s, 1),
    }


def _sizes(text: str) -> list[tuple[int, int]]:
    return [(int(d), int(e)) for d, e in (size.split("x") for size in text.split(","))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-7", help="e.g. 0-7 or 0,3,5")
    parser.add_argument(
        "--sizes",
        default="5x20,10x15",
        help="days x epochs, comma-separated",
    )
    parser.add_argument("--out", type=Path, default=Path("reports/warm_start_format.json"))
    args = parser.parse_args()
    rows = []
    for days, epochs in _sizes(args.sizes):
        for seed in parse_seeds(args.seeds):
            with tempfile.TemporaryDirectory() as work:
                row = measure(seed, days, epochs, Path(work))
            rows.append(row)
            print(json.dumps(row), flush=True)
    for days, epochs in _sizes(args.sizes):
        parsed = [r["parse_rate"] for r in rows if (r["days"], r["epochs"]) == (days, epochs)]
        print(
            f"{days} days x {epochs} epochs: parse rate lowest {min(parsed):.4f}, "
            f"mean {sum(parsed) / len(parsed):.4f} over {len(parsed)} seeds"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
