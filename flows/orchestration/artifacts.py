"""Prefect artifacts of the flows: score tables, reliability and training plots, and the
markdown summary of a daily cycle. Keys are stable (lowercase-dash) so the Prefect UI shows
each artifact's history across runs; PNGs are written under `<data_dir>/reports` and embedded
in their markdown artifacts as `data:image/png;base64,…` images, so the UI shows the plot
itself rather than a path on the machine that ran the flow."""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from futureworld.evaluation import (
    ForecastRecord,
    ScoreRow,
    reliability_groups,
    score_table_markdown,
)
from futureworld.plots import agg_figure, plot_reliability, save_png, say_empty

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SCORES_KEY = "evaluate-scores"
SCORE_TABLE_KEY = "evaluate-score-table"
RELIABILITY_KEY = "evaluate-reliability"
CYCLE_SUMMARY_KEY = "daily-cycle-summary"
HARVEST_SUMMARY_KEY = "harvest-summary"
TRAINING_METRICS = ("loss", "kl_behaviour", "clip_fraction")


@dataclass(frozen=True, kw_only=True)
class StageSummary:
    """What one stage of a cycle did, for the summary artifact."""

    stage: str
    """Stage label, e.g. `harvest` or `predict crowd`."""
    counts: dict[str, int] = field(default_factory=dict)
    """Integer fields of the stage's report (questions_new, rollouts …)."""
    errors: tuple[str, ...] = ()
    """Partial failures the stage caught and reported (one source, one item …)."""
    failed: str | None = None
    """Why the whole stage failed, when it did; the cycle went on without it."""
    note: str = ""
    """Why the stage did nothing, when it skipped (e.g. too few completed groups)."""


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key: lowercase letters, digits and dashes only."""
    key = re.sub(r"[^a-z0-9]+", "-", "-".join(parts).lower()).strip("-")
    if not key:
        raise ValueError(f"artifact key from {parts!r} is empty")
    return key


def report_counts(report: object) -> dict[str, int]:
    """The integer fields of a stage report dataclass (bools excluded)."""
    if report is None or not is_dataclass(report):
        return {}
    out: dict[str, int] = {}
    for f in fields(report):
        value = getattr(report, f.name)
        if isinstance(value, int) and not isinstance(value, bool):
            out[f.name] = value
    return out


def summarise(stage: str, report: object, *, note: str = "") -> StageSummary:
    errors = tuple(str(e) for e in getattr(report, "errors", ()) or ())
    return StageSummary(stage=stage, counts=report_counts(report), errors=errors, note=note)


def cycle_summary_markdown(
    run_key: str, stages: Sequence[StageSummary], *, title: str = "Daily cycle"
) -> str:
    crashed = [s for s in stages if s.failed is not None]
    partial = sum(len(s.errors) for s in stages)
    lines = [
        f"# {title} {run_key}",
        "",
        f"{len(stages)} stages: {len(stages) - len(crashed)} completed, {len(crashed)} failed; "
        f"{partial} partial errors.",
        "",
        "| stage | result | counts | errors |",
        "|---|---|---|---|",
    ]
    for s in stages:
        result = "failed" if s.failed is not None else (s.note or "ok")
        counts = ", ".join(f"{k} {v}" for k, v in s.counts.items()) or "—"
        lines.append(f"| {s.stage} | {_cell(result)} | {counts} | {len(s.errors)} |")
    problems = [(s.stage, s.failed) for s in crashed] + [
        (s.stage, e) for s in stages for e in s.errors
    ]
    if problems:
        lines += ["", "## What failed and why", ""]
        lines += [f"- **{stage}**: {_cell(str(why))}" for stage, why in problems]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:500]


def publish_cycle_summary(
    run_key: str, stages: Sequence[StageSummary], *, key: str = CYCLE_SUMMARY_KEY
) -> str:
    title = "Daily cycle" if key == CYCLE_SUMMARY_KEY else key.replace("-", " ").capitalize()
    markdown = cycle_summary_markdown(run_key, stages, title=title)
    create_markdown_artifact(markdown=markdown, key=key, description=f"{key} {run_key}")
    return markdown


def publish_scores(
    rows: Sequence[ScoreRow], records: Sequence[ForecastRecord], *, reports_dir: Path, run_key: str
) -> Path | None:
    """Score table (table and markdown artifacts) and the reliability diagram (PNG + markdown).

    Returns the PNG path, or None when no forecast has a resolved outcome yet.
    """
    table = [_jsonable(row.as_dict()) for row in rows]
    create_table_artifact(table=table, key=SCORES_KEY, description=f"scores as of {run_key}")
    create_markdown_artifact(
        markdown=f"# Scores as of {run_key}\n\n{score_table_markdown(rows)}",
        key=SCORE_TABLE_KEY,
        description=f"scores as of {run_key}",
    )
    if not records:
        return None
    path = plot_reliability(
        reliability_groups(records),
        reports_dir / f"reliability-{run_key}.png",
        title=f"Reliability {run_key}",
    )
    create_markdown_artifact(
        markdown=_image_markdown(f"Reliability {run_key}", path),
        key=RELIABILITY_KEY,
        description=f"reliability diagram as of {run_key}",
    )
    return path


def publish_training(
    agent: str, steps: Sequence[Mapping[str, Any]], *, reports_dir: Path, run_key: str, title: str
) -> Path:
    """Training curves (loss, KL to the behaviour policy, clip fraction) as a PNG plus a
    markdown table of the per-step metrics, keyed per agent."""
    path = plot_training_curves(
        steps, reports_dir / f"training-{artifact_key(agent)}-{run_key}.png"
    )
    header = ["step", *TRAINING_METRICS]
    lines = [f"# {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, step in enumerate(steps):
        cells = [str(step.get("step", i))] + [_number(step.get(m)) for m in TRAINING_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", _image_markdown("training curves", path)]
    create_markdown_artifact(
        markdown="\n".join(lines),
        key=artifact_key("training", agent),
        description=title,
    )
    return path


def plot_training_curves(steps: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """Write `training_curves_figure` as a PNG."""
    return save_png(training_curves_figure(steps), path)


def training_curves_figure(steps: Sequence[Mapping[str, Any]]) -> Figure:
    """One panel per metric in TRAINING_METRICS against the optimiser step; a panel without a
    recorded value says so in its frame."""
    from matplotlib.ticker import MaxNLocator

    fig = agg_figure(figsize=(12, 3.6))
    axes = fig.subplots(1, len(TRAINING_METRICS))
    for ax, metric in zip(axes, TRAINING_METRICS, strict=True):
        points = [
            (float(s.get("step", i)), float(s[metric]))
            for i, s in enumerate(steps)
            if s.get(metric) is not None
        ]
        ax.set_title(metric)
        if not points:
            say_empty(ax, f"no {metric} recorded:\n{len(steps)} optimiser step(s)")
            continue
        ax.plot([x for x, _ in points], [v for _, v in points], marker="o")
        ax.set(xlabel="optimiser step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    return fig


def _image_markdown(title: str, path: Path) -> str:
    """The PNG at `path` as a markdown image with its bytes inline (a data URI): both Prefect
    UIs render `data:image/…` image sources (V1's markdown renderer emits `<img src>` as is;
    V2 whitelists the `data:image/` scheme for images), while a `file://` link shows nothing
    in a browser. The file's path follows as plain text, for whoever is on that machine."""
    encoded = base64.b64encode(path.read_bytes()).decode("ascii")
    alt = re.sub(r"[\[\]\\]", "", title)
    return f"![{alt}](data:image/png;base64,{encoded})\n\nPNG file: `{path.resolve()}`\n"


