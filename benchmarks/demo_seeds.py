"""The demo on several seeds: does a configuration learn on every seed, and how do the others fail?

Runs `futureworld demo --seed S --out OUT/seed-S OPTIONS` (the command `make demo` runs, with
any of its options) for each seed, `--jobs` at a time with one torch thread each
(FW_TORCH_THREADS=1), then tabulates each run's metrics.json the way docs/results.md does:

- Brier first → last and its Δ with the 95% paired interval (round 0 against the last round
  on the panel), and ECE's Δ: the demo's claim ("learned" when both intervals lie below 0);
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
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from warm_start_format import parse_seeds

PARSE_BAR = 0.90
SERVED_BAR = 0.02


def run_seeds(seeds: Sequence[int], out: Path, options: Sequence[str], jobs: int) -> None:
    """`futureworld demo` per seed whose report is missing, `jobs` at a time."""
    futureworld = Path(sys.executable).with_name("futureworld")
    todo = [s for s in seeds if not (out / f"seed-{s}" / "metrics.json").is_file()]
    env = {**os.environ, "FW_TORCH_THREADS": "1"} if jobs > 1 else dict(os.environ)
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    failed = []
    while todo or running:
        while todo and len(running) < jobs:
            seed = todo.pop(0)
            folder = out / f"seed-{seed}"
            folder.mkdir(parents=True, exist_ok=True)
            command = [str(futureworld), "demo", "--seed", str(seed), "--out", str(folder)]
            with (folder / "run.log").open("w") as log:
                process = subprocess.Popen(
                    [*command, *options], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            running[seed] = (process, time.perf_counter())
            print(f"seed {seed}: started", flush=True)
        time.sleep(2)
        for seed, (process, started) in list(running.items()):
            if process.poll() is None:
                continue
            del running[seed]
            minutes = (time.perf_counter() - started) / 60
            (out / f"seed-{seed}" / "wall_min.txt").write_text(f"{minutes:.1f}\n")
            print(f"seed {seed}: exit {process.returncode} after {minutes:.1f} min", flush=True)
            if process.returncode != 0:
                failed.append(seed)
    if failed:
        raise SystemExit(f"seeds {failed} failed: see their run.log under {out}")


def seed_row(seed: int, folder: Path) -> dict[str, object]:
    """The table's columns for one finished run."""
    metrics = json.loads((folder / "metrics.json").read_text())
    rounds, claim, lineage = metrics["rounds"], metrics["claim"], metrics.get("lineage", [])
    first, last = rounds[0], rounds[-1]
    judged = [v for v in lineage if v["parent_version"] is not None and v["version"] > 1]
    rejected = [v for v in judged if v["status"] == "rejected"]
    fit = [v for v in rejected if "questions it was trained on" in v["reason"]]
    gap = first["brier"] - first["true_brier"]
    min_parsed = min(r["parse_rate"] for r in rounds)
    worst = max(r["brier"] - first["brier"] for r in rounds if r["brier"] is not None)
    learned = bool(claim and claim["learned"])
    ece_only = bool(claim) and not learned and claim["ece"]["ci"][1] < 0
    within = learned and min_parsed >= PARSE_BAR and worst <= SERVED_BAR
    wall = folder / "wall_min.txt"
    return {
        "seed": seed,
        "brier": [first["brier"], last["brier"]],
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
        b0, b1 = r["brier"]  # type: ignore[misc]
        gap = r["gap_closed"]
        wall = r["wall_min"]
        lines.append(
            f"| {r['seed']} | {b0:.4f} → {b1:.4f} | {_delta(r['brier_delta'])} | "  # type: ignore[arg-type]
            f"{_delta(r['ece_delta'])} | {r['min_parsed']:.3f} | {r['worst_served']:+.4f} | "  # type: ignore[arg-type]
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
