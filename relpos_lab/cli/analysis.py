"""`relpos-lab report`, `tables` and `bench`: a sweep's runs aggregated, kept in docs, speed measured."""
from __future__ import annotations

import argparse
from pathlib import Path

from relpos_lab.api.errors import PROG, shown_path
from relpos_lab.cli.verbs import arg, command
from relpos_lab.terminal import console, show_table


@command("report", "aggregate a sweep's runs: tables (Markdown, CSV) and plots, mean ± std over seeds",
         arg("sweep_dir", help="directory a sweep ran in (runs/<sweep name>)"),
         arg("--out", default=None, help="output directory (default: <sweep_dir>/report)"),
         arg("--split", default=None, help="split to report (default: the one the sweep's published "
             "numbers compare with, else test)"),
         arg("--metric", nargs="+", default=None, help="metrics to tabulate and plot (default: every metric "
             "of the split but the loss, e.g. bleu chrf for translation; ppl where it is the main metric, as for lm)"),
         arg("--over", nargs="+", default=None, help="axes averaged over (default: seed; none when the sweep "
             "has no seed axis, so each grid point is its own group)"),
         arg("--aggregate", choices=("mean", "max"), default="mean", help="a group's number: mean ± std of its "
             "runs, or max: its best run per metric (lowest loss/ppl), the best-of over seeds and learning rates "
             "that Deletang et al. and Ruoss et al. report (e.g. --over seed lr --aggregate max)"),
         arg("--wandb", action="store_true", help="also log the leaderboard, one length chart per task and the "
             "report's files to a W&B run in the sweep's group (offline without an API key: wandb sync it)"),
         arg("--fit-threshold", type=float, default=0.9, help="an accuracy leaderboard marks a cell whose "
             "in-distribution score is below this 'did not fit' (default: 0.9)"))
def report(args: argparse.Namespace) -> None:
    from relpos_lab.analysis.report import write_report

    path = write_report(args.sweep_dir, args.out, args.split, tuple(args.metric or ()),
                        tuple(args.over) if args.over else None, args.aggregate, wandb=args.wandb,
                        fit_threshold=args.fit_threshold)
    console.print(f"report: {shown_path(path)}")
    if args.wandb:
        from relpos_lab.records.wandb_run import sync_command

        console.print(f"W&B: the report's run is in {shown_path(path.parent / 'wandb')} "
                      f"(offline: {sync_command(path.parent)})", markup=False, highlight=False)
    console.print(path.read_text().split("\n## ")[0], markup=False, highlight=False)


@command("tables", "copy reports' summary tables into a Markdown file, at its <!-- report: DIR --> markers",
         arg("doc", help="the Markdown file; DIR in its markers is relative to it"),
         arg("--check", action="store_true", help="change nothing; exit 1 if a table is out of date"))
def tables(args: argparse.Namespace) -> int:
    from relpos_lab.analysis.doc_tables import refresh_tables

    text, blocks = refresh_tables(args.doc)
    if Path(args.doc).read_text() == text:
        console.print(f"{shown_path(Path(args.doc))}: {blocks} tables, all current")
        return 0
    if args.check:
        console.print(f"{shown_path(Path(args.doc))}: tables out of date; run {PROG} tables {args.doc}")
        return 1
    Path(args.doc).write_text(text)
    console.print(f"{shown_path(Path(args.doc))}: {blocks} tables refreshed")
    return 0


@command("bench", "speed and memory of attention, a layer, a model or decoding, measured side by side "
         "(`relpos-lab bench attention --help`)",
         arg("bench_args", nargs=argparse.REMAINDER, metavar="attention|layer|model|decode|kernel|sweep [options]"))
def bench(args: argparse.Namespace) -> None:
    from relpos_lab.analysis import bench as benchmarks

    benchmarks.main(args.bench_args, show_table)
