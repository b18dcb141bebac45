"""The `relpos-lab` command (also `python -m relpos_lab`): one function per verb, one module per
group of verbs.

A verb is a function decorated with `@command(name, help, *arguments)` (verbs.py); its arguments
are argparse `arg(...)` specs, so a new verb is one such function in its group's module: runs.py
(train, eval, inspect), text.py (translate, generate), plugins.py (tasks, positions, check-scheme,
check-task), configs.py (configs, config), launch.py (sweep, submit), analysis.py (report, tables,
bench). Verbs import the heavy machinery (Lightning) inside the function, so `--help` and input
errors answer quickly. What they print is in terminal.py.

Bad input raises `UserError`: the command prints one line to stderr and exits with status 2, no
traceback; a plugin that breaks its contract (`ContractError`) gets one line and status 1. Either is
found behind whatever Lightning raised around it, and `-v` adds the traceback. Anything else is a
bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
import warnings

from relpos_lab.api.errors import PROG, UserError, own_error
from relpos_lab.cli import analysis, configs, launch, plugins, runs, text
from relpos_lab.cli.verbs import COMMANDS, Command
from relpos_lab.training.threads import quiet_openmp

GROUPS = (runs, text, plugins, configs, launch, analysis)
"""The modules of the verbs, in the order `--help` lists them (each module's verbs in its own order)."""


def in_order() -> list[Command]:
    """Every verb, group by group in GROUPS' order."""
    order = [group.__name__ for group in GROUPS]
    return sorted(COMMANDS.values(), key=lambda cmd: order.index(cmd.run.__module__))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description="Experiments with position schemes in Transformers.")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="COMMAND")
    for cmd in in_order():
        sub = verbs.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        for names, kwargs in cmd.arguments:
            sub.add_argument(*names, **kwargs)
        sub.set_defaults(command=cmd)
    return parser


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
