"""Loading an experiment: YAML files and command-line overrides into one validated config.

An experiment is a YAML file laid over the schema defaults (schema.py); on the command line it may
also be named (``reverse_shaw``: ./configs/experiment/, then the shipped configs; see find.py). A
file may `extends:` other files (a path or a list of paths, relative to the file, else among the
shipped configs), which are laid down first; then comes the command line, in its order: ``key=value``
overrides (OmegaConf dot-list syntax), ``GROUP=NAME`` selections of a group's file and overlay names
(see `command_line_sources`). The ``task`` section is checked
against the chosen task's own config dataclass, found through the registry, so a plugin's options
are validated exactly like the built-in ones.

Every mistake becomes one `ConfigError` line naming the key, where it was set (file or command
line) and what would have been valid: an unknown key (with the closest valid key), a value of the
wrong type, a value outside its choices, a missing required value, or a model shape the core
rejects. The CLI prints that line and exits with status 2.

A sweep's thousands of points differ mostly in a few values: `variations.Variations` resolves them
with one composition for each shape of their overrides, not one for each point.
"""
from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from relpos_lab.api import registry
from relpos_lab.api.errors import ConfigError, UserError, did_you_mean, shown_path
from relpos_lab.config.find import find_config, find_extended, find_in_group, is_name, names_in, not_in_group
from relpos_lab.config.help import field_help, join_key
from relpos_lab.config.schema import CHOICES, REMOVED_KEYS, ExperimentConfig
from relpos_lab.core.positions import BUILTIN
from relpos_lab.core.transformer import ModelConfig

COMMAND_LINE = "command line"
POSITIONS = "model.positions"

Source = tuple[str, DictConfig]  # (label for messages: a file path or "command line", content)


def load_config(path: str | Path, overrides: list[str] = (), *, partial: bool = False) -> DictConfig:
    """The experiment at `path` (a file, or an experiment's name) with what it extends, then `overrides`, validated.

    partial=True checks a shared piece (configs/model/*.yaml, ...) that is not a whole
    experiment: a missing task and missing values are then allowed.
    """
    path = find_config(path, "experiment")
    sources = read_with_extends(path) + command_line_sources(overrides)
    return compose(sources, default_name=path.stem, partial=partial)


def config_from_container(container: dict, label: str, overrides: list[str] = ()) -> DictConfig:
    """Validate a config stored elsewhere (a checkpoint's), with command-line overrides on top."""
    sources = [(label, OmegaConf.create(container)), *command_line_sources(overrides)]
    return compose(sources, default_name=str(container.get("name") or "experiment"))


def read_with_extends(path: Path, _seen: tuple[Path, ...] = ()) -> list[Source]:
    """The file and the files it extends, in merge order (bases first)."""
    path = path.resolve()
    label = shown_path(path)
    if path in _seen:
        chain = " -> ".join(shown_path(p) for p in (*_seen, path))
        raise ConfigError(f"{label}: circular extends ({chain})")
    if not path.is_file():
        raise ConfigError(f"config file not found: {label}"
                          + (f" (extended by {shown_path(_seen[-1])})" if _seen else ""))
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{label}:{where} is not valid YAML ({getattr(err, 'problem', err)})") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f"{label}: must hold a mapping of config sections, not a {type(raw).__name__}")
    bases = raw.pop("extends", None) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ConfigError(f"{label}: extends must be a path or a list of paths, got {bases!r}")
    sources: list[Source] = []
    for base in bases:
        sources += read_with_extends(find_extended(base, path), (*_seen, path))
    try:
        content = OmegaConf.create(raw)
    except OmegaConfBaseException as err:
        raise ConfigError(f"{label}: {_first_line(err)}") from None
    return sources + [(label, content)]


DOTTED_KEY = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")
"""What an override's key may be: ``optim.lr``, ``model.positions.max_distance``."""

OVERLAY = "overlay"  # the group of files a bare word on the command line lays over the whole config


DEFAULT_SCHEME = ModelConfig().positions.scheme
"""The scheme a config that names none gets: the model's own default."""


