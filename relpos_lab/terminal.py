"""What `relpos-lab` prints: the console and the screens that more than one verb shows (a run's
summary, a submitted job, a conformance report, a plugin listing, a table printed whole)."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from relpos_lab.api.errors import PROG, shown_path


def _console() -> Console:
    """Rich wraps at 80 columns when stdout is not a terminal, so `relpos-lab positions | less` cut
    every table there. Piped, take the width of the terminal the user sits at (stderr's or stdin's)
    or COLUMNS; with no terminal at all (a SLURM log), 160."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    for stream in (sys.stderr, sys.stdin):
        try:
            return Console(width=os.get_terminal_size(stream.fileno()).columns)
        except (OSError, ValueError, AttributeError):
            continue
    return Console(width=PIPED_WIDTH)


PIPED_WIDTH = 160
console = _console()


def show_report(report) -> int:
    console.rule(f"[bold]{report.subject}[/bold]")
    for line in report.lines():
        echo(line)
    echo(report.summary())
    return 0 if report.ok else 1


def show_plugins(kind, describe: Callable[[type], str]) -> None:
    """A table of every registered plugin of `kind`; one that failed to load shows its error."""
    from relpos_lab.api import registry

    entries = registry.discover(kind)
    table = Table(title=f"{kind.noun}s (entry-point group {kind.group})", title_justify="left", show_lines=True)
    for column in (kind.noun.split()[-1], "class", "distribution"):
        table.add_column(column, no_wrap=True)
    table.add_column("description", overflow="fold")
    for e in entries:
        if e.error is None:
            table.add_row(e.name, e.target, e.distribution or "", describe(e.cls))
        else:
            table.add_row(f"[red]{e.name}[/red]", e.target, e.distribution or "",
                          f"[red]failed to load: {e.error}[/red]")
    show_table(table)
    broken = sum(e.error is not None for e in entries)
    console.print(f"{len(entries) - broken} available" + (f", {broken} failed to load" if broken else ""))


def show_summary(summary, title: str) -> None:
    """One screen: where everything is, and the final metrics as a split × metric table."""
    where = [("run directory", summary.run_dir), ("results", summary.results),
             ("checkpoint", summary.checkpoint), ("resumed from", summary.resumed_from)]
    where += [("plot", p) for p in summary.plots]
    where += [("output", p) for p in summary.outputs]
    if sorted((summary.run_dir / "wandb").glob("offline-run-*/run-*.wandb")):  # not when W&B failed to start
        where.append(("W&B (offline)", f"wandb sync {shown_path(summary.run_dir / 'wandb')}/offline-run-*"))
    console.rule(f"[bold]{title}[/bold]" + ("" if summary.finished_before else f" in {summary.seconds:.0f}s"))
    for label, value in where:
        if value:  # paths stay on one line (soft wrap) so they can be copied
            line = f"{label:>14}  {shown_path(value)}"
            if label == "checkpoint":
                line += evaluated_step(summary)
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    splits: dict[str, dict[str, float]] = {}
    for key, value in summary.metrics.items():
        split, _, name = key.rpartition("/")
        splits.setdefault(split, {})[name] = value
    # One row per metric, one column per split: a metric per column truncated the names (`exact…`)
    # in an 80-column terminal, so exact_match_id could not be told from exact_match_ood.
    names = list(dict.fromkeys(n for values in splits.values() for n in values))
    metrics = Table("metric", *splits)
    metrics.columns[0].no_wrap = True
    for name in names:
        metrics.add_row(name, *(f"{values[name]:.4f}" if name in values else "" for values in splits.values()))
    console.print(metrics)
    data = {split: d["data"] for split, d in (getattr(summary, "details", None) or {}).items() if "data" in d}
    for split, text in data.items():  # what each split's numbers were measured on
        console.print(f"{split + ' data':>14}  {text}", markup=False, highlight=False, soft_wrap=True)
    if len(set(data.values())) > 1:
        console.print(f"{'':>14}  {' and '.join(data)} are different texts: compare a metric between runs on one "
                      "split, not between splits", markup=False, highlight=False, soft_wrap=True)


