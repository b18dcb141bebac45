"""What each config key means, for people: `relpos-lab config --help-keys SECTION` (cli/configs.py's keys_help)
and the "did you mean" of an unknown key both read the fields' own documentation from here.
It reads the schema and the registry, never a config: config/load.py imports it, not the reverse."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

from omegaconf import MISSING

from relpos_lab.api import registry
from relpos_lab.api.errors import UserError, did_you_mean
from relpos_lab.config.schema import ExperimentConfig


def field_help(cls: type) -> dict[str, str]:
    """{field: help} of a config dataclass, from its fields' attribute docstrings (a string
    literal right after the field, as litgpt writes them) or `field(metadata={"help": ...})`, as
    fairseq does; base classes first, so a subclass can redocument a field. Plugins' configs
    are read the same way. Empty where the source cannot be read (e.g. an interactive class)."""
    found: dict[str, str] = {}
    if not dataclasses.is_dataclass(cls):
        return found
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for stmt, nxt in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                found[stmt.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
        for f in dataclasses.fields(klass):
            if "help" in f.metadata:
                found[f.name] = str(f.metadata["help"])
    return found


def subsections(cls: type) -> dict[str, type]:
    """{field: dataclass} of the fields of config dataclass `cls` that are sections of their own."""
    found = {}
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(value := f.default_factory()):
            found[f.name] = type(value)
    return found


def describe_keys(cls: type, prefix: str) -> list[str]:
    """The fields of config dataclass `cls` as `<prefix>.<key> (type, default ...)` lines, each
    followed by its help; a nested section points to its own listing."""
    helps, sections, lines = field_help(cls), subsections(cls), []
    for f in dataclasses.fields(cls):
        key = join_key(prefix, f.name)
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        if f.name in sections:
            lines.append(f"{key} (section: relpos-lab config --help-keys {key})")
        elif f.default is not dataclasses.MISSING:
            lines.append(f"{key} ({kind}, {'required' if f.default == MISSING else f'default {f.default!r}'})")
        elif f.default_factory is not dataclasses.MISSING:
            lines.append(f"{key} ({kind}, default {f.default_factory()!r})")
        else:
            lines.append(f"{key} ({kind}, required)")
        lines += [f"    {helps[f.name]}"] if f.name in helps else []
    return lines


def section_class(section: str, task: str | None = None, scheme: str | None = None) -> type:
    """The config dataclass of a dotted section (`model`, `model.positions`, `trainer`, ...;
    `task` with the task's name; `model.positions` with the scheme's, default Shaw): what
    `relpos-lab config --help-keys` lists."""
    if section == "model.positions" and scheme:
        return registry.get_scheme_class(scheme).config_class
    if section.split(".")[0] == "task":
        if not task:
            raise UserError(f"--help-keys {section}: name the task, e.g. --task reverse "
                            "(`relpos-lab tasks` lists them)")
        cls, parts = registry.get_task_class(task).config_class, section.split(".")[1:]
    else:
        cls, parts = ExperimentConfig, section.split(".") if section else []
    path = "task" if section.startswith("task") else ""
    for part in parts:
        sections = subsections(cls)
        if part not in sections:
            close = did_you_mean(part, list(sections))
            hint = f"did you mean '{join_key(path, close)}'? " if close else ""
            raise UserError(f"--help-keys {section}: no section '{join_key(path, part)}'; {hint}"
                            f"sections there: {', '.join(join_key(path, s) for s in sections) or 'none'}")
        cls, path = sections[part], join_key(path, part)
    return cls


def join_key(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
