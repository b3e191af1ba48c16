"""The dependency rules of the architecture hold (import-linter contracts in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint_imports), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "6 kept, 0 broken" in result.stdout


def test_the_application_floor_is_organised_by_job() -> None:
    """flows/: one module per stage, one composition root, the Prefect layer, the command
    line and the demo, each in the place its name says."""
    flows = ROOT / "flows"
    stages = {p.stem for p in (flows / "stages").glob("*.py")} - {"__init__"}
    assert {
        "importing",
        "harvesting",
        "resolving",
        "predicting",
        "backfilling",
        "training",
        "evaluating",
    } <= stages
    for path in ("context.py", "timers.py", "orchestration/pipeline.py", "cli/__init__.py"):
        assert (flows / path).is_file(), path
    assert {p.stem for p in (flows / "demo").glob("*.py")} >= {"run", "panel", "report"}
    decorated = [
        p.relative_to(ROOT).as_posix()
        for p in flows.rglob("*.py")
        if "@flow(" in p.read_text() or "@task(" in p.read_text()
    ]
    assert decorated == ["flows/orchestration/pipeline.py"]
