"""Sweeps: one experiment, a grid of overrides, one run directory per grid point.

A sweep file names a base experiment and its axes::

    experiment: ../experiment/reverse_shaw.yaml   # relative to the sweep file, else shipped (find.py)
    name: positions_reverse                       # runs go to <logging.root>/<name>/, W&B group
    overrides: [trainer.max_steps=800]            # for every point
    grid:
      scheme:                                     # named values: label -> overrides
        none: {model.positions.scheme: none}
        shaw_k16: {model.positions.scheme: shaw, model.positions.max_distance: 16}
      seed: [1, 2, 3]                             # plain values of one config key
    exclude:                                      # optional: combinations that are no points
      - {scheme: none, seed: [2, 3]}              # (one a config refuses): axis -> label(s)
    reference:                                    # optional: published numbers, shown beside
      source: Shaw et al. 2018, Table 2           # ours by `relpos-lab report`
      metric: bleu                                # ours they compare with (a leaderboard of it shows them)
      split: valid                                # our split to compare them with (newstest2013)
      values: {none: 12.5, shaw_k16: 25.8}        # report group label -> number; a missing one shows "—"

Points are the product of the axes less the excluded combinations (a point matching every axis of
an `exclude` entry), numbered in order (the last axis varies fastest). Every point
is an ordinary experiment config, so its run directory is the deterministic one of records/rundir.py:
re-running a sweep skips finished points and resumes interrupted ones, locally or as a SLURM job
array (slurm.py), where array index i trains point i. `sweep.json` beside the runs records the
grid for `relpos-lab report`. Locally, `--stack K` trains the points that differ only in what a
stack varies (STACK_VARIES) as one stacked model, K at a time (training/stacked.py); each is still
its own ordinary run directory.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import yaml
from omegaconf import DictConfig, OmegaConf

from relpos_lab.api.errors import ConfigError, shown_path
from relpos_lab.config.find import find_config, find_extended
from relpos_lab.config.load import command_line_sources, compose, read_with_extends
from relpos_lab.config.variations import Variations
from relpos_lab.records.rundir import RunLookup, config_hash, run_directory

SWEEP_KEYS = ("experiment", "name", "overrides", "grid", "exclude", "reference")
REFERENCE_KEYS = ("source", "metric", "split", "values")
MANIFEST = "sweep.json"


@dataclass
class SweepPoint:
    index: int
    labels: dict[str, str]  # axis -> value label, e.g. {"scheme": "shaw_k16", "seed": "1"}
    overrides: list[str]  # this point's own overrides (after the sweep's)
    run_dir: str = ""

    @property
    def shown(self) -> str:
        """The labels as a status line prints them: ``scheme=shaw_k16 seed=1``."""
        return " ".join(f"{axis}={label}" for axis, label in self.labels.items())


@dataclass
class Sweep:
    name: str
    path: Path
    experiment: Path
    overrides: list[str]  # the sweep file's, for every point
    axes: list[str]
    extra: list[str] = field(default_factory=list)  # the command line's, applied last
    points: list[SweepPoint] = field(default_factory=list)
    reference: dict | None = None  # published numbers to show beside the report's (see above)
    _sources: list | None = field(default=None, repr=False)  # the experiment's files, read on first use
    _variations: Variations | None = field(default=None, repr=False)  # what `resolved` composed so far
    _resolved: dict[int, dict] = field(default_factory=dict, repr=False)  # what `resolved` gave, by index

    def overrides_of(self, index: int) -> list[str]:
        """Everything that turns the base experiment into point `index`."""
        point = self.points[index]
        tags = ",".join(f"{axis}={label}" for axis, label in point.labels.items())
        labels = ", ".join(f"{axis}: '{label}'" for axis, label in point.labels.items())
        cell = group_label(point.labels)  # W&B groups the seeds of one grid cell, not the whole sweep
        group = f"{self.name}/{cell}" if cell else self.name
        # extend=false: points that differ only in their budget (a max_steps axis) are separate runs
        return [*self.overrides, *point.overrides, f"name={self.name}", f"logging.wandb.tags=[{tags}]",
                f"logging.wandb.group='{group}'", f"logging.wandb.labels={{{labels}}}", "extend=false", *self.extra]

    def config(self, index: int) -> DictConfig:
        """Point `index`'s config: `load_config` of the experiment with the point's overrides, the
        experiment's files read once for every point."""
        with self._about(index):
            return compose([*self._read(), *command_line_sources(self.overrides_of(index))],
                           default_name=self.experiment.stem)

    def resolved(self, indices: Iterable[int] | None = None) -> Iterator[tuple[int, dict]]:
        """(index, resolved container) of each point (all by default): what
        OmegaConf.to_container(self.config(index), resolve=True) gives, in a small part of its time
        (config/variations.py). Read-only: points share the parts where they agree."""
        if self._variations is None:
            self._variations = Variations(self._read(), default_name=self.experiment.stem)
        for index in range(len(self.points)) if indices is None else indices:
            if index not in self._resolved:
                with self._about(index):
                    self._resolved[index] = self._variations.resolved(self.overrides_of(index))
            yield index, self._resolved[index]

    def _read(self) -> list:
        """The experiment's files, read on first use."""
        if self._sources is None:
            self._sources = read_with_extends(self.experiment)
        return self._sources

    @contextlib.contextmanager
    def _about(self, index: int) -> Iterator[None]:
        """A ConfigError in here names the sweep file and the point."""
        try:
            yield
        except ConfigError as err:
            raise ConfigError(f"sweep {self.path}, point {index} {self.points[index].shown}: {err}") from None

    @property
    def directory(self) -> Path:
        """Where the sweep's runs live: the parent of every point's run directory."""
        return Path(next(p.run_dir for p in self.points if p.run_dir)).parent

    def write_manifest(self) -> Path:
        path = self.directory / MANIFEST
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"name": self.name, "sweep_file": str(self.path), "experiment": shown_path(self.experiment),
                   "overrides": self.overrides + self.extra, "axes": self.axes, "reference": self.reference,
                   "points": [asdict(p) for p in self.points]}
        path.write_text(json.dumps(payload, indent=2) + "\n")
        return path


