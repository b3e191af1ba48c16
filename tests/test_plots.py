"""Plots say why when they have nothing to show, and the paired score by day is read against
dates with its intervals drawn."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from matplotlib.dates import date2num
from matplotlib.figure import Figure
from matplotlib.text import Text

from flows.orchestration.artifacts import dashboard_figure, training_curves_figure
from futureworld import scoring_numeric
from futureworld.domain import QUANTILE_LEVELS
from futureworld.plots import (
    metric_by_round_figure,
    paired_by_day_figure,
    pit_histogram_figure,
    plot_reliability,
    reliability_figure,
    save_png,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DAY0 = datetime(2025, 3, 1, tzinfo=UTC)


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


def _marks(fig: Figure) -> int:
    """Lines, bars and other data artists drawn in the figure's frames."""
    return sum(len(ax.lines) + len(ax.patches) + len(ax.collections) for ax in fig.axes)


EMPTY_CASES = {
    "reliability": (lambda: reliability_figure({"a v1": ([], [])}), "no resolved binary"),
    "metric by round": (
        lambda: metric_by_round_figure({"forecaster": []}, metric="Brier"),
        "no Brier recorded yet",
    ),
    "PIT": (lambda: pit_histogram_figure({}), "no resolved numeric forecasts yet"),
    "training curves": (lambda: training_curves_figure([]), "no loss recorded"),
    "dashboard": (
        lambda: dashboard_figure([{"version": 0, "status": "promoted"}], {}),
        "not recorded yet",
    ),
    "paired by day": (
        lambda: paired_by_day_figure(
            [DAY0],
            [None],
            [None],
            [None],
            label="a",
            reference_label="crowd",
            title="t",
            empty="no resolved questions yet",
        ),
        "no resolved questions yet",
    ),
}


@pytest.mark.parametrize("case", sorted(EMPTY_CASES))
def test_a_plot_with_nothing_to_show_says_why_in_its_frame(case: str, tmp_path: Path) -> None:
    build, message = EMPTY_CASES[case]
    fig = build()
    assert any(message in text for text in _texts(fig)), _texts(fig)
    assert _marks(fig) == 0  # the message, not an empty set of axes dressed as a plot
    assert save_png(fig, tmp_path / "empty.png").read_bytes()[:8] == PNG_MAGIC


def test_the_empty_message_is_the_callers_when_given() -> None:
    fig = reliability_figure({}, empty="no parsed forecasts: 0 of 12 rollouts parsed")
    assert "no parsed forecasts: 0 of 12 rollouts parsed" in _texts(fig)


def test_a_plot_with_data_draws_it_and_no_empty_message(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(size=50)
    y = (rng.uniform(size=50) < p).astype(float)
    pit = scoring_numeric.pit_histogram([(0.1, 0.2, 0.3, 0.4, 0.5)] * 3, QUANTILE_LEVELS,
                                        [0.05, 0.25, 0.9])  # fmt: skip
    figures = [
        reliability_figure({"a v1": (p, y)}),
        metric_by_round_figure({"a": [(0, 0.3), (1, 0.2)]}, metric="Brier"),
        pit_histogram_figure({"a v1": pit}),
        training_curves_figure([{"step": 0, "loss": 1.0, "kl_behaviour": 0.0}]),
    ]
    defaults = ["no resolved binary", "no Brier recorded", "no resolved numeric", "no loss"]
    for fig, message in zip(figures, defaults, strict=True):
        assert _marks(fig) > 0
        assert not any(message in text for text in _texts(fig))
    assert plot_reliability({"a v1": (p, y)}, tmp_path / "rel.png").stat().st_size > 5_000
    # A panel of the training curves without its metric says so; the others plot.
    [loss, kl, clip] = figures[3].axes
    assert loss.lines and kl.lines and not clip.lines
    assert any("no clip_fraction recorded" in t.get_text() for t in clip.texts)


def test_rounds_get_whole_number_ticks() -> None:
    fig = metric_by_round_figure({"a": [(0, 0.3), (1, 0.25), (2, 0.2)]}, metric="Brier")
    fig.canvas.draw()
    ticks = fig.axes[0].get_xticks()
    assert all(float(t).is_integer() for t in ticks)


def test_the_paired_score_by_day_has_dates_error_bars_and_the_reference_line() -> None:
    days = [DAY0 + timedelta(days=i) for i in range(4)]
    fig = paired_by_day_figure(
        days,
        [0.20, 0.18, None, 0.15],
        [(0.15, 0.26), (0.12, 0.22), None, (0.10, 0.19)],
        [0.22, 0.21, None, 0.20],
        label="tiny",
        reference_label="reference: crowd",
        counts=[4, 5, 0, 6],
        title="Backtest",
        empty="unused",
    )
    [ax] = fig.axes
    [bars] = ax.containers
    assert bars.has_yerr
    segments = bars.lines[2][0].get_segments()
    ends = [y for s in segments for y in (s[0][1], s[1][1])]
    assert ends == pytest.approx([0.15, 0.26, 0.12, 0.22, 0.10, 0.19])
    assert [s[0][0] for s in segments] == [date2num(d) for d in (days[0], days[1], days[3])]
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["2025-03-01", "2025-03-02", "2025-03-03", "2025-03-04"]  # unscored too
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "reference: crowd" in legend and "tiny" in legend
    reference_line = next(line for line in ax.lines if line.get_label() == "reference: crowd")
    assert list(reference_line.get_ydata()) == [0.22, 0.21, 0.20]
    assert {"n=4", "n=5", "n=6"} <= set(_texts(fig))
    assert "unused" not in _texts(fig)


def test_a_long_run_of_days_keeps_its_ticks_few() -> None:
    days = [date(2025, 1, 1) + timedelta(days=7 * i) for i in range(30)]
    fig = paired_by_day_figure(
        days, [0.2] * 30, [(0.1, 0.3)] * 30, [0.21] * 30, label="a", reference_label="r",
        title="t", empty="",
    )  # fmt: skip
    fig.canvas.draw()
    assert 2 <= len([t for t in fig.axes[0].get_xticklabels() if t.get_text()]) <= 10