def sections() -> list[str]:
    """The config's sections (mappings of settings): what GROUP in GROUP=NAME may be."""
    return list(_sections())


@functools.cache
def _sections() -> tuple[str, ...]:  # the schema is fixed; building it costs ~20 ms a call
    schema = OmegaConf.structured(ExperimentConfig)
    return ("task", *(key for key in schema if isinstance(schema.get(key), DictConfig)))


def command_line_sources(overrides: list[str]) -> list[Source]:
    """The command line's words as sources, merged in their order:

    - ``GROUP=NAME``, where GROUP is a section (model, trainer, cluster, task, ...) and NAME a
      name (no dots but an optional .yaml), is configs/GROUP/NAME.yaml (./configs first, then the
      shipped configs), which may set only that section. No real override is lost: a section
      cannot be assigned a scalar;
    - a bare word (no ``=``) is an overlay, configs/overlay/WORD.yaml (e.g. ``debug``);
    - anything else is a ``key=value`` override (OmegaConf dot-list syntax).
    """
    sources: list[Source] = []
    dotlist: list[str] = []
    for item in overrides:
        selected = file_selection(item)
        if selected is None:
            dotlist.append(item)
            continue
        group, name = selected
        path = find_in_group(group, name)
        if path is None:
            if group == OVERLAY:
                raise ConfigError(f"{COMMAND_LINE}: {item!r} is neither an override of the form key=value "
                                  f"(e.g. optim.lr=3e-4) nor an overlay: {not_in_group(OVERLAY, name)}")
            raise ConfigError(f"{COMMAND_LINE}: {item}: {not_in_group(group, name)}")
        if dotlist:
            sources.append(parse_overrides(dotlist))
            dotlist = []
        selected = read_with_extends(path)
        if group != OVERLAY:
            for label, content in selected:
                other = next((str(k) for k in content if k != group), None)
                if other is not None:
                    raise ConfigError(f"{label}: selected by {item} on the {COMMAND_LINE}, it may set only "
                                      f"'{group}', but it sets '{other}' (lay whole-config changes over with "
                                      f"an overlay, configs/{OVERLAY}/, or extends:)")
        sources += selected
    return sources + [parse_overrides(dotlist)]


def file_selection(item: str) -> tuple[str, str] | None:
    """(group, name) of a command-line word that selects a file (see `command_line_sources`), else None."""
    key, eq, value = item.partition("=")
    if eq and key in _sections() and is_name(value) and isinstance(yaml.safe_load(value), str):
        return key, value
    if not eq and is_name(item):
        return OVERLAY, item
    return None


def parse_fields(words: list[str]) -> dict:
    """FIELD=VALUE words as YAML values (numbers, lists, booleans), as config overrides read them."""
    fields = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise UserError(f"{word!r} is not FIELD=VALUE")
        fields[key] = yaml.safe_load(value)
    return fields


def parse_overrides(overrides: list[str]) -> Source:
    """`key=value` strings as one source; the value is parsed as YAML (`[1, 8]`, `true`, `1e-3`)."""
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or not DOTTED_KEY.fullmatch(key):
            raise ConfigError(f"{COMMAND_LINE}: override {item!r} is not of the form key=value (e.g. optim.lr=3e-4)"
                              f" or an overlay name ({', '.join(names_in(OVERLAY)) or 'none'})")
    try:
        return COMMAND_LINE, OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ConfigError(f"{COMMAND_LINE}: {_first_line(err)}") from None


