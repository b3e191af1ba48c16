"""The demo on several seeds: does a configuration learn on every seed, and how do the others fail?

Runs `futureworld demo --seed S --out OUT/seed-S OPTIONS` (the command `make demo` runs, with
any of its options) for each seed, `--jobs` at a time with one torch thread each
(FW_TORCH_THREADS=1), then tabulates each run's metrics.json the way docs/results.md does:

- Brier first → last and its Δ with the 95% paired interval (round 0 against the last round
  on the panel, the whole one where a research run's rounds between score its head), and
  ECE's Δ: the demo's claim ("learned" when both intervals lie below 0);
- min parsed: the lowest panel parse rate of any round (the bar: at least 0.90);
- worst served: the largest panel Brier of any round minus round 0's, the warm start's (the
  bar: at most +0.02);
- rejected: versions the promotion gate rejected, of those it judged, and how many of them
  the fit rule failed (alone or with another rule);
- gap closed: (Brier₀ − Brier_last) / (Brier₀ − the true probabilities' Brier);
- verdict: "learned ✓" when the run learned within the whole bar.

    .venv/bin/python benchmarks/demo_seeds.py --seeds 0-7 --jobs 2 --out reports/seeds \
        -- --draw-groups 40

Everything after `--` goes to `futureworld demo`. A seed whose report exists in `--out` is kept,
so an interrupted sweep continues where it stopped; the table goes to `--out/seeds.md` and
`--out/seeds.json`. Seeds are draws: compare configurations on the same seeds, in one sweep's
conditions (wall times depend on what else the machine runs).

A sweep runs for an hour or more: to edit the code meanwhile, run it from a snapshot of the
tree (`git worktree add /tmp/snapshot HEAD`, then `PYTHONPATH=/tmp/snapshot` and its
benchmarks/demo_seeds.py). Each demo's panel process imports the modules when it starts, so a
run that outlives an edit mixes two versions of the code (its panel unpickles the old
`InMemoryCorpus` into the new class, and every search fails: the round log's TOOL ERRORS).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from sweeps import Job, parse_seeds, run_side_by_side

PARSE_BAR = 0.90
SERVED_BAR = 0.02


def run_seeds(seeds: Sequence[int], out: Path, options: Sequence[str], jobs: int) -> None:
    """`futureworld demo` per seed whose metrics are missing, `jobs` at a time, each logging to
    its folder's run.log; its wall time goes to wall_min.txt."""
    futureworld = Path(sys.executable).with_name("futureworld")
    todo = []
    for seed in seeds:
        folder = out / f"seed-{seed}"
        if (folder / "metrics.json").is_file():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        command = [str(futureworld), "demo", "--seed", str(seed), "--out", str(folder)]
        todo.append(Job(f"seed {seed}", [*command, *options], log=folder / "run.log"))

    def done(job: Job, seconds: float) -> None:
        assert job.log is not None
        job.log.with_name("wall_min.txt").write_text(f"{seconds / 60:.1f}\n")

    run_side_by_side(todo, jobs, on_done=done)


def seed_row(seed: int, folder: Path) -> dict[str, object]:
    """The table's columns for one finished run."""
    metrics = json.loads((folder / "metrics.json").read_text())
    rounds, claim, lineage = metrics["rounds"], metrics["claim"], metrics.get("lineage", [])
    first, last = rounds[0], rounds[-1]
    judged = [v for v in lineage if v["parent_version"] is not None and v["version"] > 1]
    rejected = [v for v in judged if v["status"] == "rejected"]
    fit = [v for v in rejected if "questions it was trained on" in v["reason"]]
    # A round whose panel parsed nothing has no Brier: the Brier columns then say "—".
    scored = first["brier"] is not None and last["brier"] is not None
    gap = first["brier"] - first["true_brier"] if scored else 0.0
    min_parsed = min(r["parse_rate"] for r in rounds)
    worst = max(
        (r["brier"] - first["brier"] for r in rounds if scored and r["brier"] is not None),
        default=None,
    )
    learned = bool(claim and claim["learned"])
    ece_only = bool(claim) and not learned and claim["ece"]["ci"][1] < 0
    within = learned and min_parsed >= PARSE_BAR and worst is not None and worst <= SERVED_BAR
    wall = folder / "wall_min.txt"
    return {
        "seed": seed,
        # the claim's rounds on the whole panel (a research run's rows are of its head)
        "brier": [claim["brier"]["first"], claim["brier"]["last"]]
        if claim
        else ([first["brier"], last["brier"]] if scored else None),
        "brier_delta": claim["brier"] if claim else None,
        "ece_delta": claim["ece"] if claim else None,
        "min_parsed": min_parsed,
        "worst_served": worst,
        "rejected": len(rejected),
        "judged": len(judged),
        "fit": len(fit),
        "gap_closed": (first["brier"] - last["brier"]) / gap if gap > 0 else None,
        "verdict": ("learned ✓" if within else "learned")
        if learned
        else ("ECE only" if ece_only else "not learned"),
        "wall_min": float(wall.read_text()) if wall.is_file() else None,
    }


def _delta(d: dict[str, object] | None) -> str:
    if d is None:
        return "—"
    lo, hi = d["ci"]  # type: ignore[misc]
    return f"{d['difference']:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def markdown(rows: Sequence[dict[str, object]]) -> str:
    lines = [
        "| seed | Brier first → last | Δ Brier (95% CI) | Δ ECE (95% CI) | min parsed | worst "
        "served | rejected | fit | gap closed | verdict | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        briers = "—" if r["brier"] is None else "{:.4f} → {:.4f}".format(*r["brier"])  # type: ignore[misc]
        worst = "—" if r["worst_served"] is None else f"{r['worst_served']:+.4f}"
        gap = r["gap_closed"]
        wall = r["wall_min"]
        lines.append(
            f"| {r['seed']} | {briers} | {_delta(r['brier_delta'])} | "  # type: ignore[arg-type]
            f"{_delta(r['ece_delta'])} | {r['min_parsed']:.3f} | {worst} | "  # type: ignore[arg-type]
            f"{r['rejected']} of {r['judged']} | {r['fit']} | "
            f"{'—' if gap is None else f'{gap:.0%}'} | {r['verdict']} | "
            f"{'—' if wall is None else f'{wall:.1f} min'} |"
        )
    learned = sum(str(r["verdict"]).startswith("learned") for r in rows)
    within = sum(r["verdict"] == "learned ✓" for r in rows)
    lines.append(
        f"\nLearned {learned} of {len(rows)}; within the whole bar {within} of {len(rows)}."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    options: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, options = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-7", help="e.g. 0-7 or 0,3,5")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("reports/seeds"))
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    out = args.out.resolve()
    run_seeds(seeds, out, options, args.jobs)
    rows = [seed_row(s, out / f"seed-{s}") for s in seeds]
    table = markdown(rows)
    (out / "seeds.json").write_text(json.dumps({"options": options, "rows": rows}, indent=1))
    (out / "seeds.md").write_text(f"options: {' '.join(options) or '(defaults)'}\n\n{table}\n")
    print(table)


if __name__ == "__main__":
    main()
