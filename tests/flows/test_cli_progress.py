"""Progress of long CLI work: in a terminal a bar with done/total, percentage and ETA; in a
log a line per step and a heartbeat line at least every heartbeat_s, with the same figures;
`train` reports its optimiser steps done of planned."""

from __future__ import annotations

import io
import re
import time

import pytest
from rich.console import Console
from typer.testing import CliRunner

from flows.cli import app
from flows.cli.progress import progress_report


def _log_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=200), buffer


def test_a_log_gets_a_heartbeat_with_done_total_percentage_and_eta_while_nothing_changes():
    console, buffer = _log_console()
    with progress_report(console, "warm start", 10, heartbeat_s=0.05) as progress:
        progress.update(completed=3, note="loss 0.7")
        deadline = time.monotonic() + 60  # a failure guard, not the trigger
        while buffer.getvalue().count("warm start 3/10") < 3:
            assert time.monotonic() < deadline, buffer.getvalue()
            time.sleep(0.01)
        progress.update(description="rounds", completed=4)
    lines = buffer.getvalue().splitlines()
    beats = [line for line in lines if "warm start 3/10 (30%) ETA" in line]
    assert len(beats) >= 3 and all(line.endswith(", loss 0.7") for line in beats)
    assert "] warm start 3/10" in lines[0]  # the first update's line
    assert any("rounds 4/10 (40%)" in line for line in lines)  # a new step: a line at once
    assert "rounds 4/10" in lines[-1]  # and a last line when the work ends


def test_without_a_total_a_log_line_counts_what_is_done():
    console, buffer = _log_console()
    with progress_report(console, "predict tiny", heartbeat_s=3600) as progress:
        progress.update(advance=5)
    assert buffer.getvalue().splitlines()[-1].endswith("predict tiny 5 done")


def test_work_that_fails_before_its_first_update_prints_nothing_and_failed_work_no_last_line():
    console, buffer = _log_console()
    with pytest.raises(ValueError), progress_report(console, "import", heartbeat_s=3600):
        raise ValueError("its forecast_due_date is not the round")
    assert buffer.getvalue() == ""
    with pytest.raises(ValueError), progress_report(console, "import", 4, heartbeat_s=3600) as p:
        p.update(advance=1)
        raise ValueError("row 2 is broken")
    assert buffer.getvalue().splitlines() == [buffer.getvalue().splitlines()[0]]
    assert re.search(r"import 1/4 \(25%\) ETA \d+:\d\d$", buffer.getvalue().rstrip())


def test_a_terminal_shows_a_bar_with_done_total_percentage_and_eta():
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=160)
    with progress_report(console, "backtest tiny", 8) as progress:
        progress.update(advance=2, note="v3")
    text = buffer.getvalue()
    assert "backtest tiny" in text and "2/8" in text and "25%" in text
    assert "ETA" in text and "v3" in text


def test_train_outside_a_terminal_prints_its_steps_done_of_planned(
    db_url: str, scored_tiny_agent, tmp_path
):
    scored_tiny_agent(db_url, tmp_path)
    result = CliRunner().invoke(
        app,
        ["train", "--agent", "tiny", "--set", "groups_per_step=1", "--db", db_url],
        env={"FW_DATA_DIR": str(tmp_path), "FW_VALIDATION_FRACTION": "0"},
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    ours = [line for line in lines if "] train tiny" in line]
    assert "train tiny: step 1 1/3" in ours[0], lines  # the first update's line comes first
    # three groups, one a step: a line at each tenth, the done/planned count, then the end
    for done in (1, 2, 3):
        share = f"{done / 3:.0%}"
        assert any(f"train tiny: step {done} {done}/3 ({share})" in line for line in lines), lines
    assert any("ETA" in line and ", loss " in line for line in lines)
    assert any("v0 → v1 on 9 rollouts (3 groups" in line for line in lines)
