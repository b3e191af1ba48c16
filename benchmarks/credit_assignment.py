"""Turn-level against outcome-level credit on the research world: dr_grpo, forecast_info_gain
and siop, each on the same seeds, warm start and compute.

Each (seed, estimator) is one research demo (`run_demo(DemoConfig(research=True, ...))`, the
code `futureworld demo --research` runs: the warm start, then `rounds` daily cycles of the
pipeline's flows, each round's policy researching the same held-out research panel), differing
from the others of its seed only in `estimator`. The warm start's inputs do not depend on the
estimator, so a seed's runs start from the same version; the summary checks it (the warm
start's weights, byte for byte). Every run gets the same rounds, questions, G and update
schedule, so the same compute, up to the beliefs forecast_info_gain and siop elicit after each
tool turn.

Per round and estimator, averaged over the seeds: the panel's search rate, the share of
rollouts that found their question's evidence, Brier, and the share of the warm start's gap to
the informed floor closed ((B₀ − B_r) / (B₀ − informed floor), per seed, then averaged). Per
pair of estimators, the last round's Brier difference on the same panel questions, paired by
question, per seed and pooled over the seeds (questions of all seeds resampled together), with
95% bootstrap intervals; and each run's own round 0 → last claim (flows.demo.report).

    .venv/bin/python benchmarks/credit_assignment.py --seeds 0-2 --jobs 2

Runs go to `--out/seed-S/ESTIMATOR` (report.md and state/ of each demo); a run whose
report.md exists is kept, so an interrupted benchmark continues where it stopped. `--jobs`
runs that many demos side by side, each with FW_TORCH_THREADS=1. The table goes to
`--out/credit_assignment.json` and is printed as markdown.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sweeps import Job, parse_numeric_sets, parse_seeds, run_side_by_side

from flows.demo.config import LEARNER, WARM_START_VERSION, DemoConfig
from flows.demo.report import learning_claim
from flows.demo.research_panel import ResearchRound, claim_scores
from flows.demo.research_report import research_summary
from flows.demo.resume import load_state
from futureworld.rl.config import Estimator
from futureworld.scoring import PairedDifference, brier, paired_bootstrap_difference

ESTIMATORS = (Estimator.DR_GRPO, Estimator.FORECAST_INFO_GAIN, Estimator.SIOP)
QUESTION_STRIDE = 1_000_000
"""Pooled over seeds, question q of seed s is s · QUESTION_STRIDE + q."""


@dataclass(frozen=True)
class Setup:
    rounds: int
    questions_per_day: int
    panel: int
    extra: dict[str, int | float]

    def config(self, seed: int, estimator: Estimator, out: Path) -> DemoConfig:
        return DemoConfig(
            research=True,
            seed=seed,
            estimator=estimator,
            rounds=self.rounds,
            questions_per_day=self.questions_per_day,
            research_panel_questions=self.panel,
            out_dir=run_dir(out, seed, estimator),
            **self.extra,
        )


def run_dir(out: Path, seed: int, estimator: Estimator) -> Path:
    return out / f"seed-{seed}" / estimator.value


def run_one(config: DemoConfig) -> None:
    from flows.demo.run import run_demo

    started = time.perf_counter()
    result = run_demo(config)
    seconds = time.perf_counter() - started
    (config.out_dir / "wall_s.txt").write_text(f"{seconds:.1f}\n")
    print(f"seed {config.seed} {config.estimator}: {result.report} ({seconds / 60:.1f} min)")


def run_all(
    seeds: Sequence[int], estimators: Sequence[Estimator], out: Path, jobs: int, argv: Sequence[str]
) -> None:
    """Each missing run (no report.md yet) in a process of its own, `jobs` at a time."""
    run_side_by_side(
        [
            Job(f"seed {seed} {e}", [sys.executable, __file__, *argv, "--run", f"{seed}:{e}"])
            for seed in seeds
            for e in estimators
            if not (run_dir(out, seed, e) / "report.md").is_file()
        ],
        jobs,
    )


def load_rounds(setup: Setup, seed: int, estimator: Estimator, out: Path) -> list[ResearchRound]:
    config = setup.config(seed, estimator, out)
    rounds = load_state(config.out_dir / "state", config).scored_rounds()
    assert all(isinstance(r, ResearchRound) for r in rounds)
    return rounds  # type: ignore[return-value]


def warm_start_weights(run: Path) -> str:
    """sha256 of the warm start's weights in a run's state."""
    path = run / "state" / "checkpoints" / LEARNER / f"v{WARM_START_VERSION}" / "model.safetensors"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rows(scored: ResearchRound, seed: int) -> np.ndarray:
    s = scored.score
    return np.asarray(
        [(seed * QUESTION_STRIDE + q, p, y) for q, p, y in s.rows()], dtype=np.float64
    ).reshape(-1, 3)


def _paired(rows_a: np.ndarray, rows_b: np.ndarray) -> dict[str, float] | None:
    """Brier of b minus a on the same questions; None when either answered none."""
    if rows_a.size == 0 or rows_b.size == 0:
        return None
    return _interval(paired_bootstrap_difference(rows_a, rows_b, brier))


def _interval(d: PairedDifference) -> dict[str, float]:
    return {
        "delta": round(d.difference, 4),
        "lo": round(d.ci[0], 4),
        "hi": round(d.ci[1], 4),
    }


def summarise(
    setup: Setup, seeds: Sequence[int], estimators: Sequence[Estimator], out: Path
) -> dict[str, object]:
    runs = {(s, e): load_rounds(setup, s, e, out) for s in seeds for e in estimators}
    # Same warm start: a seed's runs start from the same weights, byte for byte.
    same_start = {
        s: len({warm_start_weights(run_dir(out, s, e)) for e in estimators}) == 1 for s in seeds
    }
    summaries = {
        key: research_summary(rounds, (float("nan"), float("nan"))).rounds
        for key, rounds in runs.items()
    }
    by_round = []
    for r in range(setup.rounds):
        row: dict[str, object] = {"round": r}
        for e in estimators:
            of_seeds = [summaries[(s, e)][r] for s in seeds]
            row[e.value] = {
                "search_rate": round(float(np.mean([m.search_rate for m in of_seeds])), 3),
                "evidence_rate": round(float(np.mean([m.evidence_rate for m in of_seeds])), 3),
                "brier": round(float(np.mean([m.brier for m in of_seeds])), 4),
                "gap_closed": round(float(np.mean([m.gap_closed for m in of_seeds])), 3),
                "min_parse_rate": round(float(np.min([m.parse_rate for m in of_seeds])), 3),
            }
        by_round.append(row)
    per_run = {}
    for (s, e), rounds in runs.items():
        claim = learning_claim(claim_scores(rounds))
        first, last = summaries[(s, e)][0], summaries[(s, e)][-1]
        wall = run_dir(out, s, e) / "wall_s.txt"
        per_run[f"{s}:{e.value}"] = {
            "brier": _interval(claim.brier) if claim else None,
            "ece": _interval(claim.ece) if claim else None,
            "learned": bool(claim and claim.learned),
            "search_rate": [round(rounds[0].search_rate, 3), round(rounds[-1].search_rate, 3)],
            "evidence_rate": [
                round(rounds[0].evidence_rate, 3),
                round(rounds[-1].evidence_rate, 3),
            ],
            "last_brier": round(last.brier, 4),
            "informed_floor": round(last.informed_brier, 4),
            "uninformed_floor": round(last.uninformed_brier, 4),
            "gap_closed": round(last.gap_closed, 3),
            # Whether it reads what it finds: Brier by research path, first and last round.
            "brier_found": [round(first.found_brier, 4), round(last.found_brier, 4)],
            "brier_missed": [round(first.missed_brier, 4), round(last.missed_brier, 4)],
            "brier_unsearched": [round(first.unsearched_brier, 4), round(last.unsearched_brier, 4)],
            "min_parse_rate": round(min(r.score.parse_rate for r in rounds), 3),
            "wall_s": float(wall.read_text()) if wall.is_file() else None,
        }
    pairs = {}
    for i, a in enumerate(estimators):
        for b in estimators[i + 1 :]:
            entry: dict[str, object] = {}
            pooled_a, pooled_b = [], []
            for s in seeds:
                rows_a, rows_b = _rows(runs[(s, a)][-1], s), _rows(runs[(s, b)][-1], s)
                pooled_a.append(rows_a)
                pooled_b.append(rows_b)
                entry[f"seed {s}"] = _paired(rows_a, rows_b)
            entry["pooled"] = _paired(np.vstack(pooled_a), np.vstack(pooled_b))
            pairs[f"{b.value} - {a.value}"] = entry
    return {
        "setup": {
            "seeds": list(seeds),
            "rounds": setup.rounds,
            "questions_per_day": setup.questions_per_day,
            "panel": setup.panel,
            **setup.extra,
        },
        "same_warm_start": same_start,
        "by_round": by_round,
        "runs": per_run,
        "last_round_brier_differences": pairs,
    }


def markdown(summary: dict[str, object], estimators: Sequence[Estimator]) -> str:
    names = [e.value for e in estimators]
    lines = [
        "| round | "
        + " | ".join(f"{n}: searched / found / Brier / gap closed" for n in names)
        + " |",
        "|---|" + "---|" * len(names),
    ]
    for row in summary["by_round"]:  # type: ignore[union-attr]
        cells = [
            f"{c['search_rate']:.2f} / {c['evidence_rate']:.2f} / {c['brier']:.4f} / "
            f"{c['gap_closed']:+.2f}"
            for c in (row[n] for n in names)
        ]
        lines.append(f"| {row['round']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| seed:estimator | Brier Δ (CI) | ECE Δ (CI) | learned | searched | found | last Brier "
        "(informed / uninformed floor) | gap closed | Brier found / missed / no search, first → "
        "last | min parsed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, run in summary["runs"].items():  # type: ignore[union-attr]
        lines.append(
            f"| {key} | {_cell(run['brier'])} | {_cell(run['ece'])} | "
            f"{'yes' if run['learned'] else 'no'} | "
            f"{run['search_rate'][0]:.2f} → {run['search_rate'][1]:.2f} | "
            f"{run['evidence_rate'][0]:.2f} → {run['evidence_rate'][1]:.2f} | "
            f"{run['last_brier']:.4f} ({run['informed_floor']:.4f} / "
            f"{run['uninformed_floor']:.4f}) | {run['gap_closed']:+.2f} | "
            f"{_paths(run, 0)} → {_paths(run, 1)} | {run['min_parse_rate']:.3f} |"
        )
    pairs = summary["last_round_brier_differences"]
    if pairs:  # none with one estimator
        columns = list(next(iter(pairs.values())))  # type: ignore[union-attr]
        lines += ["", "| last round, paired | " + " | ".join(columns) + " |"]
        lines.append("|---|" + "---|" * len(columns))
        for name, entry in pairs.items():  # type: ignore[union-attr]
            cells = [_cell(d) for d in entry.values()]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append(f"\nsame warm start per seed: {summary['same_warm_start']}")
    return "\n".join(lines)


def _paths(run: dict[str, object], at: int) -> str:
    return " / ".join(
        f"{run[f'brier_{path}'][at]:.3f}"  # type: ignore[index]
        for path in ("found", "missed", "unsearched")
    )


def _cell(d: dict[str, float] | None) -> str:
    return "—" if d is None else f"{d['delta']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]"


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-2", help="e.g. 0-4 or 0,3,5")
    parser.add_argument("--estimators", default=",".join(e.value for e in ESTIMATORS))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--questions-per-day", type=int, default=20)
    parser.add_argument("--panel", type=int, default=300, help="research panel questions")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="any other numeric DemoConfig field, the same for every run",
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("reports/credit_assignment"))
    parser.add_argument("--run", help=argparse.SUPPRESS)  # SEED:ESTIMATOR, one run (internal)
    args = parser.parse_args(argv)
    setup = Setup(
        rounds=args.rounds,
        questions_per_day=args.questions_per_day,
        panel=args.panel,
        extra=parse_numeric_sets(args.set),
    )
    out = args.out.resolve()
    if args.run:
        seed, estimator = args.run.split(":")
        run_one(setup.config(int(seed), Estimator(estimator), out))
        return
    seeds = parse_seeds(args.seeds)
    estimators = [Estimator(e) for e in args.estimators.split(",")]
    run_all(seeds, estimators, out, args.jobs, argv)
    summary = summarise(setup, seeds, estimators, out)
    (out / "credit_assignment.json").write_text(json.dumps(summary, indent=1))
    print(markdown(summary, estimators))


if __name__ == "__main__":
    main()
