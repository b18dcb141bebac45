"""A sweep's points resolved fast: one composition per shape of their overrides, not per point.

A sweep's thousands of points differ mostly in a few values (a seed, a learning rate, a task of
the same family); composing each costs tens of milliseconds (load.compose). `Variations` composes
each shape once and puts each point's values into a copy, checked as compose() checks them.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

try:  # the YAML loader OmegaConf parses dot-lists with (1e-4 a float): parsing a value alone is 100x faster
    from omegaconf._yaml import get_yaml_loader  # omegaconf >= 2.4
except ImportError:
    from omegaconf._utils import get_yaml_loader

from relpos_lab.config.load import (
    DOTTED_KEY,
    OVERLAY,
    POSITIONS,
    Source,
    _scheme_config_class,
    _sections,
    _structured_template,
    _task_config_class,
    command_line_sources,
    compose,
    file_selection,
)
from relpos_lab.config.schema import CHOICES, ExperimentConfig


class Variations:
    """Configs of one experiment under many override lists that differ mostly in the values they
    set, as a sweep's grid points do (a seed, a learning rate, a task of the same family), resolved
    fast: compose() costs tens of milliseconds, and a paper's sweep has thousands of points.

    Each shape (the overrides with such values left out, see `_shape`) is composed once. A config
    of the same shape is that one's resolved container with its own values put in, each converted
    as the schema converts it (a value of a type the schema kept as it is, once, is kept as it is
    after), and every section they change checked again (each distinct section content once).
    That is what compose() of the same sources gives (tests/test_sweep.py checks shipped sweeps);
    where it is not plain (an interpolation, a debug config, a value that is no leaf of the config,
    a failed check), the config is composed in full, which also gives a mistake its usual message.
    """

    def __init__(self, base: list[Source], default_name: str):
        self._base, self._default_name = base, default_name
        self._shapes: dict[tuple, _Shape | None] = {}  # None: a shape composed in full each time
        self._valid: set[tuple[type, str]] = set()  # (section class, content) checked already
        self._read = functools.lru_cache(maxsize=None)(_read)  # each override read once

    def resolved(self, overrides: list[str]) -> dict:
        """OmegaConf.to_container(compose(base + `overrides`), resolve=True), validated. Read-only:
        configs of one shape share the parts where they agree."""
        shape, values = _shape(overrides, self._read)
        held = self._shapes.get(shape, _ABSENT)
        if isinstance(held, _Shape):
            try:
                return self._vary(held, values)
            except (OmegaConfBaseException, ValueError):
                pass  # composed in full below: the mistake's own message, or what varying cannot reach
        sources = [*self._base, *command_line_sources(overrides)]
        cfg = compose(sources, default_name=self._default_name)
        resolved = OmegaConf.to_container(cfg, resolve=True)
        if held is _ABSENT:
            varies = values and not cfg.get("debug") and not _interpolates(sources, cfg)
            self._shapes[shape] = _Shape(cfg, resolved, dict(values), dict(values)) if varies else None
        return resolved

    def _vary(self, shape: _Shape, values: dict[str, Any]) -> dict:
        """The resolved config of `shape` with `values` in place of those it was composed with."""
        changed = {key: self._converted(shape, key, value) for key, value in values.items()
                   if repr(value) != repr(shape.composed_with[key])}
        resolved = _patched(shape.resolved, changed)
        for key in changed.keys() & CHOICES.keys():
            value = changed[key]
            if value is not None and str(value) not in CHOICES[key]:
                raise ValueError(f"{key}={value!r} is no choice")
        for section in {key.split(".")[0] for key in changed} & set(_sections()):
            self._check(shape, section, resolved[section], values)
        return resolved

    def _converted(self, shape: _Shape, key: str, value: Any) -> Any:
        """`value` as the schema holds it at `key` (1 -> 1.0 for a float), found by setting it."""
        kind = (key, _kind(value))
        if kind in shape.kept:
            return value
        self._set(shape, {key: value})
        node = OmegaConf.select(shape.cfg, key)
        converted = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node
        if kind[1] is not None and type(converted) is type(value) and repr(converted) == repr(value):
            shape.kept.add(kind)
        return converted

    def _check(self, shape: _Shape, section: str, content: Any, values: dict[str, Any]) -> None:
        """The section's own validate(), once for each content: on the composed config, set to it."""
        config_class = OmegaConf.get_type(shape.cfg[section])
        if not callable(getattr(config_class, "validate", None)):  # logging: every point's own W&B labels
            return
        checked = (config_class, repr(content))
        if checked in self._valid:
            return
        self._set(shape, {key: value for key, value in values.items() if key.split(".")[0] == section})
        OmegaConf.to_object(shape.cfg[section]).validate()
        self._valid.add(checked)

    @staticmethod
    def _set(shape: _Shape, values: dict[str, Any]) -> None:
        """Set `values` in the shape's config as merging them would (those it does not hold yet)."""
        for key, value in values.items():
            if repr(shape.holds.get(key, _ABSENT)) == repr(value):
                continue
            shape.holds.pop(key, None)  # unknown until it is set
            if OmegaConf.select(shape.cfg, key, default=_ABSENT) is _ABSENT:
                raise ValueError(f"{key} is no value of the composed config")
            OmegaConf.update(shape.cfg, key, value, merge=True)
            shape.holds[key] = value


