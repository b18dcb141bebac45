"""Two reports of one sweep side by side: a group's number before and after a change of protocol.

    python studies/before_after.py BEFORE/summary.csv AFTER/summary.csv [--metric accuracy]

prints a Markdown table, a row per task and a column pair per scheme present in both (groups
are "<task> <scheme>", as `relpos-lab report` names them over the sweep's task and scheme axes),
then the mean over the tasks both hold; with --by-scheme, a row per scheme with that mean before
and after, best after first. Values are the reports' means over seeds.
"""
from __future__ import annotations

import argparse
import csv
from statistics import mean


def read(path: str, metric: str) -> dict[tuple[str, str], float]:
    with open(path, newline="") as file:
        return {tuple(row["group"].split(" ", 1)): float(row[f"{metric}_mean"]) for row in csv.DictReader(file)
                if row.get(f"{metric}_mean")}


def table(before: dict, after: dict) -> list[str]:
    shared = sorted(set(before) & set(after))
    schemes = sorted({scheme for _, scheme in shared})
    tasks = sorted({task for task, _ in shared})
    lines = ["| task | " + " | ".join(f"{s} before | {s} after" for s in schemes) + " |",
             "|---|" + "---:|" * (2 * len(schemes))]
    for task in tasks:
        cells = [f"{before[(task, s)]:.3f} | {after[(task, s)]:.3f}" if (task, s) in before and (task, s) in after
                 else "— | —" for s in schemes]
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    means = []
    for s in schemes:
        held = [t for t in tasks if (t, s) in before and (t, s) in after]
        means.append(f"{mean(before[(t, s)] for t in held):.3f} | {mean(after[(t, s)] for t in held):.3f}")
    lines.append("| mean over tasks | " + " | ".join(means) + " |")
    return lines


def by_scheme(before: dict, after: dict) -> list[str]:
    """A row per scheme: its mean over the tasks both reports hold, before and after, best after first."""
    shared = set(before) & set(after)
    rows = []
    for scheme in sorted({s for _, s in shared}):
        held = [t for t, s in shared if s == scheme]
        old, new = mean(before[(t, scheme)] for t in held), mean(after[(t, scheme)] for t in held)
        rows.append((new, f"| {scheme} | {old:.3f} | {new:.3f} | {new - old:+.3f} | {len(held)} |"))
    header = ["| scheme | before | after | change | tasks |", "|---|---:|---:|---:|---:|"]
    return header + [line for _, line in sorted(rows, key=lambda row: -row[0])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--metric", default="accuracy_ood", help="a summary.csv metric (default: accuracy_ood)")
    parser.add_argument("--by-scheme", action="store_true", help="a row per scheme (its mean over tasks) instead")
    args = parser.parse_args()
    before, after = read(args.before, args.metric), read(args.after, args.metric)
    print("\n".join(by_scheme(before, after) if args.by_scheme else table(before, after)))


if __name__ == "__main__":
    main()
