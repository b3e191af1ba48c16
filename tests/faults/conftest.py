"""Fixtures of the fault suite: a throwaway Postgres cluster this suite may stop and restart
(its own data folder and port, run as the `postgres` user with Debian's initdb/pg_ctl; the
shared server on 5432 is never touched), a kill triggered by the progress a stage's work has
persisted (never by the clock, so a slow or loaded machine moves the kill with the work), and
the counts every fault must leave true.

A missing binary or a cluster that does not start is an error, never a skip."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, func, select, text

from storage.engine import make_engine, session_scope
from storage.repositories.agents import list_agents
from storage.repositories.claims import held_claims
from storage.tables import PolicyVersionRow, RewardRow, RolloutRow

PG_BIN = Path(os.environ.get("FW_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_postgres(*command: str) -> subprocess.CompletedProcess[str]:
    prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    return subprocess.run(
        [*prefix, *command], check=True, capture_output=True, text=True, timeout=120
    )


@dataclass
class ThrowawayPostgres:
    """A Postgres cluster of this test alone: `stop()`, `start()`, `start_in_background()`."""

    data_dir: Path
    port: int
    log_file: Path

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/faults"

    def _ctl(self, *args: str) -> None:
        _as_postgres(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file), *args
        )

    def start(self) -> None:
        self._ctl(
            "-w",
            "-o",
            f"-p {self.port} -k {self.data_dir} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server at once; every open connection is cut (`immediate` is a crash)."""
        self._ctl("-w", "-m", mode, "stop")

    def start_in_background(self) -> threading.Thread:
        """Start the server again in another thread (the caller's thread goes on at once)."""
        thread = threading.Thread(target=self.start, daemon=True)
        thread.start()
        return thread


@pytest.fixture
def throwaway_postgres() -> Iterator[ThrowawayPostgres]:
    for binary in ("initdb", "pg_ctl"):
        if not (PG_BIN / binary).is_file():
            raise RuntimeError(f"the fault suite needs {PG_BIN / binary} (set FW_TEST_PG_BIN)")
    root = Path(tempfile.mkdtemp(prefix="fw-faults-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    cluster = ThrowawayPostgres(root / "data", _free_port(), root / "server.log")
    _as_postgres(
        str(PG_BIN / "initdb"), "-D", str(cluster.data_dir), "-A", "trust", "-U", "postgres"
    )
    cluster.start()
    try:
        _as_postgres(str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(cluster.port), "faults")
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            cluster.stop()  # already stopped by a test's fault: the folder goes anyway
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def scored_tiny_agent() -> Callable[[str, Path], None]:
    """The flows suite's builder of a tiny-model agent with three scored groups to train on."""
    from tests.flows.conftest import _scored_tiny_agent

    return _scored_tiny_agent


@dataclass(frozen=True)
class Invariants:
    """The counts every fault must leave true."""

    rollouts: int
    duplicate_rollouts: int
    duplicate_rewards: int
    held_claims: int
    versions: int
    versions_without_matching_checkpoint: int


def invariants(engine: Engine) -> Invariants:
    from futureworld.rl.checkpoints import checkpoint_sha256

    with session_scope(engine) as session:
        rollout_key = (
            RolloutRow.question_id,
            RolloutRow.agent_id,
            RolloutRow.policy_version,
            RolloutRow.sample_index,
        )
        reward_key = (RewardRow.rollout_id, RewardRow.reward_fn, RewardRow.outcome_revision)
        duplicates = [
            int(
                session.scalar(
                    select(func.count()).select_from(
                        select(*key).group_by(*key).having(func.count() > 1).subquery()
                    )
                )
            )
            for key in (rollout_key, reward_key)
        ]
        versions = list(
            session.execute(
                select(PolicyVersionRow.checkpoint_path, PolicyVersionRow.checkpoint_sha256).where(
                    PolicyVersionRow.version > 0
                )
            ).all()
        )
        list_agents(session)  # the agents table reads back (no half-written row)
        return Invariants(
            rollouts=int(session.scalar(select(func.count()).select_from(RolloutRow))),
            duplicate_rollouts=duplicates[0],
            duplicate_rewards=duplicates[1],
            held_claims=held_claims(session),
            versions=len(versions),
            versions_without_matching_checkpoint=sum(
                1
                for path, sha in versions
                if not Path(path).is_dir() or checkpoint_sha256(Path(path)) != sha
            ),
        )


def read_only_engine(url: str) -> Engine:
    """An engine on the same database whose connections cannot write (Postgres: read-only
    transactions; SQLite: `query_only`): what watches a stage's progress never changes it."""
    engine = make_engine(url)

    @event.listens_for(engine, "connect")
    def read_only(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        if engine.dialect.name == "sqlite":
            cursor.execute("PRAGMA query_only = ON")
        else:
            cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
            dbapi_connection.commit()  # a SET inside the pool's rollback would be undone
        cursor.close()

    return engine


def count_rows(engine: Engine, sql: str) -> int:
    """One `SELECT count(...)` in a transaction of its own, so every poll sees what is
    committed now."""
    with engine.connect() as connection:
        return int(connection.execute(text(sql)).scalar_one())


POLL_S = 0.002
"""Between two reads of a stage's progress: well under the time its work takes to persist
one unit (a group, a reward batch, 25 optimiser steps), so a kill lands right after its
target."""


@dataclass(frozen=True)
class ProgressKill:
    """A SIGKILL sent once the progress a stage reported reached `target` of `total` units."""

    what: str
    target: int
    total: int
    at_kill: int
    """The units persisted once the process was dead: what the kill interrupted."""

    def landed_mid_work(self) -> bool:
        return 0 < self.at_kill < self.total


def kill_at_progress(
    command: Sequence[str],
    env: Mapping[str, str],
    progress: Callable[[], int],
    *,
    target: int,
    total: int,
    what: str,
    deadline_s: float = 600.0,
) -> ProgressKill:
    """Run `command`, read `progress()` (units of work this run has persisted) every POLL_S,
    and SIGKILL the process as soon as it reaches `target`; the deadline only guards against
    a stage that stops making progress, it never triggers the kill. A process that exits
    before its progress reached the target fails the test (the kill would have missed)."""
    assert 0 < target < total, f"{what}: a kill target must lie inside the work: {target}/{total}"
    with tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            deadline = time.monotonic() + deadline_s
            while (seen := progress()) < target:
                if process.poll() is not None:
                    stderr.seek(0)
                    tail = stderr.read().decode(errors="replace")[-3000:]
                    raise AssertionError(
                        f"{what} exited ({process.returncode}) with {seen} of {total} units "
                        f"persisted, before the kill target {target}:\n{tail}"
                    )
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{what} persisted {seen} of {total} units in {deadline_s:.0f} s, "
                        f"short of the kill target {target}: it stopped making progress"
                    )
                time.sleep(POLL_S)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
    return ProgressKill(what, target, total, progress())