def compose(sources: list[Source], *, default_name: str, partial: bool = False) -> DictConfig:
    """Merge `sources` in order over the schema and validate the result (see module docstring)."""
    sources = _without_replaced(sources, "task", "name", _task_config_class)
    sources = _without_replaced(sources, POSITIONS, "scheme", _scheme_config_class, default=DEFAULT_SCHEME)
    provenance = _provenance(sources)
    schema = _structured(ExperimentConfig)
    task_cls = _task_class(sources, provenance, partial)
    if task_cls is not None:
        schema.task = _structured(task_cls.config_class)
    scheme_cls = _scheme_class(sources, provenance)
    sources = _without_legacy_position_fields(sources, scheme_cls)
    schema.model.positions = _structured(scheme_cls.config_class)
    for label, content in sources:
        _check_sections_are_mappings(label, content, schema)
    try:  # one merge (each merge copies what it merges into); the failing source is found below
        cfg = OmegaConf.merge(schema, *(content for _, content in sources))
    except OmegaConfBaseException:
        cfg = schema
        for label, content in sources:
            try:
                cfg = OmegaConf.merge(cfg, content)
            except OmegaConfBaseException as err:
                raise ConfigError(_merge_error(label, err, schema)) from None
    if OmegaConf.is_missing(cfg, "name"):
        cfg.name = default_name
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "")
        raise ConfigError(f"{provenance.get(key, 'config')}: cannot resolve '{key}': {_first_line(err)}") from None
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing and not partial:
        files = [label for label, _ in sources if label != COMMAND_LINE]
        where = f"in {files[-1]} " if files else ""
        raise ConfigError(f"missing required value '{missing[0]}': set it {where}or pass {missing[0]}=... "
                          "on the command line")
    _check_choices(cfg, provenance)
    _check_sections(cfg, provenance, [label for label, _ in sources])
    if cfg.get("debug") and task_cls is not None and not missing:  # the task's data cut small, checked again
        cfg.task = OmegaConf.structured(OmegaConf.to_object(cfg.task).for_debug())
        _check_sections(cfg, provenance, [label for label, _ in sources])
    return cfg


def _structured(config_class: type) -> DictConfig:
    """A fresh structured config of `config_class` (a copy of one built once: building is the slow part)."""
    return _structured_template(config_class).copy()


@functools.lru_cache(maxsize=None)
def _structured_template(config_class: type) -> DictConfig:
    return OmegaConf.structured(config_class)


def _without_replaced(sources: list[Source], section: str, key: str, config_class,
                      default: str | None = None) -> list[Source]:
    """A source that names a plugin (a task, a position scheme) with another config class than
    the one before it replaces the earlier sources' `section`: `extends: reverse_shaw.yaml` +
    `task: {name: shift}` keeps reverse_shaw's model and trainer, not the reverse task's options
    (which the shift task would reject as unknown keys); a sweep point `model.positions.scheme:
    rope` over a Shaw experiment drops Shaw's max_distance. Plugins sharing a config class (the
    tasks reverse and copy) keep merging."""
    kept: list[Source] = []
    current = default
    for label, content in sources:
        block = OmegaConf.select(content, section, default=None) if isinstance(content, DictConfig) else None
        name = block.get(key) if isinstance(block, DictConfig) else None
        if isinstance(name, str) and current is not None and config_class(name) is not config_class(current):
            kept = [(lab, _drop(c, section)) for lab, c in kept]
        current = name if isinstance(name, str) else current
        kept.append((label, content))
    return kept


def _task_config_class(task: str) -> type | None:
    try:
        return registry.get_task_class(task).config_class
    except UserError:
        return None  # an unknown name is reported by _task_class, with the tasks available


def _scheme_config_class(scheme: str) -> type | None:
    try:
        return registry.get_scheme_class(scheme).config_class
    except UserError:
        return None  # reported by _scheme_class


def _drop(content: DictConfig, section: str) -> DictConfig:
    if OmegaConf.select(content, section, default=None) is None:
        return content
    copy = content.copy()
    parent, _, leaf = section.rpartition(".")
    node = OmegaConf.select(copy, parent) if parent else copy
    del node[leaf]
    return copy