def group_label(labels: dict[str, str], over: tuple[str, ...] = ("seed",)) -> str:
    """The report group of a point: its grid labels without the averaged-over axes, e.g. "shaw_k16"."""
    return " ".join(label for axis, label in labels.items() if axis not in over)


def load_sweep(path: str | Path, overrides: list[str] = (), only: int | None = None) -> Sweep:
    """Parse and validate a sweep file (or a sweep's name); every point's config is checked before anything runs.

    `only`: resolve (and check) that point's config alone, as a worker training one point does: on
    a grid of hundreds of points, checking them all would cost each worker a minute."""
    path = find_config(path, "sweep", what="sweep file")
    spec = yaml.safe_load(path.read_text()) or {}
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: a sweep file is a mapping with keys {', '.join(SWEEP_KEYS)}")
    unknown = sorted(set(spec) - set(SWEEP_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown sweep key '{unknown[0]}'; valid keys: {', '.join(SWEEP_KEYS)}")
    for key in ("experiment", "grid"):
        if key not in spec:
            raise ConfigError(f"{path}: missing required key '{key}'")
    if not isinstance(spec["experiment"], str):
        raise ConfigError(f"{path}: 'experiment' must be the path of an experiment file")
    experiment = find_extended(spec["experiment"], path, what="experiment file", role="named by").resolve()
    grid = spec["grid"]
    if not isinstance(grid, dict) or not grid:
        raise ConfigError(f"{path}: 'grid' must map each axis to a list of values or to named override sets")
    axes = {axis: _axis_values(path, axis, values) for axis, values in grid.items()}
    sweep = Sweep(spec.get("name") or path.stem, path, experiment, [str(o) for o in spec.get("overrides") or []],
                  list(axes), list(overrides), reference=_reference(path, spec.get("reference")))
    excluded = _exclusions(path, spec.get("exclude"), axes)
    for combo in itertools.product(*axes.values()):
        labels = {axis: label for axis, (label, _) in zip(axes, combo)}
        if not any(all(labels[axis] in allowed for axis, allowed in rule.items()) for rule in excluded):
            sweep.points.append(SweepPoint(len(sweep.points), labels, [o for _, ovr in combo for o in ovr]))
    if sweep.reference:
        groups = {group_label(p.labels) for p in sweep.points}
        unknown = sorted(set(sweep.reference["values"]) - groups)
        if unknown:
            raise ConfigError(f"{path}: reference.values names '{unknown[0]}', which is no group of this grid; "
                              f"groups (grid labels without the seed): {', '.join(sorted(groups))}")
    if only is not None:
        if 0 <= only < len(sweep.points):
            sweep.points[only].run_dir = str(run_directory(sweep.config(only)))
        return sweep
    runs = RunLookup()  # the sweep's directory, listed once for all points
    for index, resolved in sweep.resolved():
        sweep.points[index].run_dir = str(run_directory(resolved, runs))
    if len({p.run_dir for p in sweep.points}) != len(sweep.points):
        raise ConfigError(f"{path}: two grid points resolve to the same config; every point must differ")
    return sweep


def _exclusions(path: Path, spec, axes: dict[str, list[tuple[str, list[str]]]]) -> list[dict[str, set[str]]]:
    """The `exclude` entries as {axis: labels}; each names grid axes and labels that exist."""
    if spec is None:
        return []
    if not isinstance(spec, list) or not all(isinstance(rule, dict) and rule for rule in spec):
        raise ConfigError(f"{path}: 'exclude' must be a list of mappings, axis -> label or [labels]")
    rules = []
    for rule in spec:
        parsed = {}
        for axis, wanted in rule.items():
            if axis not in axes:
                raise ConfigError(f"{path}: exclude names axis '{axis}', which is no axis of the grid "
                                  f"({', '.join(axes)})")
            labels = {v if isinstance(v, str) else _format(v)
                      for v in (wanted if isinstance(wanted, list) else [wanted])}
            known = [label for label, _ in axes[axis]]
            unknown = sorted(labels - set(known))
            if unknown:
                raise ConfigError(f"{path}: exclude names {axis} '{unknown[0]}', which is no label of that axis "
                                  f"({', '.join(known)})")
            parsed[str(axis)] = labels
        rules.append(parsed)
    return rules


def _reference(path: Path, spec) -> dict | None:
    """The sweep file's published numbers: {source, metric, split, values: {group label: number}}."""
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) != set(REFERENCE_KEYS):
        raise ConfigError(f"{path}: 'reference' must be a mapping with exactly the keys {', '.join(REFERENCE_KEYS)}")
    values = spec["values"]
    if not isinstance(values, dict) or not all(isinstance(v, (int, float)) for v in values.values()):
        raise ConfigError(f"{path}: reference.values must map report group labels to numbers")
    return {"source": str(spec["source"]), "metric": str(spec["metric"]), "split": str(spec["split"]),
            "values": {str(k): float(v) for k, v in values.items()}}


def _axis_values(path: Path, axis: str, values) -> list[tuple[str, list[str]]]:
    """[(label, overrides)] of one axis: plain values of config key `axis`, or named override sets."""
    if isinstance(values, list) and values:
        return [(_format(v), [f"{axis}={_format(v)}"]) for v in values]
    if isinstance(values, dict) and values:
        out = []
        for label, settings in values.items():
            if not isinstance(settings, dict):
                raise ConfigError(f"{path}: grid.{axis}.{label} must be a mapping of config keys to values")
            out.append((str(label), [f"{k}={_format(v)}" for k, v in settings.items()]))
        return out
    raise ConfigError(f"{path}: grid.{axis} must be a non-empty list of values or mapping of named settings")


def _format(value) -> str:
    """A value in OmegaConf dot-list syntax."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format(v) for v in value) + "]"
    return str(value)


def is_finished(point: SweepPoint) -> bool:
    return (Path(point.run_dir) / "results.json").is_file()


def is_dangling(point: SweepPoint) -> bool:
    """The point's run directory is a --reuse link whose run was withdrawn (deleted)."""
    run_dir = Path(point.run_dir)
    return run_dir.is_symlink() and not run_dir.exists()


def link_identical_runs(sweep: Sweep, echo=print) -> int:
    """Point each not-yet-started point at a finished run of the same experiment in another sweep.

    Sweeps share points: the paper's Table 2 at k=16 and Table 3 with both edge terms are the
    model of Table 1's relative row. Two runs are the same experiment when their configs hash
    alike without `name` (the sweep's name, which picks the directory). A linked point's run
    directory is a relative symlink to the finished one, so it counts as finished and reports
    read it like any other; its W&B run stays in the group of the sweep that trained it.
    Returns how many points were linked.
    """
    root = sweep.directory.parent
    finished: dict[str, Path] = {}
    for results in sorted(root.glob("*/*/results.json")):
        run = results.parent
        if run.parent == sweep.directory or run.is_symlink() or not (run / "config.yaml").is_file():
            continue
        finished.setdefault(config_hash(OmegaConf.load(run / "config.yaml"), ignore=("name",)), run)
    linked = 0
    for point in sweep.points:
        run_dir = Path(point.run_dir)
        if is_dangling(point):
            run_dir.unlink()
            echo(f"  point {point.index} {point.shown}: linked to a run that is gone: link removed")
        if run_dir.exists():  # started, finished or linked already
            continue
        same = finished.get(config_hash(sweep.config(point.index), ignore=("name",)))
        if same is not None:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            run_dir.symlink_to(os.path.relpath(same, run_dir.parent))
            echo(f"  point {point.index} {point.shown}: the same experiment finished in {same}: linked")
            linked += 1
    return linked


def run_locally(sweep: Sweep, max_parallel: int = 1, echo=print, stack: int = 0) -> list[int]:
    """Train every unfinished point, `max_parallel` processes at a time; returns failed indices.

    Each point runs as `relpos-lab sweep FILE --point i` in its own process (log in
    <sweep dir>/logs/), with resume=true so an interrupted point continues from its checkpoint.
    CPU threads are divided among the parallel processes unless OMP_NUM_THREADS is set.
    `stack` > 1: points that can train as one stack do, up to `stack` at a time, in this process
    first (stack_groups); the others run as above.
    """
    log_dir = sweep.directory / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    todo = [p for p in sweep.points if not is_finished(p)]
    echo(f"sweep {sweep.name}: {len(sweep.points)} points, {len(sweep.points) - len(todo)} already finished; "
         f"running {len(todo)}, {max_parallel} at a time (logs in {log_dir})")
    failed: list[int] = []
    if stack > 1:
        groups = stack_groups(sweep, todo, stack, echo)
        for group in (g for g in groups if len(g) > 1):
            failed += run_stack(sweep, group, echo)
        todo = [g[0] for g in groups if len(g) == 1]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max_parallel)))
    running: dict[int, tuple[subprocess.Popen, float]] = {}
    queue = list(todo)
    while queue or running:
        while queue and len(running) < max_parallel:
            point = queue.pop(0)
            cmd = [sys.executable, "-m", "relpos_lab", "sweep", str(sweep.path), "--point", str(point.index),
                   *sweep.extra]
            log = open(log_dir / f"point-{point.index:03d}.log", "w")
            running[point.index] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), time.time())
            echo(f"  started point {point.index} {point.shown}")
        time.sleep(0.5)
        for index, (proc, started) in list(running.items()):
            if proc.poll() is None:
                continue
            del running[index]
            status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            if proc.returncode:
                failed.append(index)
            seconds = _attempt_seconds(sweep.points[index], started)
            echo(f"  point {index} {sweep.points[index].shown}: {status} in {seconds:.0f}s")
    return failed


