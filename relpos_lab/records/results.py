"""What a run concluded: results.json (strictly checked numbers) and the per-length plots drawn
from it, as PNG files and W&B line plots."""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger

from relpos_lab.api.files import atomic_write
from relpos_lab.records.loggers import log_line_plot
from relpos_lab.records.plots import plot_curves
from relpos_lab.records.rundir import slugify


def write_results(
    run_dir: str | Path,
    metrics: Mapping[str, Any],
    by_length: Mapping[str, Mapping[Any, Mapping[str, Any]]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``run_dir/results.json``: ``{"metrics": ..., "by_length": ..., **extra}`` (`results_text`).

    Written atomically, so a reader never sees half a file and a kill mid-write leaves the previous
    results intact.
    """
    path = Path(run_dir) / "results.json"
    atomic_write(path, results_text(metrics, by_length, extra))
    return path


def results_text(
    metrics: Mapping[str, Any],
    by_length: Mapping[str, Mapping[Any, Mapping[str, Any]]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> str:
    """results.json's text, checked: a run's finishing checks it first and writes it last (its
    existence marks the run finished: training/finishing.py).

    The file is what sweeps and users' scripts read, so bad numbers are refused here rather than
    found later: every metric must be a finite real (0-d tensors from torchmetrics are accepted and
    converted). Lengths become JSON's string keys.
    """
    results: dict[str, Any] = {"metrics": _numbers(metrics, "metrics")}
    if by_length is not None:
        results["by_length"] = {
            str(split): {
                str(_as_length(length, f"by_length[{split!r}]")):
                    _numbers(row, f"by_length[{split!r}][{length!r}]")
                for length, row in lengths.items()
            }
            for split, lengths in by_length.items()
        }
    for key, value in (extra or {}).items():
        if key in results or key == "by_length":
            raise ValueError(f"write_results: extra key {key!r} would overwrite the {key!r} section")
        results[key] = value
    try:
        text = json.dumps(results, indent=2, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"write_results: extra is not strict JSON ({err})") from None
    return text + "\n"



def _numbers(values: Mapping[str, Any], where: str) -> dict[str, float | int]:
    if not isinstance(values, Mapping):
        raise ValueError(f"write_results: {where} must be a mapping of metric name to number, got {values!r}")
    return {str(name): _number(value, f"{where}[{name!r}]") for name, value in values.items()}



def _number(value: Any, where: str) -> float | int:
    if hasattr(value, "item") and not isinstance(value, (bool, Real)):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # a tensor/array with more than one element
            pass
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"write_results: {where} = {value!r} is not a number")
    if isinstance(value, Integral):
        return int(value)
    if not math.isfinite(value):
        raise ValueError(f"write_results: {where} = {value!r} is not finite")
    return float(value)



def _as_length(length: Any, where: str) -> int:
    try:
        if isinstance(length, bool) or int(length) != float(length):
            raise ValueError
        return int(length)
    except (TypeError, ValueError):
        raise ValueError(f"write_results: {where} has length key {length!r}, not an integer") from None



def plot_by_length(
    run_dir: str | Path,
    by_length: Mapping[str, Mapping[Any, Mapping[str, Any]]],
    train_range: tuple[int, int] | None,
    loggers: Iterable[Logger] = (),
    title: str | None = None,
) -> list[Path]:
    """Plot each per-length metric against length, one line per split, as PNG and W&B line plot.

    `by_length` is results.json's ``{split: {length: {metric: value}}}``. One figure per metric
    (accuracy and exact match side by side would share an axis, a loss would not), saved as
    ``run_dir/plots/by_length_<metric>.png``; the same data goes to each W&B logger as a line plot
    ``by_length/<metric>`` (with its table, so the chart can be edited in the W&B UI).
    """
    metrics = sorted({m for lengths in by_length.values() for row in lengths.values() for m in row})
    paths = []
    for metric in metrics:
        curves = {
            split: {length: row[metric] for length, row in lengths.items() if metric in row}
            for split, lengths in by_length.items()
        }
        curves = {split: points for split, points in curves.items() if points}
        heading = f"{title}: {metric}" if title else f"{metric} by length"
        path = Path(run_dir) / "plots" / f"by_length_{slugify(metric)}.png"
        paths.append(plot_curves(curves, path, train_range=train_range, ylabel=metric, title=heading))
        log_line_plot(loggers, f"by_length/{metric}", curves, x="length", y=metric, title=heading)
    return paths

