"""The `relpos-lab` command (also `python -m relpos_lab`): one function per verb.

A verb is a function decorated with `@command(name, help, *arguments)`; its arguments are argparse
`arg(...)` specs, so a new verb is one such function. Verbs import the heavy machinery (Lightning)
inside the function, so `--help` and input errors answer quickly. What they print is in
terminal.py.

Bad input raises `UserError`: the command prints one line to stderr and exits with status 2, no
traceback; a plugin that breaks its contract (`ContractError`) gets one line and status 1. Either is
found behind whatever Lightning raised around it, and `-v` adds the traceback. Anything else is a
bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relpos_lab.api.errors import PROG, UserError, own_error, shown_path
from relpos_lab.terminal import (
    console,
    echo,
    show_columns,
    show_configs,
    show_plugins,
    show_position_schemes,
    show_report,
    show_submission,
    show_summary,
    show_table,
)
from relpos_lab.training.threads import quiet_openmp


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    arguments: tuple[tuple[tuple[str, ...], dict[str, Any]], ...]
    run: Callable[[argparse.Namespace], int | None]


COMMANDS: dict[str, Command] = {}


def arg(*names: str, **kwargs: Any) -> tuple[tuple[str, ...], dict[str, Any]]:
    """An argparse argument spec: the same parameters as `ArgumentParser.add_argument`."""
    return names, kwargs


def command(name: str, help: str, *arguments: tuple) -> Callable:
    """Register the decorated function as verb `name`; it returns an exit status (None = 0)."""

    def register(fn: Callable[[argparse.Namespace], int | None]) -> Callable:
        COMMANDS[name] = Command(name, help, arguments, fn)
        return fn

    return register


OVERRIDES = arg("overrides", nargs="*", metavar="key=value|GROUP=NAME|OVERLAY",
                help="config overrides, applied in order: key=value in OmegaConf dot-list syntax (optim.lr=3e-4 "
                     "task.test_lengths=[1,64]); GROUP=NAME lays configs/GROUP/NAME.yaml over its section "
                     "(model=shaw_small trainer=gpu cluster=mysite task=translation_gettext); a bare word is an "
                     "overlay of configs/overlay/, e.g. debug: a tiny model for a few steps. Names are looked up "
                     "in ./configs first, then among the shipped configs (relpos-lab configs lists them)")
VERBOSE = arg("-v", "--verbose", action="store_true",
              help="also show Lightning's and W&B's own messages (accelerators found, tips, the W&B banner, the "
                   "model summary table); by default the console holds the run's own lines")
EXPERIMENT = "experiment YAML file, or the name of one (./configs/experiment/, then shipped; relpos-lab configs)"


# --- verbs ----------------------------------------------------------------------------------


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


@command("translate", "translate lines of text (stdin or a file) with a trained checkpoint",
         arg("checkpoint", help="a .ckpt file written by `relpos-lab train`"),
         arg("--input", default=None, help="file with one sentence per line (default: stdin)"),
         arg("--output", default=None, help="file for the translations (default: stdout)"),
         arg("--beam", type=int, default=None, help="beam size (default: the checkpoint's task.decoding)"),
         arg("--lenpen", type=float, default=None, help="length penalty α of beam search (default: the checkpoint's)"),
         arg("--max-tokens", type=int, default=4096, help="padded source tokens per batch (default: 4096)"),
         arg("--device", default=None, help="torch device (default: cuda if available, else cpu)"),
         OVERRIDES)
def translate(args: argparse.Namespace) -> None:
    import torch

    from relpos_lab.training.inference import load_model, translate as run
    from relpos_lab.training.threads import use_cpu_threads

    overrides = list(args.overrides)
    if args.beam is not None:
        overrides.append(f"task.decoding.beam_size={args.beam}")
    if args.lenpen is not None:
        overrides.append(f"task.decoding.length_penalty={args.lenpen}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    use_cpu_threads()
    model, _, task = load_model(args.checkpoint, overrides, device=device)
    if args.input is None:
        lines = sys.stdin.read().splitlines()
    else:
        try:
            lines = Path(args.input).read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise UserError(f"cannot read --input {args.input}: {err.strerror}") from None
    warn = lambda message: print(f"{PROG}: warning: {message}", file=sys.stderr)  # noqa: E731
    text = "".join(f"{line}\n" for line in run(task, model, lines, max_tokens=args.max_tokens, warn=warn))
    if args.output is None:
        sys.stdout.write(text)
    else:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as err:
            raise UserError(f"cannot write --output {args.output}: {err.strerror}") from None


@command("generate", "continue a prompt with a language-model checkpoint (task lm), sampling on the KV cache",
         arg("checkpoint", help="a .ckpt file of a language model written by `relpos-lab train`"),
         arg("--prompt", default="", help="text to continue (default: none, the start of a line)"),
         arg("--temperature", type=float, default=1.0, help="softmax temperature; 0: greedy (default: 1.0)"),
         arg("--top-k", type=int, default=0, help="sample among the k most likely tokens; 0: all (default)"),
         arg("--max-new-tokens", type=int, default=100, help="tokens to generate (default: 100)"),
         arg("--seed", type=int, default=0, help="random seed of the sampling (default: 0)"),
         arg("--device", default=None, help="torch device (default: cuda if available, else cpu)"),
         OVERRIDES)
def generate(args: argparse.Namespace) -> None:
    import torch

    from relpos_lab.training.inference import generate as run, load_model
    from relpos_lab.training.threads import use_cpu_threads

    use_cpu_threads()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, _, task = load_model(args.checkpoint, list(args.overrides), device=device)
    text = run(task, model, args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
               top_k=args.top_k, seed=args.seed)
    sys.stdout.write(f"{args.prompt}{text}\n")


@command("tasks", "list installed tasks (built-in and plugins), with any that failed to load")
def tasks(args: argparse.Namespace) -> None:
    from relpos_lab.api import registry

    show_plugins(registry.TASKS, lambda cls: cls.describe())


@command("positions", "list installed position schemes (built-in and plugins) with their fields, and any that "
         "failed to load; select one with model.positions.scheme=NAME")
def positions(args: argparse.Namespace) -> None:
    show_position_schemes()


@command("check-scheme", "the conformance kit on a position scheme (yours or built in): shapes, gradients, "
         "cached decoding == full pass in both model families (padded batches, a beam-search reorder, "
         "bidirectional_prefix=true), training steps, its drawing",
         arg("name", help="the scheme's entry-point name (relpos-lab positions)"),
         arg("fields", nargs="*", metavar="FIELD=VALUE", help="fields of its config, e.g. max_distance=4"))
def check_scheme(args: argparse.Namespace) -> int:
    from relpos_lab.api.testing import check_scheme as run_checks
    from relpos_lab.config.load import parse_fields

    return show_report(run_checks(args.name, **parse_fields(args.fields)))


@command("check-task", "the conformance kit on a task (yours or built in): its splits, each verb of the Task "
         "contract once, a few optimizer steps and an evaluation in both model families",
         arg("name", help="the task's entry-point name (relpos-lab tasks)"),
         arg("fields", nargs="*", metavar="FIELD=VALUE", help="fields of its config, e.g. train_size=200"))
def check_task(args: argparse.Namespace) -> int:
    from relpos_lab.api.testing import check_task as run_checks
    from relpos_lab.config.load import parse_fields

    return show_report(run_checks(args.name, **parse_fields(args.fields)))


@command("configs", "list the configs that can be named: experiments, sweeps, and the pieces of each group "
         "(model=NAME, trainer=NAME, ...), from ./configs and shipped with the package")
def configs(args: argparse.Namespace) -> None:
    show_configs()


@command("config", "print the resolved config (defaults, extends, overrides) as YAML, or what the keys of a "
         "section mean (--help-keys)",
         arg("config", nargs="?", help=EXPERIMENT), OVERRIDES,
         arg("--help-keys", metavar="SECTION", default=None,
             help="list the keys of a section (model, model.positions, trainer, task, ...; '' for the top level) "
                  "with their types, defaults and help, instead of printing a config"),
         arg("--task", default=None, help="with --help-keys task: the task (default: the config's task)"))
def show_config(args: argparse.Namespace) -> None:
    from relpos_lab.config import load_config, to_yaml

    if args.help_keys is not None:
        if args.config and "=" in args.config and not Path(args.config).exists():  # `--help-keys S key=value`
            args.config, args.overrides = None, [args.config, *args.overrides]
        print(keys_help(args.help_keys, args.config, args.overrides, args.task))
        return
    if not args.config:
        raise UserError("config: give an experiment (a YAML file or a name), or --help-keys SECTION")
    from relpos_lab.records.rundir import run_directory

    cfg = load_config(args.config, args.overrides)
    sys.stdout.write(f"# run directory: {run_directory(cfg)}\n{to_yaml(cfg)}")


def keys_help(section: str, config: str | None, overrides: list[str], task: str | None = None) -> str:
    """`relpos-lab config --help-keys SECTION`: what each key of the section means. A task section
    is the named task's (`task`, else the config's); `model.positions` is the scheme the command
    line chooses, else the config's, else the default."""
    from relpos_lab.config import load_config
    from relpos_lab.config.help import describe_keys, section_class

    scheme = None
    if task is None and config and section.startswith("task"):
        task = load_config(config, overrides).task.name
    if section == "model.positions":
        chosen = [o.split("=", 1)[1] for o in overrides if o.startswith("model.positions.scheme=")]
        scheme = chosen[-1] if chosen else (load_config(config, overrides).model.positions.scheme if config else None)
    return "\n".join(describe_keys(section_class(section, task, scheme), section))


