"""Configs by name: the working directory's ./configs first, then the configs shipped with the package.

The repository's configs/ tree is installed with the package (as the data package
``relpos_lab_configs``), one directory per group: experiment/, sweep/, model/, trainer/, cluster/,
task/ and overlay/. So a config can be named instead of given as a path, from any directory:

- on the command line, an experiment or sweep that is not an existing file is looked up by name
  (``reverse_shaw`` or ``reverse_shaw.yaml``) in ./configs/<group>/, then among the shipped ones;
- an ``extends:`` entry is read relative to the extending file; when no such file exists, it is
  looked up among the shipped configs: ``reverse_shaw.yaml`` is the shipped experiment and
  ``model/shaw_small.yaml`` (or ``../model/shaw_small.yaml``, as the shipped experiments write it)
  a file of a group;
- ``GROUP=NAME`` on the command line selects a file of a group whose name is a config section
  (model, trainer, cluster, task, ...), and a bare word names an overlay (configs/overlay/, e.g.
  ``debug``): see load.command_line_sources.

Nothing here imports Lightning.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path, PurePosixPath

from relpos_lab.api.errors import ConfigError, did_you_mean, shown_path

SHIPPED_PACKAGE = "relpos_lab_configs"
LOCAL = "configs"  # the working directory's own configs, searched before the shipped ones
NAME = re.compile(r"[A-Za-z0-9_][\w-]*(\.yaml)?")  # a config's name: no path, an optional .yaml


def shipped_root() -> Path:
    """The configs/ tree installed with the package."""
    return Path(str(files(SHIPPED_PACKAGE)))


def roots() -> list[tuple[str, Path]]:
    """Where named configs are looked up, in order: ("local", ./configs) when it exists, ("shipped", ...).

    In a clone (an editable install run from its root) the two are one directory: it counts as shipped.
    """
    shipped = shipped_root()
    local = Path(LOCAL)
    if local.is_dir() and local.resolve() != shipped.resolve():
        return [("local", local), ("shipped", shipped)]
    return [("shipped", shipped)]


def is_name(word: str) -> bool:
    return NAME.fullmatch(word) is not None


def file_name(name: str) -> str:
    return name if name.endswith(".yaml") else f"{name}.yaml"


def names_in(group: str) -> list[str]:
    """Every config name of a group, local and shipped, sorted."""
    return sorted({p.stem for _, root in roots() for p in (root / group).glob("*.yaml")})


def _looked_in(group: str) -> str:
    return " and ".join(f"{shown_path(root / group)}/" for _, root in roots())


def find_in_group(group: str, name: str) -> Path | None:
    """configs/<group>/<name>.yaml: the local one if there is one, else the shipped one, else None."""
    for _, root in roots():
        path = root / group / file_name(name)
        if path.is_file():
            return path
    return None


def not_in_group(group: str, name: str) -> str:
    """The end of a "not found" message: where it looked, and what it found there."""
    known = names_in(group)
    close = did_you_mean(name.removesuffix(".yaml"), known)
    hint = f"did you mean '{close}'?" if close else f"{group}: {', '.join(known) or 'none'}"
    return (f"no {group} named '{name.removesuffix('.yaml')}' in {_looked_in(group)}; {hint} "
            "(relpos-lab configs lists them all)")


def find_config(arg: str | Path, group: str, what: str = "config file") -> Path:
    """A config given on the command line: an existing file is that file, else a name in `group`."""
    path = Path(arg)
    if path.is_file():
        return path
    if not is_name(str(arg)):
        raise ConfigError(f"{what} not found: {arg}")
    found = find_in_group(group, str(arg))
    if found is None:
        raise ConfigError(f"{what} not found: {arg}; {not_in_group(group, str(arg))}")
    return found


def find_extended(entry: str, extending: Path, what: str = "config file", role: str = "extended by") -> Path:
    """An `extends:` entry (or a sweep's `experiment:`) of file `extending`: relative to it, else shipped."""
    path = extending.parent / entry
    if path.is_file() or Path(entry).is_absolute():
        return path
    shipped = _shipped_entry(entry)
    if shipped is not None and shipped.is_file():
        return shipped
    group, name = _group_and_name(entry) or ("experiment", PurePosixPath(entry).name)
    raise ConfigError(f"{what} not found: {shown_path(path)} ({role} {shown_path(extending)}); "
                      f"nor among the shipped configs: {not_in_group(group, name)}")


def _group_and_name(entry: str) -> tuple[str, str] | None:
    """`NAME.yaml` -> (experiment, NAME.yaml); `GROUP/NAME.yaml` or `../GROUP/NAME.yaml` -> (GROUP, NAME.yaml)."""
    parts = PurePosixPath(entry).parts
    if parts[:1] == ("..",):
        parts = parts[1:]
    if len(parts) == 1 and is_name(parts[0]):
        return "experiment", parts[0]
    if len(parts) == 2 and is_name(parts[0]) and is_name(parts[1]):
        return parts[0], parts[1]
    return None


def _shipped_entry(entry: str) -> Path | None:
    found = _group_and_name(entry)
    return None if found is None else shipped_root() / found[0] / file_name(found[1])


# --- the catalogue `relpos-lab configs` shows ---------------------------------------------------


@dataclass(frozen=True)
class Entry:
    group: str
    name: str
    where: str  # "local" or "shipped"
    path: Path
    description: str
    shadowed: bool  # a shipped config hidden by a local one of the same name


def catalogue() -> list[Entry]:
    """Every config of every group, local before shipped, with its one-line description."""
    entries: list[Entry] = []
    seen: set[tuple[str, str]] = set()
    for where, root in roots():
        for directory in sorted(p for p in root.iterdir() if p.is_dir() and is_name(p.name)):
            for path in sorted(directory.glob("*.yaml")):
                key = (directory.name, path.stem)
                entries.append(Entry(directory.name, path.stem, where, path, description(path), key in seen))
                seen.add(key)
    return sorted(entries, key=lambda e: (e.group, e.name, e.where != "local"))


SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")  # not in "et al. (2023)", "et al. 2018", "e.g. debug"


def description(path: Path) -> str:
    """The first sentence of the file's leading comment, its commands (`# relpos-lab train ...`)
    left out, over as many lines as it takes (the first line alone cut most sentences short)."""
    comment: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        comment.append(line.lstrip("#").strip())
    text = [line for line in comment if line and not line.startswith(("relpos-lab ", "python "))]
    sentence: list[str] = []
    for line in text:
        sentence.append(line)
        if line.endswith((".", "!", "?")) or SENTENCE_END.search(line):
            break
    return SENTENCE_END.split(" ".join(sentence), maxsplit=1)[0]
