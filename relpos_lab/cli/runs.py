"""`relpos-lab train`, `eval` and `inspect`: one run trained, a checkpoint evaluated or inspected."""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from relpos_lab.api.errors import UserError, shown_path
from relpos_lab.cli.verbs import EXPERIMENT, OVERRIDES, VERBOSE, arg, command
from relpos_lab.terminal import echo, show_summary

_IMPORTED = time.time()


def process_started() -> float:
    """When this process started, on time.time()'s clock: interpreter start and imports included
    (a run's `wall_seconds` count from it, as a sweep's wait for the point's process does). Read from
    /proc on Linux; elsewhere, or where /proc's clocks disagree (a container's own uptime), when
    this module was imported."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            ticks = int(stat.read().rpartition(")")[2].split()[19])  # starttime: clock ticks after boot
            since = float(uptime.read().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED
    started = time.time() - since
    return started if _IMPORTED - 300 <= started <= _IMPORTED + 0.1 else _IMPORTED

@command("train", "train a model from an experiment config; run again, it reports a finished run and resumes "
         "an interrupted one from its newest checkpoint", arg("config", help=EXPERIMENT), OVERRIDES,
         arg("--force", action="store_true", help="start the run over: its directory, if it holds an earlier "
             "attempt (finished or not), is moved aside to <run dir>.old-<time>, never deleted"),
         arg("--extend", action="store_true", help="train longer in place (= extend=true): a run of this experiment "
             "that differs only in its budget (trainer.max_steps, val_every_n_steps, stop_at) continues in its own "
             "directory from its newest checkpoint, with one metrics.csv, W&B run and results.json"),
         VERBOSE)
def train(args: argparse.Namespace) -> None:
    from relpos_lab.config import load_config
    from relpos_lab.training import experiment
    from relpos_lab.training.planning import check_own_run_directory
    from relpos_lab.training.progress import quiet

    quiet(args.verbose)
    if args.extend and args.force:
        raise UserError("--extend continues a run and --force starts one over: give one of them")
    cfg = load_config(args.config, [*args.overrides, *(["extend=true"] if args.extend else [])])
    check_own_run_directory(Path(args.config), cfg)
    summary = experiment.train(cfg, echo=echo, force=args.force, started=process_started())
    if summary.metrics:  # rank 0 of a distributed run
        show_summary(summary, f"{cfg.name}: " + ("finished earlier" if summary.finished_before else "trained"))


@command("eval", "evaluate a checkpoint on a split (the same evaluation as validation)",
         arg("checkpoint", help="a .ckpt file written by `relpos-lab train`"),
         arg("--split", default="test", help="split to evaluate (default: test)"),
         arg("--output", default=None, help="directory for results.json and plots "
             "(default: <run dir>/eval/<checkpoint>-<split>[-<hash of the overrides>])"),
         VERBOSE, OVERRIDES)
def evaluate(args: argparse.Namespace) -> None:
    from relpos_lab.training import experiment
    from relpos_lab.training.progress import quiet

    quiet(args.verbose)
    summary = experiment.evaluate(args.checkpoint, args.split, args.overrides, args.output)
    show_summary(summary, f"{Path(args.checkpoint).name} on {args.split}")


@command("inspect", "attention by relative offset and what the position scheme learned: PNGs in "
         "<run>/plots/inspect/, numbers in <run>/inspect.json, images and a table in the run's W&B run",
         arg("checkpoint", help="a .ckpt file written by `relpos-lab train`"),
         arg("--split", default="valid", help="split whose examples are measured (default: valid)"),
         arg("--lengths", type=int, nargs="+", default=None, help="input lengths measured on their own, side by "
             "side (default: the task's inspect lengths, e.g. lm's evaluation lengths, else the longest training "
             "length and the longest test length)"),
         arg("--out", default=None, help="directory for inspect.json and plots/inspect/ instead of the run "
             "directory (nothing is then logged to W&B)"),
         VERBOSE, OVERRIDES)
def inspect(args: argparse.Namespace) -> None:
    from relpos_lab.training.inspect import inspect_checkpoint
    from relpos_lab.training.progress import quiet

    quiet(args.verbose)
    summary = inspect_checkpoint(args.checkpoint, args.split, args.lengths, args.out, args.overrides)
    if summary.note:
        echo(summary.note)
    echo(f"inspect: {len(summary.plots)} figures in {shown_path(summary.out_dir / 'plots' / 'inspect')}, "
          f"numbers in {shown_path(summary.json)}")
