"""provisional_consensus against dr_grpo when outcomes arrive late: the demo's loop
(flows/demo/run.py: the simulated world, the daily cycle through the Prefect flows, the fixed
held-out panel) run twice from the same seed, once per estimator, with every question resolving
5–7 days after it is posed. dr_grpo trains only on resolved groups, so it waits five rounds for
its first update; provisional_consensus trains from the second round on the provisional rewards
the provisional-rewards stage writes after predict (flows/stages/provisional.py), and on the
real rewards once they arrive.

Both arms forecast the same panel questions with the same sampling seeds every round, so their
difference at a round is paired: the 95% interval comes from the demo's own paired bootstrap
(`learning_claim` with dr_grpo's panel as "first" and provisional_consensus's as "last": the
second arm − dr_grpo, by resampling panel questions in both at once). A gain is claimed only
where that interval lies below zero. Rounds are simulated days, so "the same round" is the same
wall-clock time of the live system; the compute each arm spent is reported next to it.

    .venv/bin/python benchmarks/provisional_consensus_vs_dr_grpo.py [--rounds 8 --panel 1000]
    # or the arms side by side, then the comparison:
    .venv/bin/python benchmarks/provisional_consensus_vs_dr_grpo.py --arm dr_grpo &
    .venv/bin/python benchmarks/provisional_consensus_vs_dr_grpo.py --arm provisional_consensus
    wait; .venv/bin/python benchmarks/provisional_consensus_vs_dr_grpo.py --arm compare

Writes `results.json` and `results.md` (a table by round) to the output folder; each arm's
demo report goes under it (`dr_grpo/`, `provisional_consensus/`).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

from flows.context import build_context, open_engine
from flows.demo.config import LEARNER, DemoConfig
from flows.demo.panel import PanelScore, build_panel, panel_world, score_panel
from flows.demo.report import learning_claim
from flows.demo.run import run_demo
from flows.settings import Settings
from futureworld.rl.config import Estimator
from futureworld.scoring import brier, expected_calibration_error
from futureworld.world import WorldConfig
from storage.engine import session_scope
from storage.repositories.agents import get_policy_version


@dataclass(frozen=True, kw_only=True)
class DelayedDemoConfig(DemoConfig):
    """The demo with outcomes delayed `min_horizon_days`..`max_horizon_days` days."""

    min_horizon_days: int = 5

    def world_config(self, **values: object) -> WorldConfig:
        values.setdefault("min_horizon_days", self.min_horizon_days)
        values.setdefault("max_horizon_days", max(self.max_horizon_days, self.min_horizon_days))
        return super().world_config(**values)


def _panels(config: DelayedDemoConfig, versions: list[int]) -> list[PanelScore]:
    """Re-score the panel with each round's policy version of a finished arm (the demo keeps
    its panel scores in memory only): the same panel and seeds as the demo's own scoring."""
    state = config.out_dir.resolve() / "state"
    settings = Settings(data_dir=state, db_url=f"sqlite:///{state / 'futureworld.db'}")
    engine = open_engine(settings)
    ctx = build_context(settings, engine)
    panel = build_panel(
        panel_world(config.world_config(seed=config.seed), config.panel_questions),
        config.panel_questions,
    )
    learner = ctx.agent(LEARNER)
    scores = []
    for round_no, number in enumerate(versions):
        with session_scope(engine) as session:
            version = get_policy_version(session, learner.id, number)
        scores.append(
            score_panel(
                ctx.backend(learner, version),
                learner.generation,
                panel,
                round_no=round_no,
                policy_version=number,
                samples=config.panel_samples,
                seed=config.seed,
            )
        )
    engine.dispose()
    return scores


def _config(args: argparse.Namespace, estimator: Estimator) -> DelayedDemoConfig:
    return DelayedDemoConfig(
        research=False,
        out_dir=args.out / str(estimator),
        rounds=args.rounds,
        questions_per_day=args.questions_per_day,
        panel_questions=args.panel,
        seed=args.seed,
        max_horizon_days=7,
        min_horizon_days=5,
        estimator=estimator,
        sft_days=args.sft_days,
        sft_epochs=args.sft_epochs,
    )


