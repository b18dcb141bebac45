"""What `relpos-lab report` writes beside report.md: summary.csv and by_length.csv, the by-length
plots (one panel per task for a suite), groups.png (every run) and the attention-by-offset plots.
`groups` are report.py's Groups: the runs of one grid cell."""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

from relpos_lab.records.inspect_plots import KIND_TITLES, plot_mean_curves
from relpos_lab.records.plots import plot_curves, plot_groups, plot_panels


def attention_curves(groups: list) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """{attention kind: {group: (offsets, mass)}}: each run's inspect.json curve on its inspected
    split, averaged over layers and heads, then over the group's runs (runs without one skipped)."""
    sums: dict[str, dict[str, dict[int, list[float]]]] = {}
    for g in groups:
        for run_dir in g.run_dirs:
            path = Path(run_dir) / "inspect.json"
            if not path.is_file():
                continue
            numbers = json.loads(path.read_text())
            for kind, a in numbers["sets"][numbers["split"]]["attention"].items():
                per_offset = sums.setdefault(kind, {}).setdefault(g.label, {})
                heads = [row for layer in a["mass"] for row in layer]
                for i, offset in enumerate(a["offsets"]):
                    per_offset.setdefault(offset, []).append(statistics.fmean(row[i] for row in heads))
    out: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for kind, by_group in sums.items():
        for label, per_offset in by_group.items():
            runs = max(len(v) for v in per_offset.values())  # a run without an offset had no mass there
            offsets = sorted(per_offset)
            out.setdefault(kind, {})[label] = (offsets, [sum(per_offset[o]) / runs for o in offsets])
    return out


def write_csvs(out: Path, names: list[str], rows: list[dict], curves: dict, how: str) -> None:
    """summary.csv (a row per group) and by_length.csv (a row per group, metric and length)."""
    columns = ("mean", "std") if how == "mean" else ("best",)
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["group", "n_runs"] + [f"{m}_{c}" for m in names for c in columns])
        for row in rows:
            w.writerow([row["group"], row["n"]] + [_number(row[m][i]) if m in row else ""
                                                   for m in names for i in range(len(columns))])
    with open(out / "by_length.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["group", "metric", "length", *columns, "n_runs"])
        for m, table in curves.items():
            for label, points in table.items():
                for n, (value, spread, k) in points.items():
                    w.writerow([label, m, n, _number(value), *((_number(spread),) if how == "mean" else ()), k])


def plot_by_length(out: Path, name: str, groups: list, curves: dict, split: str,
                   train: tuple[int, int] | None, averaged: str) -> dict:
    """One by-length plot per metric, and for a grid of two axes (tasks × schemes) one panel per
    task with a line per scheme; returns {metric: the panels' path}. `averaged` says what a line is."""
    for m, table in curves.items():
        if table:
            plot_curves({g: {n: v[0] for n, v in pts.items()} for g, pts in table.items()},
                        out / f"{m}_by_length.png", train, ylabel=f"{split} {m.replace('_', ' ')}",
                        title=f"{name}: {averaged}")
    axes = list(groups[0].labels)
    panels = {}
    if len(axes) == 2:
        for m, table in curves.items():
            by_row: dict[str, dict] = {}
            for g in groups:
                if g.label in table:
                    by_row.setdefault(g.labels[axes[0]], {})[g.labels[axes[1]]] = {
                        n: v[0] for n, v in table[g.label].items()}
            if by_row:
                panels[m] = plot_panels(by_row, out / f"{m}_by_length_per_{axes[0]}.png", train,
                                        ylabel=f"{split} {m.replace('_', ' ')}",
                                        title=f"{name}: {split} {m} by length, one panel per {axes[0]}")
    return panels


def plot_every_run(out: Path, name: str, groups: list, shown: list[str], split: str, reference: dict | None,
                    paper: str | None) -> bool:
    """groups.png: every run beside its group's mean ± std (and the published numbers); False
    when no run reports a shown metric."""
    spread = {m: {g.label: [r["metrics"][f"{split}/{m}"] for r in g.results if f"{split}/{m}" in r["metrics"]]
                  for g in groups} for m in shown}
    if not any(v for per_group in spread.values() for v in per_group.values()):
        return False
    plot_groups(spread, out / "groups.png", title=f"{name}: {split}, every run and mean ± std",
                xlabel=", ".join(groups[0].labels) or None,
                reference=(reference["metric"], reference["values"], paper) if reference else None)
    return True


def attention_section(out: Path, name: str, groups: list, over: tuple[str, ...]) -> list[str]:
    """For runs with inspect.json: one attention-by-offset plot per attention kind."""
    attention = attention_curves(groups)
    if not attention:
        return []
    lines = ["", "## Attention by relative offset", "",
             "Mean attention mass per query at each offset j − i (key − query), from each run's `inspect.json` "
             "(`relpos-lab inspect`), averaged over layers, heads and the group's runs; one line per group.", ""]
    for kind, curves_of in attention.items():
        file = f"attention_{kind}.png"
        plot_mean_curves(curves_of, out / file, f"{name}: {KIND_TITLES[kind]}\none line per group: "
                         + (f"mean of its runs (over {', '.join(over)})" if over else "its run"))
        lines += [f"![{kind}]({file})", ""]
    return lines


def _number(x: float | None) -> str:
    return "" if x is None else f"{x:.6f}"