@command("sweep", "run a grid of experiments from a sweep file, skipping finished points",
         arg("sweep_file", help="sweep YAML file, or the name of one (./configs/sweep/, then shipped)"),
         arg("--max-parallel", type=int, default=1, help="points trained at once (local runs)"),
         arg("--point", type=int, default=None, help="train only grid point N, in this process "
             "(what local workers and SLURM array tasks run)"),
         arg("--list", action="store_true", help="print the grid and each point's status, run nothing"),
         arg("--step-times", default=None, metavar="BENCH_JSON", help="with --list: the sweep's device-hours, eager "
             "and compiled, from the step times a `bench model --json` file measured"),
         arg("--slurm", action="store_true", help="submit the unfinished points as one SLURM job array"),
         arg("--dry-run", action="store_true", help="with --slurm: print the sbatch script, submit nothing"),
         arg("--reuse", action="store_true", help="link points whose experiment already finished in another "
             "sweep under the same logging root instead of training them again"),
         OVERRIDES)
def sweep(args: argparse.Namespace) -> int:
    from relpos_lab.launch.sweep import link_identical_runs, load_sweep, run_locally

    if args.step_times and not args.list:
        raise UserError("--step-times goes with --list (it prices the grid it lists)")
    if args.dry_run and not args.slurm:  # a user who asks for a dry run must never get a real one
        raise UserError("--dry-run goes with --slurm (it prints the sbatch script); to see the grid without "
                        "running it, use --list")
    one_point = args.point is not None and not (args.reuse or args.slurm)
    grid = load_sweep(args.sweep_file, args.overrides, only=args.point if one_point else None)
    if args.reuse:
        link_identical_runs(grid, echo=echo)
    if args.slurm:
        return submit_sweep(grid, args.dry_run)
    if args.point is not None:
        return train_sweep_point(grid, args.point)
    manifest = grid.write_manifest()
    if args.list:
        return list_sweep(grid, manifest, args.step_times)
    failed = run_locally(grid, args.max_parallel, echo=echo)
    console.print(f"sweep {grid.name}: {len(grid.points) - len(failed)}/{len(grid.points)} points finished; "
                  f"report with: {PROG} report {shown_path(grid.directory)}")
    return 1 if failed else 0