def _attempt_seconds(point: SweepPoint, started: float) -> float:
    """How long a point's process took: the wall_seconds of the results.json it wrote (from the
    process's start to its results, what `report` averages), else as the driver saw it."""
    path = Path(point.run_dir) / "results.json"
    try:
        if path.stat().st_mtime >= started:
            seconds = json.loads(path.read_text()).get("wall_seconds")
            if isinstance(seconds, (int, float)):
                return float(seconds)
    except (OSError, ValueError):
        pass
    return time.time() - started



# What may differ between the points of one stack: what each member keeps of its own in a stack
# (training/stacked.py): its seeds (initial weights, data order, the synthetic tasks' data), its
# optimizer and schedule, its clipping norm. Everything else, dropout rates included (the stack runs
# one model's modules), must be alike.
STACK_VARIES: tuple[str, ...] = ("seed", "task.data_seed", "optim.lr", "optim.betas", "optim.eps",
                                 "optim.weight_decay", "optim.scheduler", "optim.warmup_steps", "optim.min_lr_ratio",
                                 "trainer.gradient_clip_val")


def why_not_stacked(resolved: dict, run_dir: Path) -> str | None:
    """Why a point trains alone whatever the others are (None: it can stack)."""
    trainer = resolved["trainer"]
    reasons = [(run_dir.exists(), "started already: it resumes alone"),
               (str(trainer["precision"]) != "32", f"trainer.precision={trainer['precision']}"),
               (trainer["accumulate_grad_batches"] != 1, "trainer.accumulate_grad_batches > 1"),
               (trainer["devices"] != 1 or trainer["num_nodes"] != 1, "more than one device"),
               (trainer.get("stop_at") is not None, "trainer.stop_at (members would stop apart)")]
    return next((why for hit, why in reasons if hit), None)


