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
    contracts = (ROOT / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    assert f"{contracts} kept, 0 broken" in result.stdout


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


def _import_cycles(package: str) -> list[list[str]]:
    """Every cycle a depth-first walk of the package's run-time import graph meets (imports
    inside functions included, TYPE_CHECKING imports excluded)."""
    import grimp

    graph = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if state.get(imported) == 1:
                cycles.append([*path[path.index(imported) :], imported])
            elif imported not in state:
                visit(imported, path)
        path.pop()
        state[module] = 2

    for module in sorted(graph.modules):
        if module not in state:
            visit(module, [])
    return cycles


def test_the_core_package_has_no_import_loop() -> None:
    """No module of futureworld/ imports one that imports it back, at module level or inside
    a function (the trainer's launcher, its loop and its step once formed such a loop)."""
    assert _import_cycles("futureworld") == []
