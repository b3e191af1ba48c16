"""One update per agent at a time, and recovery from the updates that died.

Two `train` processes on one agent would race for the next version's checkpoint path (the
second moving the first's fresh checkpoint aside before it is registered). Every update of
an agent therefore runs inside `training_slot`: a session-level advisory lock on Postgres
(keyed by the agent, held on its own connection, so it is freed by the server when the
process dies, on whichever machine it ran), a file lock (`fcntl.flock`) on the agent's
checkpoint folder with SQLite (one machine, and the kernel frees it with the process). The
second process waits for the first, then trains on what is left (usually nothing).

Holding the slot is the heartbeat (decided here, the design being silent): no other update
of the agent can be alive, so a training run still `running` belongs to a dead process and
is marked failed at the start of the next update; then temporary and unregistered
checkpoint directories older than a day are removed. A lost database connection also frees
the advisory lock; the version's unique key still keeps a second registration out.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

from sqlalchemy import text

from flows.context import PipelineContext
from futureworld.domain import Agent
from storage.engine import run_transaction
from storage.repositories.agents import get_policy_version, latest_policy_version
from storage.repositories.training import fail_abandoned_training_runs

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

ABANDONED = "abandoned: its process died before the run finished (found at the next start)"
"""The error a training run is marked failed with when found abandoned."""


def advisory_lock_key(agent: Agent) -> int:
    """A stable signed 64-bit key for the agent's training lock (pg_advisory_lock's bigint)."""
    digest = hashlib.blake2b(f"futureworld-train:{agent.name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


@contextmanager
def _postgres_lock(ctx: PipelineContext, agent: Agent) -> Iterator[None]:
    with ctx.engine.connect() as connection:
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
        key = advisory_lock_key(agent)
        if not connection.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar():
            log.info("%s: another update of this agent is running; waiting for it", agent.name)
            connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        try:
            yield
        finally:
            try:
                connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            except Exception:  # The connection died: the server already freed the lock.
                log.warning("%s: training lock connection lost before unlock", agent.name)


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another update holds %s; waiting for it", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def checkpoints_folder(ctx: PipelineContext, agent: Agent) -> Path:
    return ctx.checkpoint_dir(agent, 0).parent


@contextmanager
def training_slot(ctx: PipelineContext, agent: Agent) -> Iterator[list[int]]:
    """Hold the agent's training lock; inside it, first fail the abandoned runs and remove
    stale checkpoints. Yields the ids of the runs marked failed."""
    lock = (
        _postgres_lock(ctx, agent)
        if ctx.engine.dialect.name == "postgresql"
        else _file_lock(checkpoints_folder(ctx, agent) / ".train.lock")
    )
    with lock:
        failed = run_transaction(
            ctx.engine,
            lambda session: fail_abandoned_training_runs(session, agent.id, error=ABANDONED),
            what="train: fail abandoned runs",
        )
        if failed:
            log.warning("%s: training run(s) %s were abandoned; marked failed", agent.name, failed)
        _remove_stale_checkpoints(ctx, agent)
        yield failed


def _remove_stale_checkpoints(ctx: PipelineContext, agent: Agent) -> None:
    from futureworld.rl.checkpoints import remove_stale_checkpoints

    def registered(session) -> list[Path]:
        newest = latest_policy_version(session, agent.id).version
        paths = []
        for version in range(newest + 1):
            try:
                paths.append(Path(get_policy_version(session, agent.id, version).checkpoint_path))
            except LookupError:
                continue
        return paths

    paths = run_transaction(ctx.engine, registered, what="train: registered checkpoints")
    for removed in remove_stale_checkpoints(checkpoints_folder(ctx, agent), paths):
        log.info("%s: removed stale checkpoint directory %s", agent.name, removed)


def one_update_per_agent(
    update: Callable[Concatenate[PipelineContext, str, P], R],
) -> Callable[Concatenate[PipelineContext, str, P], R]:
    """Run an update stage `update(ctx, agent_name, ...)` inside the agent's training slot."""

    @functools.wraps(update)
    def serialised(ctx: PipelineContext, agent_name: str, *args: P.args, **kwargs: P.kwargs) -> R:
        with training_slot(ctx, ctx.agent(agent_name)):
            return update(ctx, agent_name, *args, **kwargs)

    return serialised
