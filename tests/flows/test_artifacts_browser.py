"""The evaluate flow's artifacts as a person sees them: a real Prefect server (its bundled UIs
enabled), the evaluate flow run against it on a small database of resolved forecasts, and each
artifact's page loaded in headless Chromium, driven over the DevTools protocol until the
single-page app has rendered. Both UIs are checked: V2 (the default under /v2) and V1 (/).

The score table must render as an HTML table holding the agents and their Brier scores, and
the reliability diagram, the training curves and the run dashboard (curves across four
versions) as `<img>` elements whose source is the PNG itself (a `data:image/png;base64,…` URI
with the bytes of the file under reports) and which the browser decoded (natural width = the
PNG's width), never a `file://` path.

Chromium is required: a missing browser fails the test (`make test` installs it with
infra/browser/ensure_chromium.sh). Screenshots of every page are left in the test's tmp dir.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    ArtifactFilterKey,
)
from prefect.events.worker import EventsWorker
from prefect.settings import PREFECT_API_URL, PREFECT_LOGGING_TO_API_ENABLED, temporary_settings
from websockets.sync.client import ClientConnection, connect

from flows.orchestration.artifacts import (
    RELIABILITY_KEY,
    SCORE_TABLE_KEY,
    artifact_key,
    publish_dashboard,
    publish_training,
)
from flows.orchestration.pipeline import evaluate_flow
from futureworld.baselines import baseline_trajectory
from futureworld.domain import Agent, Outcome, OutcomeStatus, Question
from storage.engine import make_engine, session_scope, upgrade_database
from storage.repositories.agents import ensure_agent
from storage.repositories.questions import list_questions, record_outcomes, upsert_questions
from storage.repositories.rollouts import insert_rollouts
from tests.flows.conftest import stop_process
from tests.flows.prefect_server import running_prefect_server

CHROMIUM = os.environ.get("FW_CHROMIUM", "chromium")
CUTOFF = datetime(2026, 5, 1, tzinfo=UTC)
AS_OF = "2026-05-10"
TRAINING_KEY = artifact_key("training", "crowd")
DASHBOARD_KEY = artifact_key("dashboard", "forecaster")
PLOTS = [
    (RELIABILITY_KEY, "reliability_png"),
    (TRAINING_KEY, "training_png"),
    (DASHBOARD_KEY, "dashboard_png"),
]
RENDER_TIMEOUT_S = 60.0
UIS = {"v2": "/v2", "v1": ""}
"""UI version → path prefix of its routes; artifact pages are <prefix>/artifacts/artifact/<id>."""

# What the page shows, read from the live DOM: every table as rows of cell texts and every
# image with its source and the size the browser decoded it to (0 when it failed to load).
PAGE_STATE_JS = """(() => ({
  href: location.origin + location.pathname,
  ready: document.readyState,
  text: document.body ? document.body.innerText.slice(0, 2000) : "",
  tables: [...document.querySelectorAll("table")].map(t =>
    [...t.querySelectorAll("tr")].map(r =>
      [...r.querySelectorAll("th, td")].map(c => c.innerText.trim()))),
  images: [...document.querySelectorAll("img")].map(i => ({
    src: i.getAttribute("src") || "", alt: i.getAttribute("alt") || "",
    complete: i.complete, width: i.naturalWidth, height: i.naturalHeight})),
}))()"""


@pytest.fixture(scope="module")
def prefect_ui(tmp_path_factory) -> Iterator[str]:
    """A real Prefect server with both bundled UIs; yields its base URL (the API is /api)."""
    home = tmp_path_factory.mktemp("prefect-ui-home")
    with running_prefect_server(home, ui=True) as (base, _):
        ui = httpx.get(f"{base}/ui-settings", timeout=10).json()
        assert ui["api_url"] == f"{base}/api", ui
        assert set(ui["available_uis"]) == set(UIS), ui
        yield base


class Browser:
    """One headless Chromium tab, driven over the DevTools protocol."""

    def __init__(self, ws: ClientConnection, shots: Path) -> None:
        self._ws = ws
        self._next_id = 0
        self.shots = shots

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next_id += 1
        self._ws.send(json.dumps({"id": self._next_id, "method": method, "params": params}))
        while True:  # events arrive interleaved with replies; skip them
            message = json.loads(self._ws.recv(timeout=RENDER_TIMEOUT_S))
            if message.get("id") == self._next_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]

    def open(self, url: str, rendered: Callable[[dict[str, Any]], bool], shot: str) -> dict:
        """Navigate to `url`, wait until `rendered(page state)` holds (the SPA fetches the
        artifact after load), save a screenshot and return the page state."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + RENDER_TIMEOUT_S
        while True:
            state = self.call("Runtime.evaluate", expression=PAGE_STATE_JS, returnByValue=True)
            page = state["result"]["value"]
            if page["href"] == url.split("?")[0] and page["ready"] == "complete" and rendered(page):
                break
            if time.monotonic() > deadline:
                path = self.screenshot(shot)
                pytest.fail(
                    f"{url} did not render in {RENDER_TIMEOUT_S:.0f} s; screenshot {path}; "
                    f"at {page['href']} ({page['ready']}); "
                    f"images {[(i['src'][:60], i['width']) for i in page['images']]}; "
                    f"tables {page['tables'][:1]}; text:\n{page['text']}"
                )
            time.sleep(0.25)
        self.screenshot(shot)
        return page

    def screenshot(self, name: str) -> Path:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path = self.shots / f"{name}.png"
        path.write_bytes(base64.b64decode(data["data"]))
        return path


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Browser]:
    """Headless Chromium (run as root: no sandbox) with a throwaway profile."""
    binary = shutil.which(CHROMIUM)
    if binary is None:
        pytest.fail(
            f"{CHROMIUM!r} is not installed: the artifact pages are checked in a real browser. "
            "Install it with `bash infra/browser/ensure_chromium.sh` (`make test` does).",
            pytrace=False,
        )
    profile = tmp_path_factory.mktemp("chromium-profile")
    shots = tmp_path_factory.mktemp("screenshots")
    log = (profile.parent / "chromium.log").open("w")
    process = subprocess.Popen(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--window-size=1400,1800",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.exists() and active.read_text().strip()):
            assert process.poll() is None, (profile.parent / "chromium.log").read_text()
            assert time.monotonic() < deadline, "Chromium did not open its DevTools port in 60 s"
            time.sleep(0.2)
        port = int(active.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            tab = Browser(ws, shots)
            tab.call("Page.enable")
            tab.call("Runtime.enable")
            yield tab
    finally:
        stop_process(process, 30)
        log.close()


def _seed(db_url: str) -> None:
    """Two baseline agents (crowd, uniform) forecasting ten questions, all resolved."""
    engine = make_engine(db_url)
    upgrade_database(engine)
    with session_scope(engine) as session:
        upsert_questions(
            session,
            [
                Question(
                    source="sim",
                    external_id=f"q{i}",
                    title=f"Will event {i} happen?",
                    created_at=CUTOFF,
                    info_cutoff_at=CUTOFF,
                    close_at=CUTOFF + timedelta(days=2),
                    crowd_probability=0.1 + 0.08 * i,
                )
                for i in range(10)
            ],
        )
        crowd = ensure_agent(session, Agent(name="crowd", base_model="crowd", backend="baseline"))
        uniform = ensure_agent(
            session, Agent(name="uniform", base_model="uniform", backend="baseline")
        )
    with session_scope(engine) as session:
        questions = list_questions(session)
        forecasts = [
            baseline_trajectory(q, p, agent_id=agent.id, policy_version=0, as_of=CUTOFF)
            for q in questions
            for agent, p in ((crowd, q.crowd_probability), (uniform, 0.5))
        ]
        assert insert_rollouts(session, forecasts) == 2 * len(questions)
        record_outcomes(
            session,
            [
                Outcome(
                    question_id=q.id,
                    revision=0,
                    status=OutcomeStatus.RESOLVED,
                    value=float(i % 3 == 0),
                    resolved_at=CUTOFF + timedelta(days=3),
                )
                for i, q in enumerate(questions)
            ],
        )
    engine.dispose()


def _png_width(png: bytes) -> int:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", png[16:20])[0]  # IHDR width


def _artifact(flow_run_id: UUID, key: str):
    wanted = ArtifactFilter(
        key=ArtifactFilterKey(any_=[key]), flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])
    )
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=wanted)
    assert len(found) == 1, f"{key}: {len(found)} artifacts"
    return found[0]


