"""The project's two figures: metric-versus-length curves and per-group run spreads.

Length generalisation is the question most position-scheme experiments ask, so a run's per-length
evaluation (results.plot_by_length) and a sweep's comparison of runs both draw the same picture:
one line per curve, sequence length on x, the training lengths shaded so extrapolation is visible
at a glance. Keeping one drawing function means the two can never disagree on what the plot shows.

A sweep report also draws its main table (plot_groups): every run as a dot, so a mean over three
seeds cannot hide that one of them failed, and the published numbers, when the sweep carries them,
on their own axis because they come from another corpus and model size.

Figures are built with matplotlib's object API on the Agg canvas, never pyplot, so plotting from a
training process touches no global backend state and needs no display.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from relpos_lab.api.files import atomic_write_with

Curves = Mapping[str, Mapping[int | str, float]]
Groups = Mapping[str, Mapping[str, Sequence[float]]]


def plot_curves(
    curves: Curves,
    path: str | Path,
    train_range: tuple[int, int] | None = None,
    ylabel: str = "accuracy",
    title: str | None = None,
) -> Path:
    """Draw `{label: {length: value}}` as one line per label and save a PNG at `path`.

    Lengths may be ints or the digit strings JSON turns them into (results.json keys), so a sweep
    report can plot what it reads back without converting. `train_range` (inclusive) is shaded.
    Values all within [0, 1] get a fixed [0, 1] axis so plots of different runs compare by eye.
    """
    return save_figure(curves_figure(curves, train_range, ylabel, title), path)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Save `fig` at `path` (its format from the suffix) atomically: a disk that fills while it is
    written leaves the figure that was there, never half an image."""
    path = Path(path)
    atomic_write_with(path, lambda file: fig.savefig(file, format=path.suffix.lstrip(".").lower() or "png"))
    return path


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def series_style(i: int) -> dict:
    """The i-th series' look: the 10 colours, then again with another line style and marker, so
    the 15 schemes of a study (or 40 series) stay told apart."""
    return {"color": f"C{i % 10}", "linestyle": LINE_STYLES[i // 10 % 4], "marker": MARKERS[i // 10 % 4]}


def _draw_curves(ax, curves: Curves, train_range: tuple[int, int] | None, series: list, **line) -> dict:
    """Curves on one axes, the training lengths shaded; a series keeps its style (its index in
    `series`) wherever it is drawn. Returns each label's line."""
    if train_range is not None:
        lo, hi = train_range
        ax.axvspan(lo - 0.5, hi + 0.5, color="0.9", zorder=0, label=f"train lengths {lo}–{hi}")
    lines = {}
    for label, points in curves.items():
        xs = sorted(points, key=_length)
        (lines[str(label)],) = ax.plot([_length(x) for x in xs], [float(points[x]) for x in xs], label=str(label),
                                       **series_style(series.index(label)), **line)
    return lines


def curves_figure(curves: Curves, train_range: tuple[int, int] | None = None, ylabel: str = "accuracy",
                  title: str | None = None) -> Figure:
    """plot_curves' figure, unsaved (tests read its lines). Past 10 series the legend goes beside
    the axes, where it covers no curve."""
    if not curves:
        raise ValueError("plot_curves: no curves to draw")
    many = len(curves) > 10
    fig = Figure(figsize=(8.6 if many else 6.4, 4.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lines = _draw_curves(ax, curves, train_range, list(curves), markersize=3)
    values = [float(y) for line in lines.values() for y in line.get_ydata()]
    finite = [v for v in values if math.isfinite(v)]
    if finite and min(finite) >= 0.0 and max(finite) <= 1.0:
        ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("sequence length")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if many:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_panels(panels: Mapping[str, Curves], path: str | Path, train_range: tuple[int, int] | None = None,
                ylabel: str = "accuracy", title: str | None = None) -> Path:
    """One small panel of curves per key (a suite's tasks), the same series in the same style in
    every panel and one legend for all: the per-task picture a suite's single plot of every
    task × scheme line cannot give."""
    if not panels:
        raise ValueError("plot_panels: no panels to draw")
    series = list(dict.fromkeys(label for curves in panels.values() for label in curves))
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = Figure(figsize=(3.6 * cols + 2.2, 2.5 * rows + 0.6), dpi=110)
    FigureCanvasAgg(fig)
    handles = {}
    for n, (name, curves) in enumerate(panels.items()):
        ax = fig.add_subplot(rows, cols, n + 1)
        for label, line in _draw_curves(ax, curves, train_range, series, markersize=2, linewidth=1).items():
            handles.setdefault(label, line)
        ax.set_title(str(name), fontsize="small")
        ax.tick_params(labelsize="x-small")
        ax.grid(True, alpha=0.3)
        if n % cols == 0:
            ax.set_ylabel(ylabel, fontsize="x-small")
        if n >= len(panels) - cols:
            ax.set_xlabel("sequence length", fontsize="x-small")
    fig.legend(list(handles.values()), list(handles), fontsize="x-small", loc="upper right")
    if title:
        fig.suptitle(title, fontsize="small")
    fig.tight_layout(rect=(0, 0, 1 - 2.0 / (3.6 * cols + 2.2), 1))
    return save_figure(fig, path)


def plot_groups(
    panels: Groups,
    path: str | Path,
    reference: tuple[str, Mapping[str, float], str] | None = None,
    title: str | None = None,
    xlabel: str | None = None,
) -> Path:
    """Draw `{metric: {group: [one value per run]}}` as one panel per metric and save a PNG.

    Groups keep their order along x; each run is a dot, the mean ± sample std a bar beside them.
    `reference` = (metric, {group: value}, label) adds published values to that metric's panel on a
    right-hand axis with the same scale, shifted (another corpus has another level; differences
    between groups compare directly).
    """
    return save_figure(groups_figure(panels, reference, title, xlabel), path)


def groups_figure(
    panels: Groups,
    reference: tuple[str, Mapping[str, float], str] | None = None,
    title: str | None = None,
    xlabel: str | None = None,
) -> Figure:
    """plot_groups' figure, unsaved (tests read its axes)."""
    if not panels or not any(panels.values()):
        raise ValueError("plot_groups: no values to draw")
    # A panel is wide enough for its groups' names side by side (15 schemes at 30° overlapped).
    groups_n = max(len(groups) for groups in panels.values())
    panel_width = max(3.2, 0.3 * groups_n)
    fig = Figure(figsize=(min(0.8 + panel_width * len(panels), 24.0), 4.4), dpi=120)
    FigureCanvasAgg(fig)
    for i, (metric, groups) in enumerate(panels.items()):
        ax = fig.add_subplot(1, len(panels), i + 1)
        labels = list(groups)
        for x, label in enumerate(labels):
            values = [float(v) for v in groups[label]]
            if not values:
                continue
            ax.plot([x - 0.08] * len(values), values, "o", color="C0", markersize=4, alpha=0.7,
                    label="run" if x == 0 else None)
            mean, std = statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
            ax.errorbar([x + 0.08], [mean], yerr=[std], fmt="s", color="C1", capsize=3, markersize=5,
                        label="mean ± std" if x == 0 else None)
        if reference and reference[0] == metric:
            _, published, ref_label = reference
            xs = [x for x, label in enumerate(labels) if label in published]
            if xs:
                twin = ax.twinx()
                ys = [published[labels[x]] for x in xs]
                twin.plot(xs, ys, "D--", color="C2", fillstyle="none", markersize=5, label=ref_label)
                # Same units per inch on both axes, only shifted: a 0.3-point published effect must
                # not be stretched to the height of a 5-point one measured here.
                low, high = ax.get_ylim()
                span = max(high - low, 1.2 * (max(ys) - min(ys)))
                middle, ref_middle = (low + high) / 2, (max(ys) + min(ys)) / 2
                ax.set_ylim(middle - span / 2, middle + span / 2)
                twin.set_ylim(ref_middle - span / 2, ref_middle + span / 2)
                twin.set_ylabel(f"{ref_label} (right axis, same scale)", color="C2")
                twin.tick_params(axis="y", colors="C2")
                twin.legend(fontsize="small", loc="lower right")
        many, slanted = len(labels) > 8, max(map(len, labels)) > 6  # many names stand upright
        ax.set_xticks(range(len(labels)), labels, rotation=90 if many else 45 if slanted else 0,
                      ha="right" if slanted or many else "center", va="center" if many else "top",
                      rotation_mode="anchor", fontsize="small" if many else None)
        ax.set_xlim(-0.5, len(labels) - 0.5)
        ax.set_ylabel(metric.replace("_", " "))
        if xlabel:
            ax.set_xlabel(xlabel)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left")
    if title:
        fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    return fig


def _length(key: int | str) -> int:
    """A curve's x value: results.json stores lengths as strings, callers may pass ints."""
    try:
        return int(key)
    except (TypeError, ValueError):
        raise ValueError(f"plot_curves: length {key!r} is not an integer") from None
