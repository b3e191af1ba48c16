"""The command line's contract, through its real entry point (`flows.cli.app`, what the
`futureworld` console script and `python -m flows` call; the last tests start `python -m
flows` processes): every misuse prints one line on stderr naming what was wrong and what to do
and exits 2; a run that fails (a requested source gave nothing) prints one line and exits 1;
nothing prints a traceback unless asked with --debug / FW_DEBUG=1.

The database of every case is a fresh Postgres database reached with a sentinel password
(the server trusts local connections, so any password works): no output of any case, no row of
the timer table and no byte of the Prefect database the `orchestrate cycle` runs wrote to may
contain it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from flows.cli import app
from flows.timers import JOB_TABLE, make_scheduler, schedule_check
from futureworld.domain import Agent, BackendKind
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent
from tests.conftest import POSTGRES_ADMIN_URL

REPO = Path(__file__).resolve().parents[2]
SENTINEL = f"sentinel-pw-{uuid.uuid4().hex[:12]}"


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DEAD_URL = f"http://127.0.0.1:{_dead_port()}"


@dataclass(frozen=True)
class Case:
    """One invocation: its arguments, extra environment, and what must come out."""

    args: tuple[str, ...]
    code: int
    says: str
    """A piece of the one error line (empty: the command succeeds)."""
    env: dict[str, str] = field(default_factory=dict)
    not_in_output: str = ""


@dataclass(frozen=True)
class Ran:
    code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def sentinel_db() -> Iterator[str]:
    """A fresh, migrated Postgres database, as a URL that carries the sentinel password."""
    yield from _fresh_database(Agent(name="uniform", base_model="uniform", backend="baseline"))


@pytest.fixture(scope="module")
def learner_db(workdir: Path) -> Iterator[str]:
    """Another such database, holding an agent with a policy to train (its model is never
    loaded: every case on it is refused first). Kept apart from `sentinel_db`, whose daily
    cycle predicts with every agent."""
    learner = Agent(name="learner", base_model=str(workdir / "model"), backend=BackendKind.LOCAL)
    yield from _fresh_database(learner)


def _fresh_database(agent: Agent) -> Iterator[str]:
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"fw_cli_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0]
    url = base.replace("://root@", f"://root:{SENTINEL}@") + f"/{name}"
    assert SENTINEL in url
    engine = make_engine(url)
    upgrade_database(engine)
    with session_scope(engine) as session:
        ensure_agent(session, agent)
    engine.dispose()
    yield url
    with admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli-contract")


def _cases(db: str, workdir: Path, learner_db: str = "") -> dict[str, Case]:
    deep = workdir / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    a_file = workdir / "a-file"
    a_file.write_text("not a folder")
    dead_db = f"postgresql+psycopg://root:{SENTINEL}@127.0.0.1:{_dead_port()}/test"
    dead_manifold = {"FW_MANIFOLD_BASE_URL": DEAD_URL, "FW_HTTP_MAX_RETRIES": "0"}
    return {
        "unknown agent": Case(("predict", "--agent", "nobody", "--db", db), 2, "no agent named"),
        "database down": Case(
            ("predict", "--agent", "uniform", "--db", dead_db), 2, "cannot open the database"
        ),
        "--db notaurl": Case(("db", "upgrade", "--db", "notaurl"), 2, "not a usable database"),
        "--db mysql://…": Case(
            ("db", "upgrade", "--db", f"mysql://root:{SENTINEL}@127.0.0.1/fw"),
            2,
            "unsupported database scheme 'mysql'; the supported schemes are postgresql and sqlite",
        ),
        "--db in a missing folder": Case(
            ("db", "upgrade", "--db", f"sqlite:///{workdir / 'no-such-folder' / 'x.db'}"),
            2,
            f"the folder {workdir / 'no-such-folder'} does not exist",
        ),
        "resolve --manual unknown id": Case(
            ("resolve", "--manual", "99999", "--verdict", "yes", "--db", db),
            2,
            "no question has id 99999",
        ),
        "--verdict maybe": Case(
            ("resolve", "--manual", "1", "--verdict", "maybe", "--db", db), 2, "'maybe'"
        ),
        "unwritable --json": Case(
            ("evaluate", "--json", str(a_file / "scores.json"), "--db", db), 2, "--json"
        ),
        "--as-of notadate": Case(
            ("predict", "--agent", "uniform", "--as-of", "notadate", "--db", db), 2, "notadate"
        ),
        "import a folder without a round": Case(
            ("import", "forecastbench", str(workdir), "--db", db), 2, "no round imported"
        ),
        "import deeply nested JSON": Case(
            ("import", "forecastbench", str(deep), "--db", db), 2, "nested too deep"
        ),
        "harvest --source nosuch": Case(
            ("harvest", "--source", "nosuch", "--db", db), 2, "unknown source 'nosuch'"
        ),
        "unreachable source": Case(
            ("harvest", "--source", "manifold", "--db", db),
            1,
            "harvest failed: nothing came through from manifold",
            env=dead_manifold,
        ),
        "predict --samples 0": Case(
            ("predict", "--agent", "uniform", "--samples", "0", "--db", db), 2, "--samples"
        ),
        "predict --samples -3": Case(
            ("predict", "--agent", "uniform", "--samples", "-3", "--db", db), 2, "--samples"
        ),
        "predict --limit -1": Case(
            ("predict", "--agent", "uniform", "--limit", "-1", "--db", db), 2, "--limit"
        ),
        "train --learning-rate -1": Case(
            ("train", "--agent", "uniform", "--learning-rate", "-1", "--db", db),
            2,
            "'--learning-rate': must be a number > 0",
        ),
        "train a baseline": Case(
            ("train", "--agent", "crowd", "--db", learner_db),
            2,
            "crowd is a baseline (backend baseline) and has no policy to train",
        ),
        "train --kl-reference 99": Case(
            ("train", "--agent", "learner", "--kl-reference", "99", "--db", learner_db),
            2,
            "KL reference v99: learner has versions v0–v0",
        ),
        "cycle with its only source unreachable": Case(
            ("orchestrate", "cycle", "--source", "manifold", "--as-of", "2026-02-01", "--db", db),
            1,
            "daily cycle failed: harvest: failed: nothing came through from manifold",
            env=dead_manifold,
            not_in_output="harvest: ok",
        ),
        "unknown command": Case(("nosuch",), 2, "No such command"),
        "a cycle that works": Case(
            ("orchestrate", "cycle", "--as-of", "2026-02-01", "--db", db), 0, ""
        ),
    }


def _environment(case: Case, workdir: Path, *, debug: bool = False) -> dict[str, str]:
    env = {"FW_DATA_DIR": str(workdir / "data"), **case.env}
    if debug:
        env["FW_DEBUG"] = "1"
    return env


def _in_process(case: Case, workdir: Path, capfd, monkeypatch) -> Ran:
    """The console entry point in this process: `app` with the case's arguments."""
    monkeypatch.setenv("FW_DB_URL", "")  # recorded, so the `--db` a command exports is undone
    for key in [k for k in os.environ if k.startswith("FW_")]:
        monkeypatch.delenv(key)
    for key, value in _environment(case, workdir).items():
        monkeypatch.setenv(key, value)
    capfd.readouterr()
    try:
        app(args=list(case.args), prog_name="futureworld")
    except SystemExit as exit_:
        code = exit_.code
    else:  # pragma: no cover - the entry point always exits
        code = None
    out, err = capfd.readouterr()
    return Ran(code if isinstance(code, int) else -1, out, err)


