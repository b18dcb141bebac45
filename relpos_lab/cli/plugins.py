"""`relpos-lab tasks`, `positions`, `check-scheme` and `check-task`: the installed plugins, and the
conformance kit on one."""
from __future__ import annotations

import argparse

from relpos_lab.cli.verbs import arg, command
from relpos_lab.terminal import show_plugins, show_position_schemes, show_report


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