def train_sweep_point(grid, index: int) -> int:
    """`sweep --point I`: that point alone, in this process (what each task of a job array runs)."""
    from relpos_lab.config import load_config
    from relpos_lab.launch.sweep import is_dangling, is_finished
    from relpos_lab.training import experiment

    if not 0 <= index < len(grid.points):
        raise UserError(f"--point {index} is outside the grid of {grid.path} (0..{len(grid.points) - 1})")
    point = grid.points[index]
    if is_dangling(point):
        raise UserError(f"{grid.name} point {index}: its run directory {point.run_dir} links to a run that is "
                        "gone; rerun with --reuse (it removes the link) or delete the link")
    if is_finished(point):  # e.g. a requeued array task, or a point linked by --reuse
        echo(f"{grid.name} point {index} {point.shown} is finished ({shown_path(Path(point.run_dir))}): "
             "nothing to train")
        return 0
    summary = experiment.train(load_config(grid.experiment, [*grid.overrides_of(index), "resume=true"]), echo=echo,
                               started=process_started())
    if summary.metrics:
        show_summary(summary, f"{grid.name} point {index} {point.shown}")
    return 0


def list_sweep(grid, manifest, step_times: str | None = None) -> int:
    """`sweep --list`: the grid and each point's status; nothing runs. With step times, its cost."""
    from relpos_lab.launch.sweep import is_finished

    show_columns(f"sweep {grid.name} ({manifest})", [*grid.axes, "point", "status", "run directory"],
                 [[*p.labels.values(), str(p.index), "finished" if is_finished(p) else "to run",
                   shown_path(Path(p.run_dir))] for p in grid.points])
    if step_times is not None:
        from relpos_lab.analysis.estimate import StepTimes, estimate

        times = StepTimes.read(step_times)
        for line in estimate([grid.config(p.index) for p in grid.points], times).lines():
            console.print(line)
    return 0


