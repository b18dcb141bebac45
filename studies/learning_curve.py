"""When a sweep's runs fit their training lengths: validation accuracy against the step, per run.

    python studies/learning_curve.py runs/deletang2023_paper_small_curve [--threshold 0.9] [--out DIR]

reads each finished run's metrics.csv (`valid/accuracy`, the training lengths, at every
validation) and prints a Markdown table, a row per run (named by its task): the accuracy at a few
steps; its plateau, the mean of the last four validations (a validation with dropout on, as the
papers' protocol evaluates, is noisy); where it flattens, the first step from which three
validations average within 0.02 of the plateau; and whether the plateau fits (≥ the threshold).
With --out, also `learning_curve.png`: one curve per run. What the small studies' step budget is
read from (docs/study/deletang2023_paper_small.md).
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from relpos_lab.records.plots import save_figure

METRIC = "valid/accuracy"


def curve(run_dir: Path) -> list[tuple[int, float]]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return [(int(row["step"]), float(row[METRIC])) for row in csv.DictReader(file) if row.get(METRIC)]


def plateau(points: list[tuple[int, float]], last: int = 4) -> float:
    values = [v for _, v in points[-last:]]
    return sum(values) / len(values)


def flattens_at(points: list[tuple[int, float]], within: float = 0.02, window: int = 3) -> int:
    """The first step from which `window` validations average within `within` of the plateau."""
    level = plateau(points) - within
    for i in range(len(points)):
        values = [v for _, v in points[i:i + window]]
        if sum(values) / len(values) >= level:
            return points[i][0]
    return points[-1][0]


def runs(sweep_dir: Path) -> dict[str, list[tuple[int, float]]]:
    found = {}
    for results in sorted(sweep_dir.glob("*/results.json")):
        name = json.loads(results.read_text())["task"]
        found[name] = curve(results.parent)
    return found


def table(curves: dict[str, list[tuple[int, float]]], threshold: float, at: tuple[int, ...]) -> list[str]:
    lines = ["| task | " + " | ".join(f"step {s:,}" for s in at)
             + f" | plateau | flattens at | fits (≥ {threshold:g}) |",
             "|---|" + "---:|" * (len(at) + 3)]
    for name, points in sorted(curves.items(), key=lambda item: (-plateau(item[1]), item[0])):
        by_step = dict(points)
        cells = [f"{by_step[s]:.2f}" if s in by_step else "—" for s in at]
        level = plateau(points)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {level:.2f} | {flattens_at(points):,} | "
                     + ("yes" if level >= threshold else "no") + " |")
    return lines


def plot(curves: dict[str, list[tuple[int, float]]], threshold: float, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in sorted(curves.items()):
        ax.plot([s for s, _ in points], [v for _, v in points], label=name, linewidth=1.2)
    ax.axhline(threshold, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("validation accuracy (training lengths)")
    ax.legend(fontsize=6, ncol=3, loc="lower right")
    return save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--at", type=int, nargs="+", default=[1000, 2500, 5000, 7500, 10000])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    curves = runs(args.sweep_dir)
    print("\n".join(table(curves, args.threshold, tuple(args.at))))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        print(plot(curves, args.threshold, args.out / "learning_curve.png"))


if __name__ == "__main__":
    main()
