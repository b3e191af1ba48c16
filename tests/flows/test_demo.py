"""A CI-sized demo end to end: the tiny model is warm-started, the daily cycle runs through the
Prefect flows against the world served on loopback, rewards arrive with delay, updates train
on stale rollouts, and the report folder holds the per-round metrics and plots."""

from __future__ import annotations

import json
import os

from flows.demo import DemoConfig, run_demo


def test_ci_sized_demo_runs_the_whole_loop_and_writes_its_report(prefect_harness, tmp_path) -> None:
    config = DemoConfig(
        out_dir=tmp_path / "demo",
        rounds=3,
        questions_per_day=6,
        samples=3,
        panel_questions=10,
        panel_samples=2,
        sft_days=2,
        sft_questions_per_day=40,
        sft_epochs=20,
        min_groups=2,
    )
    steps: list[str] = []
    before = os.environ.get("FW_DB_URL")
    result = run_demo(config, lambda step, done, total: steps.append(step))
    assert os.environ.get("FW_DB_URL") == before  # the demo's flow settings do not leak

    assert [m.round for m in result.rounds] == [0, 1, 2]
    versions = [m.policy_version for m in result.rounds]
    assert versions[0] == 1  # the SFT warm start
    assert versions[-1] > versions[0]  # replay-and-train registered new versions
    assert any(m.staleness and m.staleness > 0 for m in result.rounds), "no stale update"
    for m in result.rounds:
        assert m.n > 0 and 0.0 <= m.brier <= 1.0 and 0.0 <= m.ece <= 1.0
        assert m.brier_ci[0] <= m.brier <= m.brier_ci[1]
    metrics = json.loads((result.out_dir / "metrics.json").read_text())
    assert [r["round"] for r in metrics["rounds"]] == [0, 1, 2]
    assert {"brier", "ece", "accuracy", "true_brier", "n"} <= set(metrics["rounds"][0])
    for name in ("report.md", "brier_by_round.png", "ece_by_round.png", "reliability.png"):
        assert (result.out_dir / name).stat().st_size > 0
    assert steps[-1] == "done" and any(s.startswith("round 2") for s in steps)