@dataclasses.dataclass
class _Shape:
    """A shape's composed config, and what Variations learnt of it."""
    cfg: DictConfig  # composed, then set to the values a check needs
    resolved: dict  # its resolved container as composed
    composed_with: dict[str, Any]  # the values it was composed with
    holds: dict[str, Any]  # the values cfg holds now
    kept: set[tuple[str, Any]] = dataclasses.field(default_factory=set)  # (key, kind): the schema keeps such values


_ABSENT = object()


def _kind(value: Any) -> Any:
    """The type of a value, of a list's items too; None for anything else (a nested list)."""
    if isinstance(value, list):
        kinds = tuple(sorted({type(item).__name__ for item in value}))
        return None if {"list", "dict"} & set(kinds) else ("list", kinds)
    return type(value)


def _patched(tree: dict, values: dict[str, Any]) -> dict:
    """`tree` with `values` (dotted key -> value) in place, copying only the mappings on their paths."""
    copies: dict[tuple[str, ...], dict] = {(): dict(tree)}
    for key, value in values.items():
        parts = key.split(".")
        node = copies[()]
        for depth in range(1, len(parts)):
            path = tuple(parts[:depth])
            if path not in copies:
                copies[path] = node[parts[depth - 1]] = dict(node[parts[depth - 1]])
            node = copies[path]
        node[parts[-1]] = value
    return copies[()]


_FIXED = ("name", "debug")
"""Keys whose value is more than a value: debug cuts the task's data, a missing name defaults to the file's."""


def _shape(overrides: list[str], read=None) -> tuple[tuple, dict[str, Any]]:
    """Overrides split into what shapes a config and the values it merely holds: the leaves (dotted
    key -> parsed value) of each ``key=value`` that is set once, fixes nothing (_FIXED) and that no
    later file may set again; the shape is the overrides with those values left out. A task's or a
    scheme's name is a value too: the shape holds what it picks, its config class. `read`: `_read`,
    cached."""
    keys = tuple(item.partition("=")[0] for item in overrides)
    overlapping = _overlapping(keys)
    shape: list = []
    values: dict[str, Any] = {}
    later: set[str] = set()  # the sections that files after an override may set ("*": an overlay, any)
    for item, key in zip(reversed(overrides), reversed(keys)):
        selected, leaves, picked = (read or _read)(item)
        if selected is not None:
            later.add("*" if selected[0] == OVERLAY else selected[0])
        if leaves is None or key in overlapping or "*" in later or key.split(".")[0] in later:
            shape.append(item)
            continue
        shape.append((key, tuple(leaves), picked))
        values.update(leaves)
    return tuple(reversed(shape)), values