@command("submit", "submit an experiment to SLURM: trainer.num_nodes nodes, trainer.devices processes each",
         arg("config", help=EXPERIMENT),
         arg("--dry-run", action="store_true", help="print the sbatch script, submit nothing"),
         arg("--extend", action="store_true", help="train longer in place (= extend=true; see train --extend): the "
             "job continues the run of this experiment with another budget"),
         OVERRIDES)
def submit(args: argparse.Namespace) -> None:
    from relpos_lab.launch import slurm

    overrides = [*args.overrides, *(["extend=true"] if args.extend else [])]
    if args.dry_run:  # asks no cluster: the script is for one that may not be this machine's
        job, _ = slurm.run_job(args.config, overrides)
        sys.stdout.write(job.script)
        return
    show_submission(*slurm.submit_run(args.config, overrides, echo=echo))


def submit_sweep(grid, dry_run: bool) -> int:
    """`sweep --slurm`: the grid's unfinished points as one job array (see slurm.py)."""
    from relpos_lab.launch import slurm

    if dry_run:
        job = slurm.sweep_job(grid)
        if job is not None:
            sys.stdout.write(job.script)
    else:
        job, job_id = slurm.submit_sweep(grid)
        if job is not None:
            show_submission(job, job_id)
    if job is None:
        console.print(f"sweep {grid.name}: every point is finished; nothing to submit")
    return 0


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


# --- presentation ---------------------------------------------------------------------------


# --- entry point ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Experiments with position schemes in Transformers.")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    for cmd in COMMANDS.values():
        sub = verbs.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        for names, kwargs in cmd.arguments:
            sub.add_argument(*names, **kwargs)
        sub.set_defaults(command=cmd)
    return parser


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


def run() -> int:
    """The `relpos-lab` program (console script and `python -m relpos_lab`).

    wandb tells child processes where its service runs (WANDB_SERVICE), and a child that finds
    the variable logs through the parent's service instead of starting its own. A relpos-lab
    command started from a process with a W&B run (a notebook, a sweep driver, a test session)
    would then lose W&B when that service is gone, and its offline files would be written after
    it exits rather than before. The program starts its own service; wandb shuts it down, with
    every file complete, before the process ends.
    """
    os.environ.pop("WANDB_SERVICE", None)  # wandb.env.SERVICE, without importing wandb here
    show_deprecations()
    quiet_openmp()  # before anything imports torch
    return main()


def show_deprecations() -> None:
    """Show relpos_lab's own DeprecationWarnings (a moved import path) wherever they are raised:
    Python shows them only in __main__, and a plugin module never is. -W / PYTHONWARNINGS still decide."""
    if not sys.warnoptions:
        warnings.filterwarnings("default", r"relpos_lab\.[\w.]+ is deprecated", DeprecationWarning)


def _is_override(word: str) -> bool:
    """key=value (or GROUP=NAME), or the name of an overlay (configs/overlay/)."""
    if word.startswith("-"):
        return False
    if "=" in word:
        return True
    from relpos_lab.config.find import find_in_group, is_name
    from relpos_lab.config.load import OVERLAY

    return is_name(word) and find_in_group(OVERLAY, word) is not None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # argparse stops filling a trailing `overrides` list at the first option (`eval X --split
    # test a=1`, `sweep S --max-parallel 2 debug`): collect such key=value words and overlay names
    # here; anything else is a real error.
    if extra and hasattr(args, "overrides") and all(_is_override(e) for e in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.command.run(args) or 0
    except Exception as err:
        own = own_error(err)
        if own is None:
            raise
        if getattr(args, "verbose", False):
            traceback.print_exception(err)
        print(f"{PROG}: error: {own}", file=sys.stderr)
        return 2 if isinstance(own, UserError) else 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
