"""The verb table of `relpos-lab`: a verb is a function decorated with `@command(name, help,
*arguments)`, its arguments argparse `arg(...)` specs, so a new verb is one such function in the
module of its group; and the argument specs several verbs share."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


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