def show_table(table: Table) -> None:
    """Print a listing whole: names and class paths (no_wrap columns) never cut, prose wrapped.

    At a terminal rich fits the table to the screen. Piped (a file, `less`, a log) nothing may be
    cut with "…": a width too narrow for that (the piped console takes the user's terminal's) is
    widened to a log's (PIPED_WIDTH), or to the narrowest table that cuts nothing if that is wider.
    """
    width = console.width
    if not console.is_terminal:
        needed = console.measure(table, options=console.options.update_width(WIDEST)).minimum
        if needed > width:
            console.width = max(needed, PIPED_WIDTH)
    try:
        console.print(table)
    finally:
        console.width = width


WIDEST = 10_000  # the width a table is measured at: its narrowest layout that cuts nothing


def show_columns(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A listing of thousands of rows (a sweep's points) as plain aligned columns, printed whole:
    rich lays a table out cell by cell, seconds for a paper's sweep; this takes milliseconds."""
    widths = [max(map(len, column)) for column in zip(header, *rows)]

    def line(cells) -> str:
        return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()

    console.file.write("\n".join([title, line(header), line("-" * width for width in widths), *map(line, rows)])
                       + "\n")


def evaluated_step(summary) -> str:
    """What the metrics below are of: the checkpoint's step and why it was chosen."""
    step = getattr(summary, "checkpoint_step", None)
    choice = getattr(summary, "checkpoint_choice", None)
    if step is None:
        return ""
    why = {"best": "the best validated step, trainer.evaluate=best",
           "last": "the last step, trainer.evaluate=last"}.get(choice)
    return f"  (step {step}" + (f": {why})" if why else ")")


def show_submission(job, job_id: str) -> None:
    """Where a submitted job's files are, and how to follow it."""
    output, error = job.logs_of(job_id)
    console.rule(f"[bold]submitted SLURM job {job_id}[/bold] ({job.name}"
                 + (f", array {job.array})" if job.array else ")"))
    rows = [("run directory" if job.array is None else "sweep directory", job.directory), ("script", job.path),
            ("output", output), ("errors", error), ("follow", f"squeue -j {job_id}; tail -f {shown_path(output)}")]
    for label, value in rows:
        console.print(f"{label:>15}  {shown_path(value)}", markup=False, highlight=False, soft_wrap=True)


def echo(message: str) -> None:
    console.print(message, markup=False, highlight=False, soft_wrap=True)


def show_position_schemes() -> None:
    """`relpos-lab positions`: every installed scheme with its own fields, then the fields all take."""
    import dataclasses

    from relpos_lab.api import registry
    from relpos_lab.config.help import field_help
    from relpos_lab.core.positions import PositionConfig

    common = {f.name for f in dataclasses.fields(PositionConfig)}

    def describe(cls) -> str:
        helps, fields = field_help(cls.config_class), dataclasses.fields(cls.config_class)
        own = [f"  {f.name}={f.default!r}: {helps.get(f.name, '')}" for f in fields if f.name not in common]
        first = cls.describe() + ("" if getattr(cls, "supports_bidirectional", True) else
                                  " (causal only: decoder-only models without bidirectional_prefix)")
        return "\n".join([first, *own]) if own else first

    show_plugins(registry.POSITIONS, describe)
    helps = field_help(PositionConfig)
    for name in sorted(common - {"scheme"}):
        console.print(f"Every scheme also takes {name} (default {getattr(PositionConfig, name)!r}): "
                      f"{helps.get(name, '')}")


def show_configs() -> None:
    """`relpos-lab configs`: what can be named, local configs before the shipped ones."""
    from relpos_lab.config.find import catalogue, roots

    entries = catalogue()
    where = ", then ".join(f"{label} {shown_path(root)}" for label, root in roots())
    table = Table(title=f"configs ({where})", title_justify="left")
    for column in ("group", "name", "from"):
        table.add_column(column, no_wrap=True)
    table.add_column("description", overflow="fold")
    for e in entries:
        origin = f"{e.where} (hidden by the local one)" if e.shadowed else e.where
        style = "dim" if e.shadowed else None
        table.add_row(e.group, e.name, origin, e.description, style=style)
    show_table(table)
    console.print(f"{PROG} train NAME (experiment), {PROG} sweep NAME (sweep); on the command line GROUP=NAME "
                  "(e.g. model=shaw_small) lays a group's file over its section, and an overlay is a bare word "
                  "(e.g. debug)", markup=False, highlight=False)