def _process(case: Case, workdir: Path, *, debug: bool = False) -> Ran:
    """`python -m flows` in a process of its own."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("FW_") and key != "PYTEST_CURRENT_TEST"
    }
    env |= _environment(case, workdir, debug=debug)
    done = subprocess.run(
        [sys.executable, "-m", "flows", *case.args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Ran(done.returncode, done.stdout, done.stderr)


OUTPUTS: list[str] = []
"""Everything any command of this module printed, for the sentinel check."""


CASE_NAMES = [
    "unknown agent",
    "database down",
    "--db notaurl",
    "--db mysql://…",
    "--db in a missing folder",
    "resolve --manual unknown id",
    "--verdict maybe",
    "unwritable --json",
    "--as-of notadate",
    "import a folder without a round",
    "import deeply nested JSON",
    "harvest --source nosuch",
    "unreachable source",
    "predict --samples 0",
    "predict --samples -3",
    "predict --limit -1",
    "train --learning-rate -1",
    "train a baseline",
    "train --kl-reference 99",
    "cycle with its only source unreachable",
    "unknown command",
]


def _check(case: Case, result: Ran) -> None:
    output = result.stdout + result.stderr
    OUTPUTS.append(output)
    assert result.code == case.code, output
    assert "Traceback" not in output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert case.says in errors[0], errors[0]
    assert result.stderr.strip().splitlines()[-1] == errors[0]
    if case.not_in_output:
        assert case.not_in_output not in output
    assert SENTINEL not in output


@pytest.mark.parametrize("name", CASE_NAMES)
def test_misuse_prints_one_line_and_the_right_exit_code(
    name: str, sentinel_db: str, learner_db: str, workdir: Path, prefect_harness, capfd, monkeypatch
) -> None:
    case = _cases(sentinel_db, workdir, learner_db)[name]
    _check(case, _in_process(case, workdir, capfd, monkeypatch))


def test_a_sqlite_file_in_a_missing_folder_is_not_created_but_the_data_dir_is(
    sentinel_db: str, workdir: Path, capfd, monkeypatch
) -> None:
    refused = _cases(sentinel_db, workdir)["--db in a missing folder"]
    _check(refused, _in_process(refused, workdir, capfd, monkeypatch))
    assert not (workdir / "no-such-folder").exists()

    data_dir = workdir / "new" / "data"  # the default database: its folders are made
    default = Case(("db", "upgrade"), 0, "", env={"FW_DATA_DIR": str(data_dir)})
    made = _in_process(default, workdir, capfd, monkeypatch)
    assert made.code == 0, made.stdout + made.stderr
    assert (data_dir / "futureworld.db").is_file()


@pytest.mark.parametrize("name", ["unknown agent", "harvest --source nosuch"])
def test_the_console_process_keeps_the_contract(name: str, sentinel_db: str, workdir) -> None:
    case = _cases(sentinel_db, workdir)[name]
    _check(case, _process(case, workdir))


def test_debug_shows_the_traceback(sentinel_db: str, workdir: Path) -> None:
    case = Case(("predict", "--agent", "nobody", "--db", sentinel_db), 2, "no agent named")
    result = _process(case, workdir, debug=True)
    OUTPUTS.append(result.stdout + result.stderr)
    assert result.code == 2 and "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: unknown agent")
    assert SENTINEL not in result.stdout + result.stderr


def test_no_secret_reaches_the_prefect_database_the_timer_table_or_any_output(
    sentinel_db: str, workdir: Path, prefect_harness, capfd, monkeypatch
) -> None:
    from prefect.settings import get_current_settings

    case = _cases(sentinel_db, workdir)["a cycle that works"]
    result = _in_process(case, workdir, capfd, monkeypatch)
    OUTPUTS.append(result.stdout + result.stderr)
    assert result.code == 0, result.stdout + result.stderr
    assert "evaluate:" in result.stdout and "predict uniform:" in result.stdout

    scheduler = make_scheduler(sentinel_db)
    scheduler.start(paused=True)
    try:
        schedule_check(scheduler, 1, "close", datetime.now(UTC) + timedelta(days=1))
    finally:
        scheduler.shutdown(wait=False)
    engine = make_engine(sentinel_db)
    with engine.connect() as connection:
        timer_rows = connection.execute(text(f"SELECT id, job_state FROM {JOB_TABLE}")).all()
    engine.dispose()
    assert timer_rows  # the check is stored…
    for row in timer_rows:
        assert SENTINEL.encode() not in bytes(row[1])  # …without the database URL

    database = get_current_settings().server.database.connection_url.get_secret_value()
    prefect_db = Path(database.split("///", 1)[1])
    written = [p for p in prefect_db.parent.glob(prefect_db.name + "*") if p.is_file()]
    assert written and sum(p.stat().st_size for p in written) > 0
    for path in written:
        assert SENTINEL.encode() not in path.read_bytes(), path
    assert OUTPUTS
    for output in OUTPUTS:
        assert SENTINEL not in output