def stack_groups(sweep: Sweep, points: list[SweepPoint], size: int, echo=print) -> list[list[SweepPoint]]:
    """`points` in stacks of at most `size`: those whose configs agree except in STACK_VARIES, in grid
    order; a point that cannot stack is a group of one. Prints the grouping."""
    by_key: dict[str, list[SweepPoint]] = {}
    alone: dict[int, str] = {}
    resolved = dict(sweep.resolved(p.index for p in points))
    for point in points:
        why = why_not_stacked(resolved[point.index], Path(point.run_dir))
        if why is not None:
            alone[point.index] = why
            continue
        by_key.setdefault(config_hash(resolved[point.index], ignore=STACK_VARIES), []).append(point)
    groups: list[list[SweepPoint]] = []
    for members in by_key.values():
        groups += [members[i:i + size] for i in range(0, len(members), size)]
    for group in groups:
        if len(group) == 1:
            alone.setdefault(group[0].index, "no other point differs from it only in what a stack varies")
    groups += [[p] for p in points if p.index in alone and all(p not in g for g in groups)]
    groups.sort(key=lambda g: g[0].index)
    for group in groups:
        if len(group) > 1:
            echo(f"  stack of {len(group)}: points {' '.join(str(p.index) for p in group)}")
        else:
            echo(f"  alone: point {group[0].index} {group[0].shown} ({alone[group[0].index]})")
    return groups


