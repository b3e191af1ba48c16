"""A research panel's consecutive rounds with and without kept token ids: the time the demo's
panel process takes for each round when every prompt and observation is tokenized again,
against `futureworld.agent.prompts.encode_text` keeping the ids of the texts it tokenized
before (the panel forecasts the same questions every round, and a policy's queries repeat).

Loads the policies a finished `futureworld demo` run served in its last `--rounds` rounds
(its metrics.json and state), and has each research the run's held-out research panel in
turn, as the panel's process does round after round (a fresh load of each version), first
with nothing kept, then with the ids kept from the first of them on, alternating the two ways
`--repeats` times in one process. Reports each round's seconds both ways and whether every
rollout came out token-identical.

    .venv/bin/python benchmarks/panel_token_ids.py reports/demo --rounds 3 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from flows.context import build_context, open_engine
from flows.demo.config import LEARNER, DemoConfig
from flows.demo.research_panel import build_research_panel, forecast_research_panel
from flows.demo.rounds import round_policy
from flows.settings import Settings
from futureworld.agent import prompts
from futureworld.policy.loading import load_backend


def measure(folder: Path, rounds: int, repeats: int) -> dict[str, object]:
    metrics = json.loads((folder / "metrics.json").read_text())
    state = folder / "state"
    seed = int(json.loads((state / "resume.json").read_text())["config"]["seed"])
    versions = [r["policy_version"] for r in metrics["research"]["rounds"][-rounds:]]
    settings = Settings(data_dir=state, db_url=f"sqlite:///{state / 'futureworld.db'}")
    engine = open_engine(settings)
    ctx = build_context(settings, engine)
    policies = [round_policy(ctx, LEARNER, v) for v in versions]
    engine.dispose()
    config = DemoConfig(seed=seed)
    base = config.world_config(seed=seed, max_horizon_days=config.max_horizon_days)
    panel = build_research_panel(base, config.research_panel_questions, config.questions_per_day)
    times: dict[tuple[str, int], list[float]] = {}
    tokens: dict[tuple[str, int], list[tuple[int, ...]]] = {}
    for _ in range(repeats):
        for way, kept in (("tokenized again", 0), ("kept ids", prompts.ENCODED_TEXTS_KEPT)):
            prompts.keep_encoded_texts(kept)
            for k, (spec, generation, version) in enumerate(policies):
                backend = load_backend(spec)
                started = time.perf_counter()
                groups = forecast_research_panel(
                    backend, generation, panel, policy_version=version, samples=1, seed=seed
                )
                times.setdefault((way, k), []).append(time.perf_counter() - started)
                tokens[(way, k)] = [tuple(t.completion_token_ids) for g in groups for t in g]
    prompts.keep_encoded_texts(prompts.ENCODED_TEXTS_KEPT)
    rows = []
    for k, version in enumerate(versions):
        again, kept = (statistics.median(times[(w, k)]) for w in ("tokenized again", "kept ids"))
        same = tokens[("tokenized again", k)] == tokens[("kept ids", k)]
        rows.append(
            {
                "version": version,
                "round_of_kept_ids": k,  # 0: nothing kept yet, as the panel's first round
                "seconds": {"tokenized again": round(again, 2), "kept ids": round(kept, 2)},
                "time_ratio": round(kept / again, 3),
                "token_identical": same,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return {"run": str(folder), "seed": seed, "questions": len(panel.questions), "rounds": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a finished `futureworld demo` output folder")
    parser.add_argument("--rounds", type=int, default=3, help="its last rounds' versions")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each way (median)")
    parser.add_argument("--out", type=Path, default=Path("reports/panel_token_ids.json"))
    args = parser.parse_args()
    result = measure(args.run, args.rounds, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
