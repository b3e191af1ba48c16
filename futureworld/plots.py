"""Plots of scored forecasts: reliability diagrams, per-round line plots, the PIT histogram and a
paired score by simulated day; a plot with nothing to show says why in its own frame.

Owns drawing only: the groups and series come from evaluation.py and evaluation_kinds.py. Each
plot is a `*_figure` function (an Agg figure, no display needed, for tests to read), written as
a PNG by `save_png` (the `plot_*` functions do both).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from futureworld import scoring, scoring_numeric

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
"""Pixels per inch of every PNG: a figure of (7, 4) inches is 700 × 400 pixels."""


def agg_figure(figsize: tuple[float, float]) -> Figure:
    """A Figure on the Agg canvas: no pyplot global state, safe in worker threads and headless."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def say_empty(ax: Axes, reason: str) -> None:
    """Write why a frame has nothing to show in its middle, ticks off, so an empty plot is
    never a blank frame a reader has to guess about. Break a long reason with newlines: the
    frame does not wrap it."""
    text = ax.text(0.5, 0.5, reason, ha="center", va="center", transform=ax.transAxes,
                   color="dimgrey", fontsize="large")  # fmt: skip
    text.set_in_layout(False)  # a long reason must not shrink the frame it sits in
    ax.set_xticks([])
    ax.set_yticks([])


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write the figure as a PNG at `path` (its folder created), laid out to fit its labels."""
    out = Path(path)
    fig.tight_layout()
    # tight_layout leaves a placeholder layout engine, for which savefig would lay the figure
    # out again in a draw of its own (a quarter of the time); the layout is done: drop it.
    fig.set_layout_engine(None)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=DPI)
    return out


def reliability_figure(
    groups: Mapping[str, tuple[ArrayLike, ArrayLike]],
    *,
    bins: int = 10,
    title: str = "Reliability",
    empty: str = "no resolved binary forecasts yet",
) -> Figure:
    """A reliability diagram: observed YES frequency against mean forecast per bin, one line per
    group (labelled with its ECE and n), the diagonal, and a histogram of the forecasts; with no
    forecast in any group, `empty` in the frame."""
    fig = agg_figure(figsize=(6, 7))
    drawn = {label: (p, y) for label, (p, y) in groups.items() if np.size(p) > 0}
    if not drawn:
        ax = fig.subplots()
        ax.set_title(title)
        say_empty(ax, empty)
        return fig
    ax, hist = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey", linewidth=1, label="perfect")
    for label, (p, y) in drawn.items():
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
    return fig


def plot_reliability(
    groups: Mapping[str, tuple[ArrayLike, ArrayLike]],
    path: str | Path,
    *,
    bins: int = 10,
    title: str = "Reliability",
    empty: str = "no resolved binary forecasts yet",
) -> Path:
    """Write `reliability_figure` as a PNG."""
    return save_png(reliability_figure(groups, bins=bins, title=title, empty=empty), path)


def metric_by_round_figure(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    metric: str,
    title: str | None = None,
    xlabel: str = "round",
    empty: str | None = None,
) -> Figure:
    """A line plot of a metric per round, one line per label; whole-number x values (rounds,
    steps) get whole-number ticks. With no point in any series, `empty` (by default "no
    {metric} recorded yet") in the frame.

    series: {label: [(round, value), …]} (see `metric_by_round`); also fits training curves
    ({"loss": [(step, loss), …]}).
    """
    from matplotlib.ticker import MaxNLocator

    fig = agg_figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.set(title=title or f"{metric} by {xlabel}")
    drawn = {label: sorted(points) for label, points in series.items() if points}
    if not drawn:
        say_empty(ax, empty or f"no {metric} recorded yet")
        return fig
    for label, ordered in drawn.items():
        ax.plot([x for x, _ in ordered], [v for _, v in ordered], marker="o", label=label)
    if all(float(x).is_integer() for points in drawn.values() for x, _ in points):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel=xlabel, ylabel=metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def plot_metric_by_round(
    series: Mapping[str, Sequence[tuple[float, float]]],
    path: str | Path,
    *,
    metric: str,
    title: str | None = None,
    xlabel: str = "round",
    empty: str | None = None,
) -> Path:
    """Write `metric_by_round_figure` as a PNG."""
    figure = metric_by_round_figure(series, metric=metric, title=title, xlabel=xlabel, empty=empty)
    return save_png(figure, path)


def pit_histogram_figure(
    groups: Mapping[str, scoring_numeric.PitHistogram],
    *,
    title: str = "PIT histogram (numeric questions)",
    empty: str = "no resolved numeric forecasts yet",
) -> Figure:
    """Each group's PIT density per bin between quantile levels (bars side by side, each
    labelled with its n and 90% coverage), with the calibrated density 1 as a line; with no
    group, `empty` in the frame."""
    fig = agg_figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.set(title=title)
    drawn = {label: pit for label, pit in groups.items() if pit.counts.sum() > 0}
    if not drawn:
        say_empty(ax, empty)
        return fig
    width = 1.0 / (len(drawn) + 1)
    for g, (label, pit) in enumerate(drawn.items()):
        positions = np.arange(pit.counts.size) + g * width
        inside = pit.counts[1:-1].sum() / pit.counts.sum()
        ax.bar(
            positions,
            pit.density,
            width=width,
            label=f"{label} (n={int(pit.counts.sum())}, in 90%: {inside:.2f})",
        )
    edges = next(iter(drawn.values())).edges
    names = [f"{lo:.0%}–{hi:.0%}" for lo, hi in itertools.pairwise(edges)]
    ax.set_xticks(np.arange(len(names)) + width * (len(drawn) - 1) / 2, names)
    ax.axhline(1.0, linestyle="--", color="grey", linewidth=1, label="calibrated")
    ax.set(xlabel="PIT bin (between quantile levels)", ylabel="density (share / width)")
    ax.legend(fontsize="small")
    return fig


def plot_pit_histogram(
    groups: Mapping[str, scoring_numeric.PitHistogram],
    path: str | Path,
    *,
    title: str = "PIT histogram (numeric questions)",
    empty: str = "no resolved numeric forecasts yet",
) -> Path:
    """Write `pit_histogram_figure` as a PNG."""
    return save_png(pit_histogram_figure(groups, title=title, empty=empty), path)


def paired_by_day_figure(
    days: Sequence[date | datetime],
    values: Sequence[float | None],
    intervals: Sequence[tuple[float, float] | None],
    reference_values: Sequence[float | None],
    *,
    label: str,
    reference_label: str,
    counts: Sequence[int] | None = None,
    metric: str = "Brier",
    title: str,
    empty: str,
    uniform: float | None = 0.25,
) -> Figure:
    """A forecaster's score per simulated day against a reference scored on the same questions:
    the forecaster's points with their interval as error bars (`intervals`, on the score's own
    axis), the reference's score as a labelled dashed line, each point's n (`counts`) beside it
    and, with `uniform`, the score of always answering 0.5 as a dotted line. Days whose value
    is None have no score and no point; with none scored, `empty` in the frame."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, DateFormatter

    fig = agg_figure(figsize=(8, 4.5))
    ax = fig.subplots()
    ax.set(title=title)
    shown = [i for i, v in enumerate(values) if v is not None]
    if not shown:
        say_empty(ax, empty)
        return fig
    x = [_as_datetime(days[i]) for i in shown]
    y = np.array([values[i] for i in shown], dtype=np.float64)
    lo = np.array([np.nan if intervals[i] is None else intervals[i][0] for i in shown])
    hi = np.array([np.nan if intervals[i] is None else intervals[i][1] for i in shown])
    yerr = np.vstack([np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)])
    yerr = np.nan_to_num(yerr)
    ax.errorbar(x, y, yerr=yerr, fmt="o-", capsize=4, label=label, zorder=3)
    reference = [(x_i, reference_values[i]) for x_i, i in zip(x, shown, strict=True)]
    ax.plot([d for d, _ in reference], [v for _, v in reference], linestyle="--", marker="s",
            markersize=4, color="grey", label=reference_label)  # fmt: skip
    if uniform is not None:
        ax.axhline(uniform, linestyle=":", color="lightgrey", label=f"always 0.5 ({uniform:g})")
    if counts is not None and len(shown) <= 20:
        for x_i, y_i, i in zip(x, y, shown, strict=True):
            ax.annotate(f"n={counts[i]}", (x_i, y_i), textcoords="offset points", xytext=(6, 4),
                        fontsize="x-small", color="dimgrey")  # fmt: skip
    every_day = [_as_datetime(d) for d in days]
    if len(every_day) <= 12:  # a tick on every simulated day, scored or not, dated in full
        ax.set_xticks(every_day)
        ax.xaxis.set_major_formatter(DateFormatter("%Y-%m-%d"))
        ax.tick_params(axis="x", labelrotation=30)
    else:
        locator = AutoDateLocator(maxticks=8)
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    pad = max(timedelta(days=1), (max(every_day) - min(every_day)) / 20)
    ax.set_xlim(min(every_day) - pad, max(every_day) + pad)
    ax.set(xlabel="simulated day (UTC)", ylabel=f"{metric} (lower is better)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="best")
    return fig


def _as_datetime(day: date | datetime) -> datetime:
    return day if isinstance(day, datetime) else datetime(day.year, day.month, day.day)
