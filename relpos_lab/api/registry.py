"""Plugin discovery through entry points: tasks (``relpos_lab.tasks``) and position schemes
(``relpos_lab.positions``).

Built-in plugins and third-party ones register the same way, in their distribution's metadata:

    [project.entry-points."relpos_lab.tasks"]
    reverse = "relpos_lab_tasks.synthetic:ReverseTask"

    [project.entry-points."relpos_lab.positions"]
    shaw = "relpos_lab.core.positions.shaw:Shaw"

Nothing is registered by importing a module, so a plugin is available exactly when its
distribution is installed. Loading one plugin never imports the others; listing them all
(`relpos-lab tasks`, `relpos-lab positions`) records a plugin that fails to import together with
its error instead of failing.
"""
from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from importlib.metadata import EntryPoint, entry_points

from relpos_lab.api.errors import UserError, did_you_mean
from relpos_lab.api.task import Task, TaskConfig
from relpos_lab.core.positions import PositionConfig, PositionScheme


@dataclass(frozen=True)
class Kind:
    """One kind of plugin: its entry-point group and what a registered class must be."""

    group: str
    noun: str  # "task", "position scheme"
    verb: str  # the CLI verb that lists them
    base: type
    config_base: type


TASKS = Kind("relpos_lab.tasks", "task", "tasks", Task, TaskConfig)
POSITIONS = Kind("relpos_lab.positions", "position scheme", "positions", PositionScheme, PositionConfig)
GROUP = TASKS.group


@dataclass(frozen=True)
class Entry:
    """One registered plugin: where it comes from, and its class or why it could not be loaded."""

    name: str
    target: str  # "module:Class"
    distribution: str | None
    cls: type | None = None
    error: str | None = None


def _entry_points(kind: Kind) -> dict[str, list[EntryPoint]]:
    """Entry points by name; a name claimed by two different targets is kept as a conflict."""
    return dict(_entry_points_of(kind.group, _installed(), entry_points))


def _installed() -> tuple[tuple[str, int | None], ...]:
    """What the installed entry points depend on: the import path, and when each of its folders
    last changed (installing, upgrading or removing a distribution adds or deletes its .dist-info)."""
    stamps = []
    for folder in sys.path:
        try:
            stamps.append((folder, os.stat(folder or ".").st_mtime_ns))
        except OSError:
            stamps.append((folder, None))
    return tuple(stamps)


@functools.lru_cache(maxsize=16)
def _entry_points_of(group: str, installed: tuple, scan: Callable) -> dict[str, list[EntryPoint]]:
    """Scanning every distribution's metadata costs ~20 ms, and loading a sweep asks hundreds of
    times. `scan` (importlib's entry_points) is part of the key: a replaced one is asked anew."""
    found: dict[str, list[EntryPoint]] = {}
    for ep in scan(group=group):
        same = found.setdefault(ep.name, [])
        if all(other.value != ep.value for other in same):  # one dist seen twice on sys.path
            same.append(ep)
    return found


@functools.lru_cache(maxsize=None)
def _distribution(ep: EntryPoint) -> str | None:
    """Its distribution's name (reading the metadata costs ~1 ms, and a sweep asks for every point)."""
    return ep.dist.name if ep.dist is not None else None


def _load(kind: Kind, name: str, eps: list[EntryPoint]) -> Entry:
    ep = eps[0]
    entry = Entry(name, ep.value, _distribution(ep))
    if len(eps) > 1:
        claims = ", ".join(f"{e.value} ({_distribution(e)})" for e in eps)
        return replace(entry, error=f"{kind.noun} name '{name}' is claimed by several plugins: {claims}")
    try:
        obj = ep.load()
    except Exception as exc:  # a plugin's import error must not break the others
        return replace(entry, error=f"{type(exc).__name__}: {exc}")
    base, config_base = kind.base.__name__, kind.config_base.__name__
    if not (isinstance(obj, type) and issubclass(obj, kind.base)):
        return replace(entry, error=f"{ep.value} is not a subclass of relpos_lab.api.{base}")
    if not (isinstance(obj.config_class, type) and issubclass(obj.config_class, kind.config_base)):
        return replace(entry, error=f"{ep.value}.config_class must subclass relpos_lab.api.{config_base}")
    if kind is POSITIONS and obj.config_class.scheme != name:
        return replace(entry, error=f"{ep.value}.config_class has scheme {obj.config_class.scheme!r} by default; "
                                    f"it must be the entry-point name {name!r}")
    return replace(entry, cls=obj)


def discover(kind: Kind = TASKS) -> list[Entry]:
    """Every registered plugin of `kind`, loaded, sorted by name; failures carry their error."""
    return [_load(kind, name, eps) for name, eps in sorted(_entry_points(kind).items())]


def available(kind: Kind = TASKS) -> list[str]:
    return sorted(_entry_points(kind))


def get_class(kind: Kind, name: str) -> type:
    """The class registered as `name`; a UserError lists the available ones otherwise."""
    eps = _entry_points(kind)
    if name not in eps:
        raise UserError(unknown_message(kind, name, sorted(eps)))
    entry = _load(kind, name, eps[name])
    if entry.error is not None:
        raise UserError(f"{kind.noun} '{name}' ({entry.target}) failed to load: {entry.error}")
    return entry.cls


def unknown_message(kind: Kind, name: str, names: list[str]) -> str:
    close = did_you_mean(name, names)
    hint = f"did you mean '{close}'? " if close else ""
    listing = ", ".join(names) if names else "none installed"
    return f"unknown {kind.noun} '{name}'; {hint}available {kind.noun}s: {listing} (see `relpos-lab {kind.verb}`)"


def get_task_class(name: str) -> type[Task]:
    return get_class(TASKS, name)


def get_scheme_class(name: str) -> type[PositionScheme]:
    return get_class(POSITIONS, name)


def create_task(cfg: TaskConfig, *, seed: int) -> Task:
    """Instantiate the task named by `cfg.name` with its (already validated) config."""
    return get_task_class(cfg.name)(cfg, seed=seed)
