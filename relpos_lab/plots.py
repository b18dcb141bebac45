"""Accuracy-versus-length curves: the one way this project draws them.

Length generalisation is the question most position-scheme experiments ask, so a run's per-length
evaluation (tracking.plot_by_length) and a sweep's comparison of runs both draw the same picture:
one line per curve, sequence length on x, the training lengths shaded so extrapolation is visible
at a glance. Keeping one drawing function means the two can never disagree on what the plot shows.

Figures are built with matplotlib's object API on the Agg canvas, never pyplot, so plotting from a
training process touches no global backend state and needs no display.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

Curves = Mapping[str, Mapping[int | str, float]]


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
    if not curves:
        raise ValueError("plot_curves: no curves to draw")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    fig = Figure(figsize=(6.4, 4.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if train_range is not None:
        lo, hi = train_range
        ax.axvspan(lo - 0.5, hi + 0.5, color="0.9", zorder=0, label=f"train lengths {lo}–{hi}")

    values: list[float] = []
    for label, points in curves.items():
        xs = sorted(points, key=_length)
        ys = [float(points[x]) for x in xs]
        values.extend(ys)
        ax.plot([_length(x) for x in xs], ys, marker="o", markersize=3, label=str(label))

    finite = [v for v in values if math.isfinite(v)]
    if finite and min(finite) >= 0.0 and max(finite) <= 1.0:
        ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("sequence length")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return path


def _length(key: int | str) -> int:
    """A curve's x value: results.json stores lengths as strings, callers may pass ints."""
    try:
        return int(key)
    except (TypeError, ValueError):
        raise ValueError(f"plot_curves: length {key!r} is not an integer") from None