def _read(item: str) -> tuple[tuple[str, str] | None, dict[str, Any] | None, tuple]:
    """One override as (the file it selects, its leaves, the config classes they pick): leaves None
    when it is more than values (a file, an interpolation, a name nothing is registered under, _FIXED)."""
    selected = file_selection(item)
    leaves = None if selected is not None else _leaves(item)
    picked = None if leaves is None else _picked(leaves)
    if picked is None or any(key in _FIXED for key in leaves):
        return selected, None, ()
    return selected, leaves, picked


def _picked(leaves: dict[str, Any]) -> tuple | None:
    """The config classes that the task and scheme names among `leaves` pick; None if one picks none."""
    picks = {"task.name": _task_config_class, f"{POSITIONS}.scheme": _scheme_config_class}
    classes = tuple(picks[key](value) if isinstance(value, str) else None for key, value in leaves.items()
                    if key in picks)
    return None if None in classes else classes


@functools.lru_cache(maxsize=256)
def _overlapping(keys: tuple[str, ...]) -> frozenset[str]:
    """The keys set twice, or beside a key within them or around them (optim and optim.lr); a
    sweep's points share a few lists of keys, each looked at once."""
    counts = collections.Counter(keys)
    inner = {".".join(parts[:depth]) for parts in (key.split(".") for key in keys) for depth in range(1, len(parts))}
    return frozenset(key for key in keys if counts[key] > 1 or key in inner
                     or any(".".join(key.split(".")[:depth]) in counts for depth in range(1, key.count(".") + 1)))


@functools.lru_cache(maxsize=4096)
def _parsed(item: str) -> Any:
    """The value of one ``key=value`` override as the command line's dot-list parses it
    (OmegaConf.from_dotlist, without building a config around it); not to be changed."""
    return yaml.load(item.partition("=")[2], Loader=_yaml_loader())


@functools.cache
def _yaml_loader() -> type:
    return get_yaml_loader()  # a class built anew on each call


def _leaves(item: str) -> dict[str, Any] | None:
    """A ``key=value`` override as dotted key -> value, a mapping flattened to its leaves (merging
    a mapping sets each of them); None for anything else (an overlay, an interpolation, ...)."""
    key = item.partition("=")[0]
    if "=" not in item or not DOTTED_KEY.fullmatch(key):
        return None
    try:
        value = _parsed(item)
    except (OmegaConfBaseException, yaml.YAMLError):
        return None
    return _flattened(key, value)


def _flattened(key: str, value: Any) -> dict[str, Any] | None:
    """`value` at `key` as its leaves, dotted key -> value; None where one is no plain value."""
    if isinstance(value, dict):
        if not value or not all(isinstance(k, str) and DOTTED_KEY.fullmatch(k) and "." not in k for k in value):
            return None
        out: dict[str, Any] = {}
        for k, v in value.items():
            leaves = _flattened(f"{key}.{k}", v)
            if leaves is None:
                return None
            out.update(leaves)
        return out
    if "${" in str(value) or "???" in (value if isinstance(value, list) else [value]):
        return None
    return {key: value}


def _interpolates(sources: list[Source], cfg: DictConfig) -> bool:
    """Whether a value of `sources` or of the schema under `cfg` is an interpolation (``${...}``),
    which may read a value that a config of the same shape sets otherwise."""
    classes = (ExperimentConfig, OmegaConf.get_type(cfg.task), OmegaConf.get_type(cfg.model.positions))
    return (any(_has_interpolation(OmegaConf.to_container(content, resolve=False)) for _, content in sources)
            or any(_template_interpolates(cls) for cls in classes if dataclasses.is_dataclass(cls)))


@functools.cache
def _template_interpolates(config_class: type) -> bool:
    return _has_interpolation(OmegaConf.to_container(_structured_template(config_class), resolve=False))


def _has_interpolation(tree: Any) -> bool:
    if isinstance(tree, dict):
        return any(_has_interpolation(v) for v in tree.values())
    if isinstance(tree, list):
        return any(_has_interpolation(v) for v in tree)
    return isinstance(tree, str) and "${" in tree
