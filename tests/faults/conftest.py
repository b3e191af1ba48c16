"""Fixtures of the fault suite: a throwaway Postgres cluster this suite may stop and restart
(its own data folder and port, run as the `postgres` user with Debian's initdb/pg_ctl; the
shared server on 5432 is never touched), and the counts every fault must leave true.

A missing binary or a cluster that does not start is an error, never a skip."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from storage.engine import session_scope
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
    """A Postgres cluster of this test alone: `stop()`, `start()`, `restart_after(s)`."""

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

    def start_after(self, delay_s: float) -> threading.Thread:
        """Start the server again after `delay_s`, in the background."""

        def later() -> None:
            time.sleep(delay_s)
            self.start()

        thread = threading.Thread(target=later, daemon=True)
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
