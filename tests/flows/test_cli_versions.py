"""`futureworld versions`, `gate`, `promote` and `reject` through the real entry point on
both databases: a person's reject and promote round trip through the lineage table, and each
mistake is one error line with exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from sqlalchemy import func, select

from flows.cli import app
from futureworld.domain import Agent, PolicyVersion, VersionStatus
from storage.engine import make_engine, session_scope
from storage.repositories.agents import (
    ensure_agent,
    get_agent,
    get_policy_version,
    register_policy_version,
    served_policy_version,
)
from storage.tables import TrainingRunRow, TrainStepRow


def _run(args: list[str], capfd, monkeypatch, tmp_path: Path) -> tuple[int, str, str]:
    for key in [k for k in os.environ if k.startswith("FW_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("FW_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "200")
    capfd.readouterr()
    with pytest.raises(SystemExit) as exit_:
        app(args=args, prog_name="futureworld")
    out, err = capfd.readouterr()
    return int(exit_.value.code or 0), out, err


@pytest.fixture
def lineage(db_url: str) -> str:
    """Agent "learner": v0, and v1 a candidate trained from it."""
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        agent = ensure_agent(session, Agent(name="learner", base_model="/m", backend="local"))
        register_policy_version(
            session,
            PolicyVersion(
                agent_id=agent.id,
                version=1,
                parent_version=0,
                checkpoint_path="/ckpt/v1",
                status=VersionStatus.CANDIDATE,
            ),
        )
    engine.dispose()
    return db_url


def _version(db_url: str, version: int | None = None) -> PolicyVersion:
    """Learner's `version`, or (None) the version it serves."""
    engine = make_engine(db_url)
    with session_scope(engine) as session:
        agent_id = get_agent(session, "learner").id
        if version is None:
            found = served_policy_version(session, agent_id)
        else:
            found = get_policy_version(session, agent_id, version)
    engine.dispose()
    return found


def test_reject_promote_and_versions_round_trip(
    lineage: str, capfd, monkeypatch, tmp_path: Path
) -> None:
    db = ["--db", lineage]
    code, out, _ = _run(["versions", "--agent", "learner", *db], capfd, monkeypatch, tmp_path)
    assert code == 0 and "serving v0" in out and "candidate" in out and "the base model" in out

    code, out, err = _run(
        ["reject", "--agent", "learner", "--version", "1", "--reason", "overconfident", *db],
        capfd,
        monkeypatch,
        tmp_path,
    )
    assert code == 0, err
    assert "learner v1: rejected (by hand: overconfident); learner serves v0" in out
    rejected = _version(lineage, 1)
    assert (rejected.status, rejected.status_reason) == (
        VersionStatus.REJECTED,
        "by hand: overconfident",
    )

    code, out, _ = _run(["versions", "--agent", "learner", *db], capfd, monkeypatch, tmp_path)
    assert code == 0 and "rejected" in out and "by hand: overconfident" in out

    code, out, err = _run(
        ["promote", "--agent", "learner", "--version", "1", "--reason", "looked fine", *db],
        capfd,
        monkeypatch,
        tmp_path,
    )
    assert code == 0, err
    assert "learner serves v1" in out
    assert _version(lineage).version == 1

    code, out, _ = _run(["versions", "--agent", "learner", *db], capfd, monkeypatch, tmp_path)
    assert code == 0 and "serving v1" in out and "by hand: looked fine" in out


def test_the_gate_by_hand_with_nothing_resolved_promotes_and_says_so(
    lineage: str, capfd, monkeypatch, tmp_path: Path
) -> None:
    code, out, err = _run(
        ["gate", "--agent", "learner", "--db", lineage], capfd, monkeypatch, tmp_path
    )
    assert code == 0, err
    assert "learner v1: promoted (no validation data" in out
    code, out, _ = _run(
        ["gate", "--agent", "learner", "--db", lineage], capfd, monkeypatch, tmp_path
    )
    assert code == 0 and "no candidate version to gate" in out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["reject", "--agent", "learner", "--version", "0", "--reason", "x"], "base model"),
        (["reject", "--agent", "learner", "--version", "7", "--reason", "x"], "v0–v1"),
        (["reject", "--agent", "learner", "--version", "1", "--reason", " "], "give the reason"),
        (["reject", "--agent", "learner", "--version", "1"], "--reason"),
        (["promote", "--agent", "nobody", "--version", "1"], "no agent named 'nobody'"),
        (["promote", "--agent", "learner", "--version", "-1"], "--version"),
        (["versions", "--agent", "nobody"], "no agent named 'nobody'"),
        (["gate", "--agent", "learner", "--version", "9"], "v0–v1"),
        (["gate", "--agent", "crowd"], "crowd is a baseline"),
    ],
)
def test_each_mistake_is_one_line_and_exit_2(
    args: list[str], says: str, lineage: str, capfd, monkeypatch, tmp_path: Path
) -> None:
    code, out, err = _run([*args, "--db", lineage], capfd, monkeypatch, tmp_path)
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2, out + err
    assert len(errors) == 1 and says in errors[0], err
    assert "Traceback" not in out + err
    assert _version(lineage, 1).status is VersionStatus.CANDIDATE


def test_train_reports_to_tensorboard_and_versions_prints_the_updates_health(
    db_url: str, capfd, monkeypatch, tmp_path: Path, scored_tiny_agent
) -> None:
    """The path that runs: `train --report-to tensorboard` gates its version, logs every step
    and its summary as event files, stores the summary with the training run, and
    `versions` prints that health next to the version."""
    from tensorboard.backend.event_processing import event_accumulator

    scored_tiny_agent(db_url, tmp_path / "data")
    db = ["--db", db_url]
    code, out, err = _run(
        [
            "train",
            "--agent",
            "tiny",
            "--report-to",
            "tensorboard",
            "--set",
            "learning_rate=1e-4",
            *db,
        ],
        capfd,
        monkeypatch,
        tmp_path,
    )
    assert code == 0, err
    assert "v0 → v1" in out and "v1: promoted by the gate (no validation data" in out

    engine = make_engine(db_url)
    with session_scope(engine) as session:
        agent_id = get_agent(session, "tiny").id
        [run] = session.scalars(select(TrainingRunRow).where(TrainingRunRow.agent_id == agent_id))
        steps = session.scalar(select(func.count()).where(TrainStepRow.training_run_id == run.id))
    engine.dispose()
    assert run.summary["groups"] == 3.0 and 0.0 <= run.summary["parse_rate"] <= 1.0
    assert "identical_answer_group_fraction" in run.summary

    [run_dir] = (tmp_path / "data" / "tracking" / "tensorboard" / "tiny").iterdir()
    events = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, steps + 1))
    assert events.Scalars("update/groups")[0].value == 3.0
    assert events.Scalars("update/groups")[0].step == 1  # the version it produced
    verdict = events.Scalars("eval/validation/promoted")  # the gate's, at the same version
    assert [(e.step, e.value) for e in verdict] == [(1, 1.0)]
    assert events.Scalars("eval/validation/questions")[0].value == 0.0

    code, out, err = _run(["versions", "--agent", "tiny", *db], capfd, monkeypatch, tmp_path)
    assert code == 0, err
    assert "update: groups 3, identical answers" in out and "entropy" in out