def run_arm(args: argparse.Namespace, estimator: Estimator) -> None:
    """One estimator's run; its versions by round and wall time go to `<out>/<arm>.json`."""
    started = time.perf_counter()
    result = run_demo(_config(args, estimator))
    wall_s = time.perf_counter() - started
    record = {"versions": [m.policy_version for m in result.rounds], "wall_s": wall_s}
    (args.out / f"{estimator}.json").write_text(json.dumps(record) + "\n")
    print(f"{estimator}: {args.rounds} rounds in {wall_s:.0f} s", flush=True)


def compare(args: argparse.Namespace) -> None:
    """The paired table of two finished arms."""
    arms = {e: json.loads((args.out / f"{e}.json").read_text()) for e in ARMS}
    panels = {e: _panels(_config(args, e), arm["versions"]) for e, arm in arms.items()}
    rows = []
    for r in range(args.rounds):
        dr, pc = panels[Estimator.DR_GRPO][r], panels[Estimator.PROVISIONAL_CONSENSUS][r]
        claim = learning_claim([dr, pc])
        assert claim is not None
        rows.append(
            {
                "round": r,
                "version": {"dr_grpo": dr.policy_version, PC: pc.policy_version},
                "brier": {"dr_grpo": brier(dr.p_yes, dr.y), PC: brier(pc.p_yes, pc.y)},
                "ece": {
                    "dr_grpo": expected_calibration_error(dr.p_yes, dr.y),
                    PC: expected_calibration_error(pc.p_yes, pc.y),
                },
                "brier_difference": claim.brier.difference,
                "brier_ci": list(claim.brier.ci),
                "ece_difference": claim.ece.difference,
                "ece_ci": list(claim.ece.ci),
                f"{PC}_gain": claim.brier.ci[1] < 0 and claim.ece.ci[1] < 0,
            }
        )
    summary = {
        "rounds": args.rounds,
        "panel_questions": args.panel,
        "questions_per_day": args.questions_per_day,
        "horizon_days": [5, 7],
        "seed": args.seed,
        "sft": {"days": args.sft_days, "epochs": args.sft_epochs},
        "wall_s": {str(e): arm["wall_s"] for e, arm in arms.items()},
        "by_round": rows,
    }
    (args.out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    lines = [
        f"| round | version dr_grpo / {PC} | Brier dr_grpo | Brier {PC} "
        f"| {PC} − dr_grpo [95% CI] | ECE dr_grpo | ECE {PC} | {PC} − dr_grpo [95% CI] |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['round']} | {row['version']['dr_grpo']} / {row['version'][PC]} "
            f"| {row['brier']['dr_grpo']:.4f} | {row['brier'][PC]:.4f} "
            f"| {row['brier_difference']:+.4f} [{row['brier_ci'][0]:+.4f}, "
            f"{row['brier_ci'][1]:+.4f}] | {row['ece']['dr_grpo']:.3f} | {row['ece'][PC]:.3f} "
            f"| {row['ece_difference']:+.3f} [{row['ece_ci'][0]:+.3f}, {row['ece_ci'][1]:+.3f}] |"
        )
    wall = summary["wall_s"]
    lines += [
        "",
        f"wall: dr_grpo {wall['dr_grpo']:.0f} s, {PC} {wall[PC]:.0f} s "
        f"(ratio {wall[PC] / wall['dr_grpo']:.2f})",
    ]
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


ARMS = (Estimator.DR_GRPO, Estimator.PROVISIONAL_CONSENSUS)
PC = str(Estimator.PROVISIONAL_CONSENSUS)
"""The second arm's key in results.json and its column in results.md."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--panel", type=int, default=1000)
    parser.add_argument("--questions-per-day", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sft-days", type=int, default=DemoConfig.sft_days)
    parser.add_argument("--sft-epochs", type=int, default=DemoConfig.sft_epochs)
    parser.add_argument(
        "--out", type=Path, default=Path("reports/provisional_consensus_vs_dr_grpo")
    )
    parser.add_argument(
        "--arm",
        choices=[*(str(e) for e in ARMS), "compare"],
        help="Run one estimator only (two processes can run the arms side by side), or only "
        "compare two finished arms; default: both arms, then the comparison.",
    )
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.arm is None:
        for estimator in ARMS:
            run_arm(args, estimator)
    elif args.arm != "compare":
        run_arm(args, Estimator(args.arm))
    if args.arm in (None, "compare"):
        compare(args)


if __name__ == "__main__":
    main()
