"""benchmarks/gpu_check.sh --smoke: the GPU check's code paths (bf16 trainer step, local
backend against raw generate, FSDP2 step) run on the CPU with a tiny config, so the script a
lent accelerator would run cannot rot where none is lent."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_smoke_mode_runs_every_measurement(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["mode"] == "smoke" and results["device"] == "cpu"
    train, fsdp, generate = results["train"], results["fsdp"], results["generate"]
    for measured in (train, fsdp):
        assert measured["tokens_per_s"] > 0 and 0 < measured["mfu"] < 1
        assert measured["tokens_per_step"] == 128
    # the same model, rows and step: FSDP2 computes the plain step's loss
    assert fsdp["first_step_loss"] == pytest.approx(train["first_step_loss"], rel=1e-5, abs=1e-7)
    assert fsdp["ratio_to_plain"] > 0
    assert generate["backend_tokens_per_s"] > 0 and generate["raw_tokens_per_s"] > 0
