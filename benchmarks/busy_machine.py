"""A busy machine: the demo and `orchestrate cycle` run idle and then with K other CPU-bound
jobs beside them (default 3), each as a fresh process with its own Prefect home, so each run
starts its own ephemeral Prefect server under that load. Reports each run's wall time, the
ratio busy/idle (target: at most 3x, no Prefect start-up time-out) and whether it finished.

A burner is a single-threaded Python busy loop (one core's worth of work, as a compile or
another training job would be). The cycle runs against the simulated world served on loopback
(Manifold-compatible API and RSS), over a fresh SQLite database holding the crowd baseline and
a tiny local learner (G = 4 rollouts on at most 40 questions each), so it harvests, predicts
with torch, evaluates and stores through the real CLI.

    .venv/bin/python benchmarks/busy_machine.py [--burners 3] [--demo-args "--rounds 3 ..."]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from flows.context import open_engine
from flows.settings import Settings
from futureworld.domain import Agent, BackendKind
from futureworld.policy.tiny import init_tiny_model
from futureworld.world import SimClock, World, WorldConfig, serve_world
from storage.engine import session_scope
from storage.repositories.agents import ensure_agent

ROOT = Path(__file__).resolve().parents[1]
FUTUREWORLD = str(Path(sys.executable).with_name("futureworld"))
DEMO_ARGS = "--no-research --rounds 3 --questions-per-day 20 --panel 200"
TIMEOUT_MARK = "Timed out while attempting to connect"


@dataclass(frozen=True)
class Run:
    name: str
    burners: int
    seconds: float
    returncode: int
    timed_out: bool


def _burn() -> None:
    while True:
        pass


@contextmanager
def burners(count: int) -> Iterator[None]:
    procs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(count)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.join()


def _environment(home: Path, extra: dict[str, str]) -> dict[str, str]:
    # A fresh Prefect home and none of the user's Prefect server settings: the run starts
    # its own ephemeral server, the step that timed out on a busy machine. The project's
    # own start-up wait and analytics defaults apply (flows/prefect_defaults.py).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "FW_"))}
    env |= {"PREFECT_HOME": str(home / "prefect"), "PYTHONUNBUFFERED": "1", **extra}
    return env


def timed(name: str, argv: list[str], env: dict[str, str], count: int, log: Path) -> Run:
    with burners(count):
        start = time.perf_counter()
        with log.open("w") as out:
            proc = subprocess.run(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
        seconds = time.perf_counter() - start
    run = Run(
        name, count, seconds, proc.returncode, TIMEOUT_MARK in log.read_text(errors="replace")
    )
    print(
        f"{run.name:18} burners {run.burners}: {run.seconds:7.1f} s, exit {run.returncode}, "
        f"Prefect start-up time-out: {run.timed_out}",
        flush=True,
    )
    return run


def demo_run(work: Path, demo_args: str, count: int) -> Run:
    home = work / f"demo-{count}"
    home.mkdir(parents=True)
    argv = [FUTUREWORLD, "demo", *shlex.split(demo_args), "--out", str(home / "out")]
    return timed("demo", argv, _environment(home, {}), count, home / "run.log")


def cycle_run(work: Path, count: int) -> Run:
    home = work / f"cycle-{count}"
    home.mkdir(parents=True)
    world = World(WorldConfig(seed=0, questions_per_day=40))
    clock = SimClock(world.day_start(3) + timedelta(hours=12))
    settings = Settings(data_dir=home, db_url=f"sqlite:///{home / 'futureworld.db'}")
    engine = open_engine(settings)
    model = init_tiny_model(home / "tiny", seed=0)
    with session_scope(engine) as session:
        ensure_agent(session, Agent(name="crowd", base_model="crowd", backend=BackendKind.BASELINE))
        ensure_agent(session, Agent(name="tiny", base_model=str(model), backend=BackendKind.LOCAL))
    engine.dispose()
    with serve_world(world, clock) as server:
        env = _environment(
            home,
            {
                "FW_DATA_DIR": str(home),
                "FW_MANIFOLD_BASE_URL": server.manifold_base_url,
                "FW_HTTP_RATE_PER_S": "0",
            },
        )
        argv = [
            FUTUREWORLD, "orchestrate", "cycle", "--as-of", clock.now().isoformat(),
            "--source", "manifold", "--feed", server.feed_urls["all"], "-G", "4", "--limit", "40",
            "--db", settings.database_url,
        ]  # fmt: skip
        return timed("orchestrate cycle", argv, env, count, home / "run.log")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burners", type=int, default=3)
    parser.add_argument("--demo-args", default=DEMO_ARGS)
    parser.add_argument("--skip-demo", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fw-busy-") as tmp:
        work = Path(tmp)
        pairs = [(cycle_run(work, 0), cycle_run(work, args.burners))]
        if not args.skip_demo:
            pairs.append(
                (demo_run(work, args.demo_args, 0), demo_run(work, args.demo_args, args.burners))
            )
        print(f"cores: {os.cpu_count()}, burners beside the busy runs: {args.burners}")
        print(f"demo args: {args.demo_args}")
        for idle, busy in pairs:
            print(f"{idle.name:18} busy / idle: {busy.seconds / idle.seconds:.2f}x")
        bad = [r for pair in pairs for r in pair if r.returncode or r.timed_out]
        if bad:
            raise SystemExit(f"failed runs: {[(r.name, r.burners) for r in bad]}")


if __name__ == "__main__":
    main()