@flow(name="training-curves")
def training_curves_flow(reports_dir: Path) -> Path:
    """The training-curves artifact of a five-step run (the daily cycle publishes the same
    after training an LLM agent)."""
    steps = [
        {"step": s, "loss": 1.0 / (s + 1), "kl_behaviour": 0.01 * s, "clip_fraction": 0.1}
        for s in range(5)
    ]
    return publish_training(
        "crowd", steps, reports_dir=reports_dir, run_key=AS_OF, title="Training crowd v0 → v1"
    )


@flow(name="run-dashboard")
def dashboard_flow(reports_dir: Path) -> Path:
    """The run dashboard of an agent with four versions (the daily cycle publishes the same
    after every update and evaluate): a warm start, two gated updates and a rejected one."""
    rows = [
        {"version": 0, "status": "promoted", "brier": 0.25, "ece": 0.0, "parse_rate": 0.1},
        {"version": 1, "status": "promoted", "brier": 0.22, "ece": 0.15, "parse_rate": 0.97},
    ]
    for version, brier, status in ((2, 0.21, "promoted"), (3, 0.48, "rejected")):
        rows.append(
            {
                "version": version,
                "status": status,
                "brier": brier,
                "validation_brier": brier + 0.01,
                "ece": 0.1,
                "parse_rate": 0.96,
                "reward_mean": -brier,
                "staleness_mean": 0.5,
                "entropy_mean": 0.5 if status == "promoted" else 0.02,
                "kl_prox_max": 0.05,
                "identical_answer_group_fraction": 0.1 if status == "promoted" else 0.9,
                "reason": "passed" if status == "promoted" else "collapsed",
            }
        )
    return publish_dashboard(
        "forecaster",
        rows,
        references={"crowd": 0.19, "warm start v1": 0.22},
        reports_dir=reports_dir,
        run_key=AS_OF,
    )


