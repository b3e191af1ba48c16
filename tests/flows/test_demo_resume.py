"""`futureworld demo --resume`: a CI-sized demo SIGKILLed once its first round's cycle is
recorded continues from its state (warm start kept, the round's panel scored from the version
it served, the half-started round re-run on the database its predecessor left) and ends with
an uninterrupted run's results, exactly; a resume with another configuration, or with nothing
to resume, is refused before anything changes. The uninterrupted run, read through a pipe,
also shows the non-terminal heartbeat all through the warm start. A demo stopped with SIGTERM
at the same point ends its panel worker and Prefect's server before it exits."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.demo.config import DemoConfig
from flows.demo.kind_scores import KindPanelScore
from flows.demo.panel import PanelScore
from flows.demo.research_panel import ResearchPath, ResearchRound
from flows.demo.resume import MANIFEST, DemoState, ResumeRefused, load_state
from flows.demo.run import run_demo
from futureworld.domain import QuestionKind

DEMO = [
    str(Path(sys.executable).with_name("futureworld")),
    "demo",
    "--no-research",
    "--rounds", "2",
    "--questions-per-day", "12",
    "--samples", "2",
    "--panel", "200",
    "--sft-days", "2",
    "--sft-epochs", "3",
]  # fmt: skip
"""About the smallest demo that updates in round 1 (12 questions a day, half of them resolving
the next day, leave more than min_groups 4 completed groups after the gate's hold-out) and
whose warm start parses some panel answers (60 supervised steps; 40 parsed none of 40)."""
HEARTBEAT_S = 1.0
"""FW_HEARTBEAT_S of the test's runs: any warm start (model init, tokenizer training, 60
optimiser steps) lasts several of these on any machine, so the gap check has beats to check."""
MARGIN_S = 3.0
"""Slack over the interval for a beat's line to reach the pipe. Rich flushes every line, so no
block buffering delays it; what does is the heartbeat thread waiting for the interpreter lock
while native code holds it (the longest wait measured, 0.9 s at a load of 9 on 2 cores, in
the tokenizer's training) and the OS scheduling it and the test's reader on shared cores."""
RUN_GUARD_S = 1500
"""A failure guard, never the trigger: a run still going after this is killed."""
TRACKER_GUARD_S = 60.0
"""A failure guard for the resource tracker's own exit after the demo's (it ends within
milliseconds when its pipe closes)."""


def _run(out: Path, env: dict[str, str], *extra: str, kill_at: str | None = None):
    """Run the demo with stdout a pipe; its lines with the time each arrived, and its exit
    code. `kill_at`: SIGKILL the demo's whole process group (its panel worker and Prefect's
    server too) on the first line containing it."""
    process = subprocess.Popen(
        [*DEMO, "--out", str(out), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):  # the group has ended already
            os.killpg(process.pid, signal.SIGKILL)

    guard = threading.Timer(RUN_GUARD_S, kill)
    guard.start()
    lines: list[tuple[float, str]] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
            if kill_at is not None and kill_at in line:
                kill()
                break
        return lines, process.wait()
    finally:
        guard.cancel()
        kill()  # nothing of the run outlives the test
        process.wait()


def _descendants(pid: int) -> set[int]:
    """The processes below `pid`, from /proc (each process's parent is its stat's 4th field)."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that ended while listed
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _command(pid: int) -> str:
    """The command line of `pid` ("" once it has ended)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent's wait."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _warm_start_checkpoint(state: Path) -> tuple[int, int, int]:
    """(inode, mtime) of the version-1 checkpoint folder and the mtime of its weights."""
    folder = state / "checkpoints" / "forecaster" / "v1"
    weights = max(folder.glob("*.safetensors"), key=lambda p: p.stat().st_size)
    return folder.stat().st_ino, folder.stat().st_mtime_ns, weights.stat().st_mtime_ns


def _panel(state: Path) -> list[tuple[int, dict[str, float]]]:
    record = json.loads((state / MANIFEST).read_text())
    return [(r["policy_version"], r["panel"]) for r in record["rounds"]]


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_GUARD_S)
def test_a_demo_killed_after_its_first_round_resumes_to_the_uninterrupted_result(tmp_path):
    env = {
        **os.environ,
        "FW_HEARTBEAT_S": str(HEARTBEAT_S),
        "PREFECT_HOME": str(tmp_path / "prefect"),
    }
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    lines, code = _run(whole, env)
    assert code == 0, "\n".join(text for _, text in lines)

    # The warm start, heard through the pipe: a line at least every interval until round 0.
    texts = [text for _, text in lines]
    first = next(i for i, text in enumerate(texts) if "SFT warm start" in text)
    last = next(i for i, text in enumerate(texts) if "round 0: daily cycle" in text)
    during = lines[first : last + 1]
    assert sum("SFT warm start" in text for _, text in during) >= 3, texts[: last + 1]
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(during)]
    assert max(gaps) <= HEARTBEAT_S + MARGIN_S, (gaps, texts[first : last + 1])

    lines, code = _run(killed, env, kill_at="round 1: daily cycle")
    assert code == -signal.SIGKILL, "\n".join(text for _, text in lines)
    # Killed with round 0's cycle recorded and its panel, one round behind, not yet scored.
    assert [version for version, _ in _panel(killed / "state")] == [1]
    assert _panel(killed / "state")[0][1] is None
    warm = _warm_start_checkpoint(killed / "state")

    lines, code = _run(killed, env, "--resume")
    texts = [text for _, text in lines]
    assert code == 0, "\n".join(texts)
    assert any("resuming" in text and "warm start v1 kept" in text for text in texts), texts
    assert not any("SFT warm start" in text for text in texts), texts  # never retrained
    assert _warm_start_checkpoint(killed / "state") == warm
    log = (killed / "demo.log").read_text().splitlines()
    assert [line.split("round")[1].split()[0] for line in log if "panel Brier" in line] == [
        "0",
        "1",
    ]
    assert any(line.startswith("resuming") for line in log), log

    # Exactly the uninterrupted run's results: every round's panel scores and version, the
    # report's numbers (metrics.json: the rounds, the claim, the version lineage).
    assert _panel(killed / "state") == _panel(whole / "state")
    report = (killed / "metrics.json").read_text()
    assert report == (whole / "metrics.json").read_text()  # as text: a NaN equals itself
    resumed = json.loads(report)
    assert len(resumed["lineage"]) >= 3, resumed["lineage"]  # base, warm start, round 1's
    assert all(r["parse_rate"] > 0 for r in resumed["rounds"]), resumed["rounds"]


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_GUARD_S)
def test_a_demo_stopped_with_sigterm_ends_its_children_and_says_so(tmp_path):
    """SIGTERM to the demo alone (as `kill` and `pkill` send it), once its first round's
    panel is in flight in the worker process and Prefect's temporary server is up: the demo
    unwinds, exits 143 with one line, and leaves none of its processes running."""
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    process = subprocess.Popen(
        [*DEMO, "--out", str(tmp_path / "demo")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    guard = threading.Timer(RUN_GUARD_S, lambda: os.killpg(process.pid, signal.SIGKILL))
    guard.start()
    children: set[int] = set()
    trackers: set[int] = set()
    texts: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            texts.append(line.rstrip("\n"))
            if "round 1: daily cycle" in line:
                children = _descendants(process.pid)
                trackers = {pid for pid in children if "resource_tracker" in _command(pid)}
                process.send_signal(signal.SIGTERM)
                break
        # Not the pipe's end: an orphaned child would hold it open.
        code = process.wait(timeout=RUN_GUARD_S)
        left = [pid for pid in children - trackers if _alive(pid)]
        # multiprocessing's resource tracker ends by itself once the demo's exit closes its
        # pipe (it then frees what the killed worker left registered): it is waited for.
        tracker_guard = time.monotonic() + TRACKER_GUARD_S
        while any(_alive(pid) for pid in trackers) and time.monotonic() < tracker_guard:
            time.sleep(0.05)
        left += [pid for pid in trackers if _alive(pid)]
    finally:
        guard.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # nothing of the run outlives the test
        process.wait()
    texts += process.stdout.read().splitlines()

    assert children, texts  # the kill point was reached, with the worker and server running
    assert code == 143, "\n".join(texts)
    assert texts[-1] == "error: terminated by SIGTERM", texts[-5:]
    # Every child was stopped before the demo exited (an orphan is re-parented, alive), but
    # the resource tracker, which its exit ends.
    assert not left, (left, children)


def test_a_resume_is_refused_without_a_warm_start_or_with_another_configuration(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["demo", "--resume", "--rounds", "2", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "nothing to resume" in result.output, result.output
    assert not (tmp_path / "state").exists()  # refused before anything ran

    state = tmp_path / "state"
    state.mkdir()
    sqlite3.connect(state / "futureworld.db").close()
    DemoState.start(
        state,
        DemoConfig(out_dir=tmp_path, rounds=2),
        warm_start_version=1,
        demonstration_research=None,
    )
    before = sorted((p.name, p.stat().st_mtime_ns) for p in state.rglob("*"))
    result = runner.invoke(app, ["demo", "--resume", "--rounds", "3", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "another configuration (rounds 2 → 3)" in result.output, result.output
    with pytest.raises(ResumeRefused, match="seed 0 → 1"):
        run_demo(DemoConfig(out_dir=tmp_path, rounds=2, seed=1, resume=True))
    assert sorted((p.name, p.stat().st_mtime_ns) for p in state.rglob("*")) == before
    # Where the demo only writes or logs is not its configuration.
    assert load_state(state, DemoConfig(out_dir=tmp_path / "elsewhere", rounds=2)).cycled == 0


def test_a_resume_restores_the_database_its_last_cycled_round_left(tmp_path):
    database = tmp_path / "futureworld.db"
    writer = sqlite3.connect(database)
    writer.execute("PRAGMA journal_mode=WAL")  # as the demo's engine: commits sit in the WAL
    writer.execute("CREATE TABLE rows (n INTEGER)")
    writer.execute("INSERT INTO rows VALUES (0)")
    writer.commit()
    saved = DemoState.start(
        tmp_path, DemoConfig(rounds=2), warm_start_version=1, demonstration_research=None
    )
    writer.execute("INSERT INTO rows VALUES (1)")
    writer.commit()
    saved.round_cycled(0, 1)
    writer.execute("INSERT INTO rows VALUES (2)")  # round 1's half-finished cycle
    writer.commit()
    writer.close()

    loaded = load_state(tmp_path, DemoConfig(rounds=2))
    assert loaded.cycled == 1 and [r.round for r in loaded.unscored_rounds()] == [0]
    loaded.restore_database()
    with sqlite3.connect(database) as reader:
        assert [n for (n,) in reader.execute("SELECT n FROM rows ORDER BY n")] == [0, 1]
    assert sorted(p.name for p in (tmp_path / "resume").iterdir()) == ["after-round-000.db"]


def test_a_rounds_panel_scores_come_back_from_the_state_exactly(tmp_path):
    sqlite3.connect(tmp_path / "futureworld.db").close()
    saved = DemoState.start(
        tmp_path, DemoConfig(rounds=2), warm_start_version=1, demonstration_research=None
    )
    saved.round_cycled(0, 1)
    panel = PanelScore(
        round=0,
        policy_version=1,
        p_yes=(0.1, 2 / 3, 0.7000000000000001),
        y=(0.0, 1.0, 1.0),
        p_true=(0.2, 0.6, 1 / 7),
        question=(0, 1, 2),
        unparsed=1,
    )
    choice = KindPanelScore(
        kind=QuestionKind.CHOICE,
        round=0,
        policy_version=1,
        question=(0, 1),
        score=(0.25, 1 / 3),
        confidence=(0.5, 0.9),
        hit=(1.0, 0.0),
        true_score=0.125,
        unparsed=0,
    )
    saved.round_scored((panel, {QuestionKind.CHOICE: choice}))
    loaded = load_state(tmp_path, DemoConfig(rounds=2))
    assert loaded.scored_rounds() == [(panel, {QuestionKind.CHOICE: choice})]
    assert loaded.unscored_rounds() == [] and loaded.rounds[0].panel is not None
    assert loaded.rounds[0].panel["parse_rate"] == 0.75

    # A research round, with the kind panels researched beside it and its whole panel's round
    # (the claim's rounds score the head and the whole panel), comes back as it was.
    research = ResearchRound(
        score=panel,
        rollouts=4,
        searched=3,
        found_evidence=2,
        first_turn_tool_calls=3,
        assistant_turns=9,
        generated_tokens=40,
        uninformed_brier=0.25,
        path_errors={ResearchPath.FOUND: (0.125, 2), ResearchPath.UNSEARCHED: (0.5, 1)},
        found_moments=(2.0, 1.1, 1.0, 0.65, 0.52, 0.58),
        tool_errors=3,
        kinds=(choice, replace(choice, kind=QuestionKind.NUMERIC, score=(12.5, 3.0))),
    )
    saved.round_cycled(1, 2)
    whole = replace(research, rollouts=8, searched=6, kinds=())
    research = replace(research, score=replace(panel, round=1, policy_version=2), whole=whole)
    saved.round_scored(research)
    [_, back] = load_state(tmp_path, DemoConfig(rounds=2)).scored_rounds()
    assert back == research and back.whole == whole and back.whole.whole is None
    assert back.path_brier(ResearchPath.FOUND) == 0.0625
    assert [k.kind for k in back.kinds] == [QuestionKind.CHOICE, QuestionKind.NUMERIC]


def test_the_heartbeat_interval_is_fw_heartbeat_s_and_a_bad_one_is_refused(monkeypatch):
    from flows.cli.progress import HEARTBEAT_S as DEFAULT_S
    from flows.cli.progress import heartbeat_interval_s

    monkeypatch.delenv("FW_HEARTBEAT_S", raising=False)
    assert heartbeat_interval_s() == DEFAULT_S == 30.0
    monkeypatch.setenv("FW_HEARTBEAT_S", "2.5")
    assert heartbeat_interval_s() == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv("FW_HEARTBEAT_S", bad)
        with pytest.raises(ValueError, match="FW_HEARTBEAT_S must be a positive number"):
            heartbeat_interval_s()
