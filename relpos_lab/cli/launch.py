"""`relpos-lab sweep` and `submit`: many runs, locally or on SLURM."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relpos_lab.api.errors import PROG, UserError, shown_path
from relpos_lab.cli.runs import process_started
from relpos_lab.cli.verbs import EXPERIMENT, OVERRIDES, arg, command
from relpos_lab.terminal import console, echo, show_columns, show_submission, show_summary


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
         arg("--stack", type=int, default=0, metavar="K", help="train points that differ only in seeds, optim "
             "and clipping as one stacked model, K at a time (with --slurm: a stack to an array task, cluster.stack; "
             "with --list: how they stack, priced with --step-times; docs/sweeps.md)"),
         OVERRIDES)
def sweep(args: argparse.Namespace) -> int:
    from relpos_lab.launch.sweep import link_identical_runs, load_sweep, run_locally

    if args.step_times and not args.list:
        raise UserError("--step-times goes with --list (it prices the grid it lists)")
    if args.dry_run and not args.slurm:  # a user who asks for a dry run must never get a real one
        raise UserError("--dry-run goes with --slurm (it prints the sbatch script); to see the grid without "
                        "running it, use --list")
    if args.stack and args.point is not None:
        raise UserError("--stack groups the points a sweep trains; --point trains one")
    one_point = args.point is not None and not (args.reuse or args.slurm)
    overrides = [*args.overrides, *([f"cluster.stack={args.stack}"] if args.slurm and args.stack else [])]
    grid = load_sweep(args.sweep_file, overrides, only=args.point if one_point else None)
    if args.reuse:
        link_identical_runs(grid, echo=echo)
    if args.slurm:
        return submit_sweep(grid, args.dry_run)
    if args.point is not None:
        return train_sweep_point(grid, args.point)
    manifest = grid.write_manifest()
    if args.list:
        return list_sweep(grid, manifest, args.step_times, args.stack)
    failed = run_locally(grid, args.max_parallel, echo=echo, stack=args.stack)
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


def list_sweep(grid, manifest, step_times: str | None = None, stack: int = 0) -> int:
    """`sweep --list`: the grid and each point's status; nothing runs. With step times, its cost;
    with --stack, how it would stack (and that cost)."""
    from relpos_lab.launch.sweep import is_finished, stack_groups

    show_columns(f"sweep {grid.name} ({manifest})", [*grid.axes, "point", "status", "run directory"],
                 [[*p.labels.values(), str(p.index), "finished" if is_finished(p) else "to run",
                   shown_path(Path(p.run_dir))] for p in grid.points])
    groups = None
    if stack > 1:
        console.print(f"with --stack {stack}:")
        groups = [[p.index for p in group] for group in stack_groups(grid, grid.points, stack, console.print)]
        if step_times is None:
            console.print(f"price it with --step-times, from `{PROG} bench model --stack {stack} --json FILE` at the "
                          "sweep's shape on its device (aten ops per run-step and step times, alone and stacked)")
    if step_times is not None:
        from relpos_lab.analysis.estimate import StepTimes, estimate

        times = StepTimes.read(step_times)
        for line in estimate([grid.config(p.index) for p in grid.points], times, groups).lines():
            console.print(line)
    return 0


@command("stack", "train the configs linked in a directory as one stacked model (what an array task of `sweep "
         "--slurm --stack K` runs; one config: trained alone)",
         arg("directory", help="a directory of links to run directories, each with its config.yaml (<sweep dir>/slurm/"
             "array-<time>/<task>)"))
def stack(args: argparse.Namespace) -> int:
    from relpos_lab.config import load_config
    from relpos_lab.training import experiment
    from relpos_lab.training.stacked import MemberFailed, train_stacked

    links = sorted(Path(args.directory).iterdir(), key=lambda link: int(link.name) if link.name.isdigit() else -1)
    configs = [link / "config.yaml" for link in links if (link / "config.yaml").is_file()]
    if not configs:
        raise UserError(f"{args.directory}: no run directory with a config.yaml in it; a stacked array task "
                        "trains the links `sweep --slurm --stack K` wrote into <sweep dir>/slurm/array-<time>/<task>")
    cfgs = [load_config(path, ["resume=true"]) for path in configs]
    if len(cfgs) == 1:
        experiment.train(cfgs[0], echo=echo, started=process_started())
        return 0
    outcomes = train_stacked(cfgs, echo=echo)
    return 1 if any(isinstance(o, MemberFailed) for o in outcomes) else 0


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
        job = slurm.sweep_job(grid, echo=lambda line: print(line, file=sys.stderr))  # stdout: the script alone
        if job is not None:
            sys.stdout.write(job.script)
    else:
        job, job_id = slurm.submit_sweep(grid, echo=echo)
        if job is not None:
            show_submission(job, job_id)
    if job is None:
        console.print(f"sweep {grid.name}: every point is finished; nothing to submit")
    return 0