def _scheme_class(sources: list[Source], provenance: dict[str, str]):
    """The position scheme the sources name (the last `model.positions.scheme`; the model's default)."""
    name = DEFAULT_SCHEME
    for _, content in sources:
        value = (OmegaConf.select(content, f"{POSITIONS}.scheme", default=None)
                 if isinstance(content, DictConfig) else None)
        if value is not None:
            name = value
    if not isinstance(name, str):
        raise ConfigError(f"{provenance.get(POSITIONS + '.scheme', 'config')}: {POSITIONS}.scheme must be a name, "
                          f"got {name!r} (see `relpos-lab positions`)")
    try:
        return registry.get_scheme_class(name)
    except UserError as err:
        raise ConfigError(f"{provenance.get(POSITIONS + '.scheme', 'config')}: {POSITIONS}.scheme: {err}") from None


def _without_legacy_position_fields(sources: list[Source], scheme_cls) -> list[Source]:
    """Before schemes were plugins, model.positions held every built-in scheme's fields at once,
    and every resolved config.yaml of that time still does. A field of another built-in scheme is
    dropped when it holds that scheme's default (what such files contain); set to anything else,
    it is a mistake, reported as one line naming the scheme it belongs to."""
    own = {f.name for f in dataclasses.fields(scheme_cls.config_class)}
    kept = []
    for label, content in sources:
        block = OmegaConf.select(content, POSITIONS, default=None) if isinstance(content, DictConfig) else None
        foreign = [k for k in (block.keys() if isinstance(block, DictConfig) else [])
                   if k not in own and k in _BUILTIN_FIELDS]
        if not foreign:
            kept.append((label, content))
            continue
        content = content.copy()
        block = OmegaConf.select(content, POSITIONS)
        for key in foreign:
            owner, default = _BUILTIN_FIELDS[key]
            value = block[key]
            if value != default:
                shown = str(value).lower() if isinstance(value, bool) else value
                raise ConfigError(f"{label}: {POSITIONS}.{key}={shown} is a field of scheme '{owner}', not of "
                                  f"'{scheme_cls.config_class.scheme}'; fields of {scheme_cls.config_class.scheme}: "
                                  f"{', '.join(sorted(own - {'scheme'})) or 'none'} (`relpos-lab positions`)")
            del block[key]
        kept.append((label, content))
    return kept


_BUILTIN_FIELDS = {f.name: (name, f.default) for name, cls in reversed(BUILTIN.items())
                   for f in dataclasses.fields(cls.config_class) if f.name != "scheme"}
"""A field's first built-in owner (rope_base: rope, before xpos and pope) and its default."""


def _check_sections_are_mappings(label: str, content: DictConfig, schema: DictConfig) -> None:
    """`optim: 3` or `task: reverse` would otherwise fail deep inside the merge without a key."""
    for key, value in OmegaConf.to_container(content, resolve=False).items():
        section = key == "task" or isinstance(schema.get(key), DictConfig)
        if section and value is not None and not isinstance(value, dict):
            example = "task: {name: reverse}" if key == "task" else f"{key}: {{...}}"
            raise ConfigError(f"{label}: '{key}' must be a mapping of settings, e.g. {example}")


def _task_class(sources: list[Source], provenance: dict[str, str], partial: bool):
    try:
        raw = OmegaConf.merge(OmegaConf.create(), *(content for _, content in sources))
    except OmegaConfBaseException as err:  # e.g. a section given as a mapping in one file, a value in another
        key = getattr(err, "full_key", "") or "?"
        raise ConfigError(f"{provenance.get(key, 'config')}: conflicting values for '{key}': "
                          f"{_first_line(err)}") from None
    task = raw.get("task")
    if task is None or (isinstance(task, DictConfig) and task.get("name") is None):
        if partial:
            return None
        raise ConfigError(
            "missing required value 'task.name': choose a task, e.g. task: {name: reverse}; "
            f"available tasks: {', '.join(registry.available()) or 'none installed'}"
        )
    if not isinstance(task, DictConfig) or not isinstance(task.get("name"), str):
        raise ConfigError(f"{provenance.get('task', provenance.get('task.name', 'config'))}: "
                          "task must be a mapping with a name, e.g. task: {name: reverse}")
    try:
        return registry.get_task_class(task.name)
    except UserError as err:
        raise ConfigError(f"{provenance.get('task.name', 'config')}: task.name: {err}") from None


