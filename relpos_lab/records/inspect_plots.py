"""The figures of `relpos-lab inspect`: where attention goes by relative offset, and what the
position scheme learned.

Every figure names its run and scheme in the title and says what its colours and axes measure:
attention mass is the mean probability per real query row (a row's masses sum to 1 over all
offsets), offsets are j − i in tokens (key minus query: negative = to the left). Heatmaps of one
figure share one colour scale starting at 0, so panels compare by eye. Built like plots.py: the
object API on the Agg canvas, never pyplot.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from relpos_lab.records.plots import save_figure

KIND_TITLES = {"encoder_self": "encoder self-attention", "decoder_self": "decoder self-attention",
               "cross": "cross-attention (query: target position, key: source position)"}
CROSS_NOTE = "an alignment off the diagonal (e.g. reversal) spreads over many offsets: see example_cross_*.png"
OFFSET_LABEL = "relative offset j − i (key − query, tokens)"
MASS_LABEL = "mean attention mass per query"
MAX_TOKEN_TICKS = 40


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")  # room for titles and colour bars
    FigureCanvasAgg(fig)
    return fig




def trimmed(offsets: Sequence[int], mass: np.ndarray, floor: float = 1e-12) -> tuple[list[int], np.ndarray]:
    """Drop outer offsets where no head has any mass (beyond the lengths measured, or ahead of a
    causal query), keeping 0."""
    keep = np.nonzero(mass.reshape(-1, mass.shape[-1]).max(0) > floor)[0]
    zero = list(offsets).index(0)
    lo, hi = min(keep.min(initial=zero), zero), max(keep.max(initial=zero), zero)
    return list(offsets)[lo:hi + 1], mass[..., lo:hi + 1]


def _visible(clip: int | None, offsets: Sequence[int]) -> list[int]:
    """The Shaw clipping offsets ±k that fall inside the drawn range."""
    return [] if clip is None else [x for x in (-clip, clip) if offsets[0] <= x <= offsets[-1]]


def plot_offset_heatmaps(panels: Mapping[str, tuple[Sequence[int], np.ndarray]], path: Path, title: str,
                         clip: int | None = None) -> Path:
    """One heatmap per panel: rows layer × head, columns offsets; `panels` maps a panel title to
    (offsets, mass (layers, heads, offsets)). One colour scale for all panels."""
    panels = {name: trimmed(*value) for name, value in panels.items()}
    vmax = max(float(m.max()) for _, m in panels.values()) or 1.0
    rows = max(m.shape[0] * m.shape[1] for _, m in panels.values())
    width = max(7.0, min(16.0, 3.0 + 0.2 * max(len(o) for o, _ in panels.values()) * len(panels)))
    fig = _figure(width, max(3.4, 2.0 + 0.28 * rows))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (name, (offsets, mass)) in zip(axes, panels.items()):
        layers, heads = mass.shape[:2]
        image = ax.imshow(mass.reshape(layers * heads, -1), aspect="auto", cmap="viridis", vmin=0.0, vmax=vmax,
                          interpolation="nearest",
                          extent=(offsets[0] - 0.5, offsets[-1] + 0.5, layers * heads - 0.5, -0.5))
        ax.set_yticks(range(layers * heads), [f"L{layer} H{head}" for layer in range(layers) for head in range(heads)],
                      fontsize="x-small")
        for boundary in range(1, layers):
            ax.axhline(boundary * heads - 0.5, color="white", linewidth=1.5)
        for x in _visible(clip, offsets):
            ax.axvline(x, color="red", linestyle="--", linewidth=1.2)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(OFFSET_LABEL)
        ax.set_title(name, fontsize="small")
    fig.colorbar(image, ax=list(axes), label=MASS_LABEL)
    shown = any(_visible(clip, offsets) for offsets, _ in panels.values())
    fig.suptitle(title + (f"\nred dashed lines: Shaw clipping distance ±{clip}" if shown else ""), fontsize="small")
    return save_figure(fig, path)


def plot_offset_lines(offsets: Sequence[int], mass: np.ndarray, path: Path, title: str,
                      clip: int | None = None) -> Path:
    """One line per head of one layer: mass (heads, offsets) against offset."""
    offsets, mass = trimmed(offsets, mass)
    fig = _figure(7.0, 4.2)
    ax = fig.add_subplot()
    for head, row in enumerate(mass):
        ax.plot(offsets, row, marker="o", markersize=2.5, linewidth=1, label=f"head {head}")
    for i, x in enumerate(_visible(clip, offsets)):
        ax.axvline(x, color="0.5", linestyle=":", linewidth=1, label=None if i else f"Shaw clip ±{clip}")
    ax.set_ylim(0, max(1e-3, float(mass.max()) * 1.05))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(OFFSET_LABEL)
    ax.set_ylabel(MASS_LABEL)
    ax.set_title(title, fontsize="small")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small", ncol=2)
    return save_figure(fig, path)


def plot_example_maps(maps: np.ndarray, path: Path, title: str, query_label: str, key_label: str,
                      query_tokens: Sequence[str] | None = None, key_tokens: Sequence[str] | None = None) -> Path:
    """All heads of one layer on one example: maps (heads, queries, keys), one colour scale from 0
    to the largest probability among them; the
    tokens label the axes when given and short enough to read (at most MAX_TOKEN_TICKS)."""
    heads = maps.shape[0]
    key_named = key_tokens is not None and len(key_tokens) == maps.shape[2] <= MAX_TOKEN_TICKS
    query_named = query_tokens is not None and len(query_tokens) == maps.shape[1] <= MAX_TOKEN_TICKS
    cols = min(heads, 4)
    rows = (heads + cols - 1) // cols
    vmax = max(float(maps.max()), 1e-6)  # diffuse maps stay visible; one scale for all heads
    fig = _figure(3.0 * cols + 1.2, 3.0 * rows + 0.8)
    axes = fig.subplots(rows, cols, squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= heads:
            ax.set_visible(False)
            continue
        image = ax.imshow(maps[h], cmap="magma", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if key_named:
            ax.set_xticks(range(len(key_tokens)), [f"{j}: {t}" for j, t in enumerate(key_tokens)],
                          rotation=90, fontsize="xx-small")
        if query_named:
            ax.set_yticks(range(len(query_tokens)), [f"{i}: {t}" for i, t in enumerate(query_tokens)],
                          fontsize="xx-small")
        ax.set_title(f"head {h}", fontsize="small")
        ax.set_xlabel(key_label + (": token" if key_named else ""), fontsize="x-small")
        ax.set_ylabel(query_label + (": token" if query_named else ""), fontsize="x-small")
    fig.colorbar(image, ax=list(axes.flat), label="attention probability")
    fig.suptitle(f"{title}\ncolour scale 0 to {vmax:.2f}, the largest probability in these maps", fontsize="small")
    return save_figure(fig, path)


def plot_drawings(drawings: Mapping[str, object], path: Path, title: str) -> Path:
    """A scheme's `Drawing`s of one layer (core/positions/base.py), one panel each; curves with a
    `spread` get a band of ± spread around each line."""
    fig = _figure(max(6.5, 4.6 * len(drawings)), 4.2)
    axes = fig.subplots(1, len(drawings), squeeze=False)[0]
    for ax, (name, d) in zip(axes, drawings.items()):
        x, values = np.asarray(d.x), np.asarray(d.values)
        if d.kind == "matrix":
            image = ax.imshow(values, cmap="RdBu_r", vmin=-1.0, vmax=1.0, interpolation="nearest",
                              extent=(x[0] - 0.5, x[-1] + 0.5, x[-1] + 0.5, x[0] - 0.5))
            fig.colorbar(image, ax=ax, label=d.ylabel, shrink=0.8)
            ax.set_ylabel(d.xlabel.replace("offset d", "offset d′"), fontsize="x-small")
        elif d.kind == "bars":
            ax.bar(x, values)
            ax.set_ylabel(d.ylabel)
        else:
            spread = None if getattr(d, "spread", None) is None else np.asarray(d.spread)
            for i, row in enumerate(values):
                label = d.line_label if d.line_label != "head" else f"head {i}"
                line, = ax.plot(x, row, marker="o", markersize=2.5, linewidth=1, label=label)
                if spread is not None:  # the band: ± spread around the line, in its colour
                    ax.fill_between(x, row - spread[i], row + spread[i], color=line.get_color(), alpha=0.15,
                                    linewidth=0)
            ax.set_ylabel(d.ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="x-small", ncol=2)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel(d.xlabel, fontsize="x-small")
        ax.set_title(d.title or name.replace("_", " "), fontsize="small")
    fig.suptitle(title, fontsize="small")
    return save_figure(fig, path)


def plot_mean_curves(curves: Mapping[str, tuple[Sequence[int], Sequence[float]]], path: Path, title: str) -> Path:
    """One line per label (a scheme), mass by offset averaged over layers, heads and runs."""
    fig = _figure(7.0, 4.2)
    ax = fig.add_subplot()
    for label, (offsets, mass) in curves.items():
        offsets, mass = trimmed(offsets, np.asarray(mass)[None])
        ax.plot(offsets, mass[0], marker="o", markersize=2.5, linewidth=1, label=label)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel(OFFSET_LABEL)
    ax.set_ylabel(MASS_LABEL + "\n(mean over layers, heads, runs)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize="small")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="x-small")
    return save_figure(fig, path)