def _number(value: Any) -> str:
    return "—" if value is None else f"{float(value):.4g}"


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in row.items()}


DASHBOARD_PLOTS = (
    ("Brier by version", ("brier", "validation_brier")),
    ("ECE by version", ("ece",)),
    ("parse rate by version", ("parse_rate", "validation_parse_rate")),
    ("reward and staleness by update", ("reward_mean", "staleness_mean")),
    ("entropy and kl_prox by update", ("entropy_mean", "kl_prox_max")),
    ("identical-answer groups by update", ("identical_answer_group_fraction",)),
)
"""The dashboard's panels: a title and the per-version figures it plots (x: the version)."""
REFERENCE_PANEL = "Brier by version"
"""The panel that carries the reference lines (the crowd, the base model, the warm start)."""
_LABELS = {
    "brier": "live Brier",
    "validation_brier": "validation Brier (gate)",
    "ece": "live ECE",
    "parse_rate": "live parse rate",
    "validation_parse_rate": "validation parse rate (gate)",
    "reward_mean": "mean reward",
    "staleness_mean": "mean staleness",
    "entropy_mean": "entropy / token",
    "kl_prox_max": "kl_prox (max)",
    "identical_answer_group_fraction": "share of groups",
}


def dashboard_rows(
    versions: Sequence[Any],
    health: Mapping[int, Mapping[str, float]],
    live: Mapping[int, Mapping[str, float]] | None = None,
) -> list[dict[str, Any]]:
    """One row per policy version: its status and gate figures, its update's health and, from
    the latest evaluate, its live scores (brier, ece, parse_rate, n)."""
    rows = []
    for v in versions:
        row: dict[str, Any] = {
            "version": v.version,
            "status": str(v.status),
            "parent": v.parent_version,
            "validation_questions": v.validation_questions,
            "validation_brier": v.validation_brier,
            "validation_parse_rate": v.validation_parse_rate,
        }
        row |= dict(health.get(v.version, {}))
        row |= dict((live or {}).get(v.version, {}))
        row["reason"] = v.status_reason
        rows.append(row)
    return rows