def _merge_error(label: str, err: OmegaConfBaseException, schema: DictConfig) -> str:
    key = getattr(err, "full_key", None) or ""
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(schema, parent) if parent else schema
    if key in REMOVED_KEYS:
        return f"{label}: '{key}' was removed: {REMOVED_KEYS[key]}"
    if "not in" in str(err) and isinstance(node, DictConfig):  # unknown key
        valid = [str(k) for k in node.keys()]
        close = did_you_mean(leaf, valid)
        about = field_help(OmegaConf.get_type(node)).get(close or "")
        hint = f"did you mean '{join_key(parent, close)}'{f' ({about})' if about else ''}? " if close else ""
        where = f"'{parent}'" if parent else "the top level"
        if parent == POSITIONS:
            where += f" (scheme {node.scheme})"
        return f"{label}: unknown key '{key}'; {hint}valid keys at {where}: {', '.join(valid)}"
    return f"{label}: bad value for '{key}': {_first_line(err)}"


def _check_choices(cfg: DictConfig, provenance: dict[str, str]) -> None:
    for key, choices in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value is None or str(value) in choices:
            continue
        close = did_you_mean(str(value), choices)
        hint = f"did you mean '{close}'? " if close else ""
        raise ConfigError(f"{provenance.get(key, 'schema default')}: {key}={value!r} is not a valid choice; "
                          f"{hint}choose one of: {', '.join(choices)}")


def _check_sections(cfg: DictConfig, provenance: dict[str, str], order: list[str]) -> None:
    """Each section's own `validate()` (the core's ModelConfig included), as ConfigErrors."""
    for section in sorted(_sections(), key=lambda name: name == "task"):  # the task's own checks last
        if section not in cfg or not callable(getattr(OmegaConf.get_type(cfg[section]), "validate", None)):
            continue  # no task chosen yet (a partial config), or a section with nothing to check
        obj = OmegaConf.to_object(cfg[section])
        try:
            obj.validate()
        except ValueError as err:
            raise ConfigError(_located(str(err), section, provenance, order)) from None


def _located(message: str, section: str, provenance: dict[str, str], order: list[str]) -> str:
    """A validation message prefixed with where its keys were set.

    The keys are the dotted names in the message (``model.n_heads=5``, ``model.positions.max_distance``)
    or names followed by ``=``, relative to `section` if need be. When they come from several sources,
    the last one to be merged (`order`: the command line after the files) is the one that made the
    combination invalid, so it leads, and the others are named after the message:
    ``command line: model.d_model=64 is not divisible by model.n_heads=5; ... (model.d_model: from
    configs/model/shaw_small.yaml)``.
    """
    found: dict[str, str] = {}  # key as written in the message -> its source
    for name, eq in re.findall(r"([A-Za-z_][\w.]*\w)(=?)", message):
        if not eq and "." not in name:
            continue
        for key in (name, f"{section}.{name}"):
            if key in provenance:
                found.setdefault(name, provenance[key])
                break
    if not found:
        return f"config: {message}"
    rank = {label: i for i, label in enumerate(order)}  # a label's last position in merge order
    lead = max(found.values(), key=lambda label: rank.get(label, -1))
    others = [f"{name}: from {label}" for name, label in found.items() if label != lead]
    return f"{lead}: {message}" + (f" ({'; '.join(others)})" if others else "")


def _provenance(sources: list[Source]) -> dict[str, str]:
    """Dotted key → label of the last source that set it (and the sections along the way)."""
    where: dict[str, str] = {}

    def walk(node: Any, prefix: str, label: str) -> None:
        if isinstance(node, dict):
            for k, value in node.items():
                key = join_key(prefix, str(k))
                where[key] = label
                walk(value, key, label)

    for label, content in sources:
        walk(OmegaConf.to_container(content, resolve=False), "", label)
    return where


def _first_line(err: Exception) -> str:
    text = getattr(err, "msg", None) or str(err)
    return str(text).strip().splitlines()[0]



def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)
