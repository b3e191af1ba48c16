"""The research demo's claim judged again on research panels of other sizes, from finished runs.

For each demo folder (a `futureworld demo --research` run's `--out`), loads the versions its
round 0 and last round served (metrics.json), lets each research a held-out research panel of
every size given (flows.demo.research_panel: the panel world, seeds and engine the demo's
rounds use; the first n questions, so a smaller panel is the head of a larger one) and prints
Brier and ECE first → last with their 95% paired intervals (flows.demo.report.learning_claim,
the demo's own claim) and the parse rates. At the run's own panel size the numbers are the
run's (a check that the rescoring is the demo's scoring); at a larger one the intervals show
how much of a verdict is the panel's sampling error. No training: only the panels' rollouts.

    .venv/bin/python benchmarks/research_claim_panel.py reports/seeds/seed-* --sizes 480,1920
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from flows.context import build_context, open_engine
from flows.demo.config import LEARNER, DemoConfig
from flows.demo.report import learning_claim
from flows.demo.research_panel import (
    build_research_panel,
    forecast_research_panel,
    research_round,
)
from flows.demo.rounds import RoundPolicy, round_policy
from flows.settings import Settings
from futureworld.policy.loading import load_backend


def served_policies(folder: Path) -> tuple[int, DemoConfig, list[RoundPolicy]]:
    """A finished research demo's seed, configuration, and the policies its round 0 and its
    last round served, read from its folder's metrics and state."""
    metrics = json.loads((folder / "metrics.json").read_text())
    state = folder / "state"
    seed = int(json.loads((state / "resume.json").read_text())["config"]["seed"])
    rounds = metrics["research"]["rounds"]
    versions = (rounds[0]["policy_version"], rounds[-1]["policy_version"])
    settings = Settings(data_dir=state, db_url=f"sqlite:///{state / 'futureworld.db'}")
    engine = open_engine(settings)
    ctx = build_context(settings, engine)
    policies = [round_policy(ctx, LEARNER, v) for v in versions]
    engine.dispose()
    return seed, DemoConfig(research=True, seed=seed), policies


def rescore(folder: Path, sizes: list[int]) -> list[dict[str, object]]:
    """The claim of `folder`'s run (first against last round's version) on each panel size."""
    seed, config, policies = served_policies(folder)
    versions = tuple(version for _, _, version in policies)
    backends = [load_backend(spec) for spec, _, _ in policies]
    base = config.world_config(seed=seed, max_horizon_days=config.max_horizon_days)
    rows = []
    for n in sizes:
        started = time.perf_counter()
        panel = build_research_panel(base, n, config.questions_per_day)
        scores = []
        for k, ((_, generation, version), backend) in enumerate(
            zip(policies, backends, strict=True)
        ):
            groups = forecast_research_panel(
                backend, generation, panel, policy_version=version, samples=1, seed=seed
            )
            scores.append(research_round(panel, groups, round_no=k, policy_version=version).score)
        claim = learning_claim(scores)
        assert claim is not None, f"{folder}: a panel with no parsed forecast"
        rows.append(
            {
                "run": str(folder),
                "seed": seed,
                "versions": versions,
                "panel": n,
                "brier": [round(claim.brier.before, 4), round(claim.brier.after, 4)],
                "brier_delta": round(claim.brier.difference, 4),
                "brier_ci": [round(x, 4) for x in claim.brier.ci],
                "ece": [round(claim.ece.before, 4), round(claim.ece.after, 4)],
                "ece_delta": round(claim.ece.difference, 4),
                "ece_ci": [round(x, 4) for x in claim.ece.ci],
                "parsed": [round(x, 3) for x in claim.parse_rates],
                "learned": claim.learned,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="demo --research output folders")
    parser.add_argument("--sizes", default="480,1920", help="research panel sizes")
    parser.add_argument("--out", type=Path, default=Path("reports/research_claim_panel.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = [row for folder in args.runs for row in rescore(folder, sizes)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
