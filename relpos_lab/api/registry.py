"""Task discovery through the ``relpos_lab.tasks`` entry-point group.

Built-in tasks and third-party plugins register the same way, in their distribution's metadata:

    [project.entry-points."relpos_lab.tasks"]
    reverse = "relpos_lab_tasks.synthetic:ReverseTask"

Nothing is registered by importing a module, so a task is available exactly when its distribution
is installed. Loading one plugin never imports the others; listing them all (`relpos-lab tasks`)
records a plugin that fails to import together with its error instead of failing.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from importlib.metadata import EntryPoint, entry_points

from relpos_lab.api.errors import UserError, did_you_mean
from relpos_lab.api.task import Task, TaskConfig

GROUP = "relpos_lab.tasks"


@dataclass(frozen=True)
class TaskEntry:
    """One registered task: where it comes from, and its class or why it could not be loaded."""

    name: str
    target: str  # "module:Class"
    distribution: str | None
    task_class: type[Task] | None = None
    error: str | None = None


def _entry_points() -> dict[str, list[EntryPoint]]:
    """Entry points by name; a name claimed by two different targets is kept as a conflict."""
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=GROUP):
        same = found.setdefault(ep.name, [])
        if all(other.value != ep.value for other in same):  # one dist seen twice on sys.path
            same.append(ep)
    return found


def _distribution(ep: EntryPoint) -> str | None:
    return ep.dist.name if ep.dist is not None else None


def _load(name: str, eps: list[EntryPoint]) -> TaskEntry:
    ep = eps[0]
    entry = TaskEntry(name, ep.value, _distribution(ep))
    if len(eps) > 1:
        claims = ", ".join(f"{e.value} ({_distribution(e)})" for e in eps)
        return replace(entry, error=f"task name '{name}' is claimed by several plugins: {claims}")
    try:
        obj = ep.load()
    except Exception as exc:  # a plugin's import error must not break the others
        return replace(entry, error=f"{type(exc).__name__}: {exc}")
    if not (isinstance(obj, type) and issubclass(obj, Task)):
        return replace(entry, error=f"{ep.value} is not a subclass of relpos_lab.api.Task")
    if not (isinstance(obj.config_class, type) and issubclass(obj.config_class, TaskConfig)):
        return replace(entry, error=f"{ep.value}.config_class must subclass relpos_lab.api.TaskConfig")
    return replace(entry, task_class=obj)


def discover() -> list[TaskEntry]:
    """Every registered task, loaded, sorted by name; failures carry their error."""
    return [_load(name, eps) for name, eps in sorted(_entry_points().items())]


def available() -> list[str]:
    return sorted(_entry_points())


def get_task_class(name: str) -> type[Task]:
    """The class registered as `name`; a UserError lists the available tasks otherwise."""
    eps = _entry_points()
    if name not in eps:
        raise UserError(unknown_task_message(name, sorted(eps)))
    entry = _load(name, eps[name])
    if entry.error is not None:
        raise UserError(f"task '{name}' ({entry.target}) failed to load: {entry.error}")
    return entry.task_class


def unknown_task_message(name: str, names: list[str]) -> str:
    close = did_you_mean(name, names)
    hint = f"did you mean '{close}'? " if close else ""
    listing = ", ".join(names) if names else "none installed"
    return f"unknown task '{name}'; {hint}available tasks: {listing} (see `relpos-lab tasks`)"


def create_task(cfg: TaskConfig, *, seed: int) -> Task:
    """Instantiate the task named by `cfg.name` with its (already validated) config."""
    return get_task_class(cfg.name)(cfg, seed=seed)
