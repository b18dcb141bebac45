"""`relpos-lab configs` and `config`: the configs that can be named, one resolved, what its keys mean."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from relpos_lab.api.errors import UserError
from relpos_lab.cli.verbs import EXPERIMENT, OVERRIDES, arg, command
from relpos_lab.terminal import show_configs


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