def run_stack(sweep: Sweep, group: list[SweepPoint], echo=print) -> list[int]:
    """Train `group`'s points as one stack in this process; returns the failed indices."""
    from relpos_lab.config import load_config
    from relpos_lab.training.stacked import MemberFailed, train_stacked

    started = time.time()
    cfgs = [load_config(sweep.experiment, [*sweep.overrides_of(p.index), "resume=true"]) for p in group]
    log_path = sweep.directory / "logs" / f"stack-{group[0].index:03d}.log"
    echo(f"  started a stack of points {' '.join(str(p.index) for p in group)} (log {shown_path(log_path)})")
    try:
        with open(log_path, "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            outcomes = train_stacked(cfgs, echo=lambda line: print(line, file=log, flush=True))
    except Exception as err:  # one stack failing leaves the sweep's other points to train
        for point in group:
            echo(f"  point {point.index} {point.shown}: FAILED in a stack ({type(err).__name__}: {err})")
        return [p.index for p in group]
    failed = []
    for point, outcome in zip(group, outcomes):
        if isinstance(outcome, MemberFailed):
            failed.append(point.index)
            echo(f"  point {point.index} {point.shown}: FAILED in a stack ({type(outcome.error).__name__}: "
                 f"{outcome.error}; log {shown_path(log_path)})")
        else:
            echo(f"  point {point.index} {point.shown}: done in {_attempt_seconds(point, started):.0f}s (stacked)")
    return failed