def live_scores(rows: Sequence[ScoreRow], agent: str) -> dict[int, dict[str, float]]:
    """Each version's overall live scores from an evaluate's rows (source, domain and round
    pooled)."""
    return {
        r.policy_version: {"brier": r.brier, "ece": r.ece, "parse_rate": r.parse_rate, "n": r.n}
        for r in rows
        if r.agent == agent
        and r.policy_version is not None
        and r.source is None
        and getattr(r, "domain", None) is None
        and getattr(r, "round", None) is None
    }


def publish_dashboard(
    agent: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    references: Mapping[str, float],
    reports_dir: Path,
    run_key: str,
) -> Path:
    """The agent's run dashboard, one artifact updated after every update and every evaluate:
    each version's status, gate verdict, live scores and update health as a table, and the
    curves across versions (Brier, ECE and parse rate with the reference lines; reward and
    staleness, entropy and kl_prox, identical-answer groups by update) as a PNG."""
    path = plot_dashboard(
        rows, references, reports_dir / f"dashboard-{artifact_key(agent)}-{run_key}.png"
    )
    columns = [
        ("version", None),
        ("status", None),
        ("n questions", "n"),
        ("live Brier", "brier"),
        ("ECE", "ece"),
        ("parse rate", "parse_rate"),
        ("validation Brier", "validation_brier"),
        ("mean reward", "reward_mean"),
        ("staleness", "staleness_mean"),
        ("entropy", "entropy_mean"),
        ("kl_prox max", "kl_prox_max"),
        ("identical", "identical_answer_group_fraction"),
        ("reason", None),
    ]
    lines = [f"# {agent}: run dashboard", ""]
    if references:
        named = ", ".join(f"{name} {value:.4f}" for name, value in references.items())
        lines += [f"Reference Brier: {named}.", ""]
    lines += ["| " + " | ".join(c for c, _ in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"v{row['version']}", str(row["status"])]
        cells += [_number(row.get(key)) for _, key in columns[2:-1]]
        cells.append(_cell(str(row.get("reason") or "")))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", _image_markdown("curves across versions", path)]
    create_markdown_artifact(
        markdown="\n".join(lines),
        key=artifact_key("dashboard", agent),
        description=f"{agent}: scores, gate verdicts and update health by version",
    )
    return path


def plot_dashboard(
    rows: Sequence[Mapping[str, Any]], references: Mapping[str, float], path: Path
) -> Path:
    """Write `dashboard_figure` as a PNG."""
    return save_png(dashboard_figure(rows, references), path)


def dashboard_figure(rows: Sequence[Mapping[str, Any]], references: Mapping[str, float]) -> Figure:
    """One panel per DASHBOARD_PLOTS entry against the version, rejected versions marked in
    red, the references as dashed lines on the Brier panel; a panel with nothing recorded yet
    says so in its frame."""
    from matplotlib.ticker import MaxNLocator

    fig = agg_figure(figsize=(14, 7.5))
    axes = fig.subplots(2, 3).ravel()
    for ax, (title, keys) in zip(axes, DASHBOARD_PLOTS, strict=True):
        ax.set_title(title)
        drawn = False
        for key in keys:
            points = [(r["version"], r[key], r["status"]) for r in rows if r.get(key) is not None]
            if not points:
                continue
            drawn = True
            ax.plot([x for x, _, _ in points], [y for _, y, _ in points], marker="o",
                    label=_LABELS[key])  # fmt: skip
            bad = [(x, y) for x, y, status in points if status == "rejected"]
            if bad:
                ax.scatter(*zip(*bad, strict=True), color="red", zorder=3, s=60)
        if not drawn:
            # a reference line alone is no curve: say what is missing, then draw the lines
            what = "\n".join(_LABELS[key] for key in keys)
            say_empty(ax, f"not recorded yet for\nany of {len(rows)} version(s):\n{what}")
        if title == REFERENCE_PANEL:
            for (name, value), style in zip(references.items(), ("--", ":", "-."), strict=False):
                ax.axhline(value, linestyle=style, color="grey", label=name)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="best", fontsize=8)
        if drawn:
            ax.set(xlabel="version")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
    if any(r["status"] == "rejected" for r in rows):
        fig.suptitle("red: versions the promotion gate rejected (never served)", fontsize=9)
    return fig