def _shows_png(png: bytes) -> Callable[[dict[str, Any]], bool]:
    """The page has decoded an <img> whose source is exactly `png` as a data URI."""
    src = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    return lambda page: any(i["src"] == src and i["width"] > 0 for i in page["images"])


@pytest.fixture(scope="module")
def published(prefect_ui, tmp_path_factory) -> Iterator[dict[str, Any]]:
    """The evaluate flow run against the server, plus a training-curves artifact; yields the
    artifacts (by key), the flow's score rows and the PNGs it wrote under reports."""
    data_dir = tmp_path_factory.mktemp("fw-data")
    db_url = f"sqlite:///{data_dir / 'fw.db'}"
    _seed(db_url)
    # Logs stay local and pending events are drained while this server is up: workers left
    # holding work for a server that is gone would stall the session's own harness teardown.
    with (
        pytest.MonkeyPatch.context() as env,
        temporary_settings(
            {PREFECT_API_URL: f"{prefect_ui}/api", PREFECT_LOGGING_TO_API_ENABLED: False}
        ),
    ):
        env.setenv("FW_DATA_DIR", str(data_dir))
        env.setenv("FW_DB_URL", db_url)  # the flows take their database from the environment
        state = evaluate_flow(as_of=AS_OF, return_state=True)
        assert state.is_completed(), state
        rows = state.result()
        run_id = state.state_details.flow_run_id
        training = training_curves_flow(data_dir / "reports", return_state=True)
        assert training.is_completed(), training
        training_png = training.result()
        dashboard = dashboard_flow(data_dir / "reports", return_state=True)
        assert dashboard.is_completed(), dashboard
        EventsWorker.drain_all()
        artifacts = {
            SCORE_TABLE_KEY: _artifact(run_id, SCORE_TABLE_KEY),
            RELIABILITY_KEY: _artifact(run_id, RELIABILITY_KEY),
            TRAINING_KEY: _artifact(training.state_details.flow_run_id, TRAINING_KEY),
            DASHBOARD_KEY: _artifact(dashboard.state_details.flow_run_id, DASHBOARD_KEY),
        }
    yield {
        "artifacts": artifacts,
        "rows": rows,
        "reliability_png": (data_dir / "reports" / f"reliability-{AS_OF}.png").read_bytes(),
        "training_png": training_png.read_bytes(),
        "dashboard_png": dashboard.result().read_bytes(),
    }


def test_the_artifacts_embed_the_plots_not_a_local_path(published) -> None:
    for key, artifact in published["artifacts"].items():
        assert "file://" not in artifact.data, key
    for key, png in PLOTS:
        encoded = base64.b64encode(published[png]).decode("ascii")
        assert f"(data:image/png;base64,{encoded})" in published["artifacts"][key].data


@pytest.mark.parametrize("ui", list(UIS))
def test_the_ui_renders_the_score_table(prefect_ui, browser, published, ui) -> None:
    artifact = published["artifacts"][SCORE_TABLE_KEY]
    url = f"{prefect_ui}{UIS[ui]}/artifacts/artifact/{artifact.id}"

    def score_table(page: dict[str, Any]) -> list[list[str]] | None:
        for table in page["tables"]:
            if table and {"agent", "source", "brier"} <= set(table[0]):
                return table
        return None

    page = browser.open(url, lambda p: score_table(p) is not None, f"{ui}-score-table")
    header, *body = score_table(page)
    cells = [dict(zip(header, row, strict=True)) for row in body]
    overall = {r["agent"]: r for r in published["rows"] if r["source"] is None}
    assert set(overall) == {"crowd", "uniform"}
    assert {c["agent"] for c in cells} == set(overall)
    assert len(cells) == len(published["rows"])
    for agent, row in overall.items():
        (shown,) = [c for c in cells if c["agent"] == agent and c["source"] == "all"]
        assert int(shown["n questions"]) == row["n"] == 10
        assert float(shown["parse rate"]) == row["parse_rate"] == 1.0
        assert abs(float(shown["brier"]) - row["brier"]) < 5e-4, (shown, row)
        assert abs(float(shown["log_score"]) - row["log_score"]) < 5e-4, (shown, row)
    assert float(next(c for c in cells if c["agent"] == "uniform")["brier"]) == 0.25


@pytest.mark.parametrize("ui", list(UIS))
@pytest.mark.parametrize(("key", "png"), PLOTS)
def test_the_ui_shows_the_plot_itself(prefect_ui, browser, published, ui, key, png) -> None:
    artifact = published["artifacts"][key]
    url = f"{prefect_ui}{UIS[ui]}/artifacts/artifact/{artifact.id}"
    page = browser.open(url, _shows_png(published[png]), f"{ui}-{key}")
    (image,) = [i for i in page["images"] if i["src"].startswith("data:image/png;base64,")]
    assert image["complete"] and image["width"] == _png_width(published[png]) > 0
    assert not [i for i in page["images"] if i["src"].startswith("file:")]
