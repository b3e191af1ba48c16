"""Plots of scored forecasts: reliability diagrams, per-round line plots, the PIT histogram.

Owns drawing only: the groups and series come from evaluation.py and evaluation_kinds.py, and
every figure is an Agg figure, so plotting needs no display.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from futureworld import scoring, scoring_numeric
from futureworld.domain import QUANTILE_LEVELS


def agg_figure(figsize: tuple[float, float]) -> Any:
    """A Figure on the Agg canvas: no pyplot global state, safe in worker threads and headless."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def plot_reliability(
    groups: Mapping[str, tuple[ArrayLike, ArrayLike]],
    path: str | Path,
    *,
    bins: int = 10,
    title: str = "Reliability",
) -> Path:
    """Write a reliability diagram PNG: observed YES frequency against mean forecast per bin,
    one line per group (labelled with its ECE), the diagonal, and a forecast histogram."""
    fig = agg_figure(figsize=(6, 7))
    ax, hist = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    out = Path(path)
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect")
    for label, (p, y) in groups.items():
        rel = scoring.reliability_bins(p, y, bins)
        ece = scoring.expected_calibration_error(p, y, bins)
        filled = rel.counts > 0
        ax.plot(
            rel.mean_predicted[filled],
            rel.observed_frequency[filled],
            marker="o",
            label=f"{label} (ECE {ece:.3f}, n={int(rel.counts.sum())})",
        )
        hist.hist(np.asarray(p, dtype=np.float64), bins=rel.edges, alpha=0.5, label=label)
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="observed YES frequency", title=title)
    ax.legend(loc="upper left", fontsize="small")
    hist.set(xlabel="forecast P(yes)", ylabel="forecasts")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out


def plot_metric_by_round(
    series: Mapping[str, Sequence[tuple[float, float]]],
    path: str | Path,
    *,
    metric: str,
    title: str | None = None,
    xlabel: str = "round",
) -> Path:
    """Write a PNG line plot of a metric per round, one line per label.

    series: {label: [(round, value), …]} (see `metric_by_round`); also fits training curves
    ({"loss": [(step, loss), …]}).
    """
    fig = agg_figure(figsize=(7, 4))
    ax = fig.subplots()
    out = Path(path)
    for label, points in series.items():
        ordered = sorted(points)
        ax.plot([x for x, _ in ordered], [v for _, v in ordered], marker="o", label=label)
    ax.set(xlabel=xlabel, ylabel=metric, title=title or f"{metric} by {xlabel}")
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out


def plot_pit_histogram(
    groups: Mapping[str, scoring_numeric.PitHistogram],
    path: str | Path,
    *,
    title: str = "PIT histogram (numeric questions)",
) -> Path:
    """Write a PNG of each group's PIT density per bin between quantile levels (bars side by
    side, each labelled with its 90% coverage), with the calibrated density 1 as a line."""
    fig = agg_figure(figsize=(7, 4))
    ax = fig.subplots()
    out = Path(path)
    width = 1.0 / (len(groups) + 1)
    for g, (label, pit) in enumerate(groups.items()):
        positions = np.arange(pit.counts.size) + g * width
        inside = pit.counts[1:-1].sum() / pit.counts.sum()
        ax.bar(
            positions,
            pit.density,
            width=width,
            label=f"{label} (n={int(pit.counts.sum())}, in 90%: {inside:.2f})",
        )
    edges = (
        next(iter(groups.values())).edges
        if groups
        else np.concatenate([[0.0], QUANTILE_LEVELS, [1.0]])
    )
    names = [f"{lo:.0%}–{hi:.0%}" for lo, hi in itertools.pairwise(edges)]
    ax.set_xticks(np.arange(len(names)) + width * (len(groups) - 1) / 2, names)
    ax.axhline(1.0, linestyle="--", color="grey", linewidth=1, label="calibrated")
    ax.set(
        xlabel="PIT bin (between quantile levels)", ylabel="density (share / width)", title=title
    )
    ax.legend(fontsize="small")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=100)
    return out
