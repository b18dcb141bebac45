"""The run directory (docs/design.md, "What others rely on"): a deterministic function of the resolved config.

``<logging.root>/<name>/<slug>-<hash8>``: a requeued SLURM job or a re-launched command finds its
own checkpoint and metrics again — never a timestamp in the path. Everything a run leaves behind
goes there: ``config.yaml`` (resolved), ``metrics.csv``, ``results.json``, ``plots/*.png``, the
checkpoints, and the offline W&B run under ``wandb/`` (whose id is derived from the directory, so
a resumed run continues the same W&B run).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from relpos_lab.api.errors import UserError, shown_path
from relpos_lab.api.files import atomic_write

# Keys that do not change what a run computes, left out of the run directory's hash so that
# changing them continues the same run instead of starting another: where files go and how they
# are reported (logging), whether to resume (resume), where and how SLURM runs the job (cluster:
# partition, time limit, ...; the world size it implies is in trainer.devices / num_nodes, which
# stay in), the trainer's display and reporting switches, how often last.ckpt is refreshed (steps
# or minutes), how long distributed processes wait for each other at the start, whether the
# model is compiled (the same arithmetic, fused) and the padding that makes its shapes few (masked,
# tests/test_padding.py), and the CPU thread count (its default already
# depends on the machine a job lands on, so a requeued job on another node must still find its
# run). Anything else that can change the numbers stays in — even num_sanity_val_steps, whose
# extra pass over the validation loader draws from the global RNG.
VOLATILE_KEYS: tuple[str, ...] = (
    "resume",
    "extend",
    "logging",
    "cluster",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.log_every_n_steps",
    "trainer.checkpoint_every_n_steps",
    "trainer.threads",
    "trainer.checkpoint_every_minutes",
    "trainer.rendezvous_timeout_seconds",
    "trainer.compile",
    "data.pad_to_multiple",
)



# How long a run trains and when it validates and stops: its budget. They stay in the hash (a
# run trained for 1000 steps is not one trained for 2000), but a run can be extended in place
# (`train --extend`): a config that differs from an existing run only in these keys is that run
# with another budget (budget_siblings), continued in its own directory, which keeps its name.
BUDGET_KEYS: tuple[str, ...] = ("trainer.max_steps", "trainer.val_every_n_steps", "trainer.stop_at")
EXTENDED = "extended.json"  # in a run directory extended in place: each extension's step and budgets


# Keys added to the schema after runs existed, left out of the hash while they hold their default,
# so that an existing experiment keeps its run directory (and resumes, and is reused by sweeps).
ADDED_KEYS: dict[str, Any] = {
    "model.positions.max_distance_left": None,
    "model.positions.max_distance_right": None,
    "model.positions.max_random_len": None,
    "model.positions.randomize_at_eval": False,
    "model.positions.redraw_per_layer": False,
    "model.positions.random_distances": False,
    "debug": False,
    "task.eval_sentences": 0,
    "task.train_sentences": 0,
    "trainer.stop_at": None,
    "model.architecture": "encoder_decoder",
    "model.bidirectional_prefix": False,
    "task.loss_on_source": False,
    "task.loss_on_padding": False,
    "trainer.evaluate": "best",
    "model.positions.rope_fraction": 1.0,
    "model.positions.rope_scaling": "none",
    "model.positions.rope_scaling_factor": 0.0,
    "model.positions.rope_train_length": 0,
    "model.positions.yarn_beta_fast": 32.0,
    "model.positions.yarn_beta_slow": 1.0,
    "task.order": "paper",
    "model.positions.count_from_end": False,
    "model.positions.left_offset": 0.0,
    "model.embedding_dropout": None,
    "model.ffn_dropout": None,
    "model.attention_bias": True,
    "model.output_bias": False,
    "model.init": "pytorch",
    "trainer.eval_dropout": False,
}
# Before position schemes were plugins, model.positions held every built-in scheme's fields at
# once. A scheme's section is hashed as that flat form (its own fields over the old defaults), so
# every run directory made before keeps its name.
FLAT_POSITIONS: dict[str, Any] = {
    "scheme": "shaw", "max_distance": 16, "use_keys": True, "use_values": True, "per_head": False,
    "add_sinusoids": False, "max_len": 1024, "rope_base": 10000.0, "t5_num_buckets": 32, "t5_max_distance": 128,
}


def config_hash(cfg: DictConfig | dict, length: int = 8, ignore: tuple[str, ...] = ()) -> str:
    """Hex digest of the resolved config (or its resolved container, left as it is) minus
    VOLATILE_KEYS (and `ignore`): the identity of an experiment."""
    container = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)
    at_default = tuple(key for key, default in ADDED_KEYS.items() if _get(container, _parts(key), default) == default)
    container = _pruned(container, _key_tree((*VOLATILE_KEYS, *ignore, *at_default)))
    positions = (container.get("model") or {}).get("positions") if isinstance(container, dict) else None
    if isinstance(positions, dict):
        container = {**container, "model": {**container["model"], "positions": {**FLAT_POSITIONS, **positions}}}
    canonical = json.dumps(container, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def _get(tree: Any, parts: tuple[str, ...] | list[str], missing: Any) -> Any:
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return missing
        tree = tree[part]
    return tree


def _select(container: dict, key: str) -> Any:
    """OmegaConf.select(cfg, key, default=None) on the resolved container of cfg: a missing value is None."""
    value = _get(container, key.split("."), None)
    return None if value == "???" else value


@functools.lru_cache(maxsize=1024)
def _parts(key: str) -> tuple[str, ...]:
    return tuple(key.split("."))


@functools.lru_cache(maxsize=256)
def _key_tree(keys: tuple[str, ...]) -> dict:
    """Dotted `keys` as a tree, part -> subtree, None where a whole key goes (config_hash's, built
    once for a sweep's thousands of points, not once a point)."""
    tree: dict = {}
    for key in keys:
        node = tree
        *inner, last = _parts(key)
        for part in inner:
            if part in node and node[part] is None:  # a key around this one goes whole
                break
            node = node.setdefault(part, {})
        else:
            node[last] = None
    return tree


def _pruned(tree: Any, keys: dict) -> Any:
    """`tree` less the keys of `keys` (a _key_tree), copying only the mappings on their paths
    (`tree` stays as it is)."""
    if not isinstance(tree, dict) or not any(part in tree for part in keys):
        return tree
    out = {}
    for part, value in tree.items():
        if part in keys:
            if keys[part] is None:
                continue
            value = _pruned(value, keys[part])
        out[part] = value
    return out


class RunLookup:
    """What the run directories' parents hold, each read once: the names in it, and the runs
    extended in place there by their configs' hashes. Resolving the thousands of points of a sweep
    under one directory then lists it once, not once a point. A snapshot: for one resolution pass."""

    def __init__(self) -> None:
        self._names: dict[Path, set[str]] = {}
        self._extended: dict[Path, dict[str, Path]] = {}

    def exists(self, path: Path) -> bool:
        return path.name in self._listed(path.parent) and path.exists()

    def is_dir(self, path: Path) -> bool:
        return path.name in self._listed(path.parent) and path.is_dir()

    def extended(self, parent: Path, digest: str) -> Path | None:
        """The run under `parent` extended in place (EXTENDED) whose saved config hashes to `digest`."""
        if parent not in self._extended:
            found: dict[str, Path] = {}
            for marker in sorted(parent.glob(f"*/{EXTENDED}")):
                saved = _saved_hash(marker.parent)
                if saved is not None:
                    found.setdefault(saved, marker.parent)
            self._extended[parent] = found
        return self._extended[parent].get(digest)

    def _listed(self, parent: Path) -> set[str]:
        if parent not in self._names:
            try:
                self._names[parent] = set(os.listdir(parent))
            except OSError:  # no such directory yet (or not one)
                self._names[parent] = set()
        return self._names[parent]


def run_directory(cfg: DictConfig | dict, runs: RunLookup | None = None) -> Path:
    """``<logging.root>/<name>/<slug>-<hash8>``: the same resolved config gives the same directory.

    The slug makes directories readable (``<task>-<position scheme>``, with Shaw's k and the model
    family when it is not the encoder-decoder); the hash makes them unique. Missing keys fall back to
    defaults, so small configs work too. A run started before the slug named the model family
    (relpos-lab < 0.2) keeps its directory: found under the old slug, it resumes there. `runs`: the
    disk as read for many configs at once (a sweep's points); by default it is read now. `cfg` may
    be a resolved container (what OmegaConf.to_container(cfg, resolve=True) gives).
    """
    runs = runs or RunLookup()
    container = cfg if isinstance(cfg, dict) else OmegaConf.to_container(cfg, resolve=True)
    parent = Path(_select(container, "logging.root") or "runs") / slugify(str(_select(container, "name") or "default"))
    slug, slug_before = _run_slug(container), _run_slug(container, family=False)
    digest = config_hash(container)
    path, before = parent / f"{slug}-{digest}", parent / f"{slug_before}-{digest}"
    if before != path and runs.is_dir(before) and not runs.exists(path):
        return before
    if not runs.exists(path):  # a run extended to this budget lives under its first budget's name
        return runs.extended(parent, digest) or path
    return path


def budget_of(cfg: DictConfig) -> dict[str, Any]:
    """The values of BUDGET_KEYS in `cfg` (None where a key is missing)."""
    return {key: OmegaConf.select(cfg, key, default=None) for key in BUDGET_KEYS}


def budget_siblings(cfg: DictConfig) -> list[Path]:
    """Run directories beside `cfg`'s holding an attempt (has_attempt) of a config that equals `cfg`
    but for BUDGET_KEYS: the runs `train --extend` can continue. Only directories with the same slug
    (task, scheme, ...) are read, each one's config.yaml once."""
    own = run_directory(cfg)
    parent, digest = own.parent, config_hash(cfg, ignore=BUDGET_KEYS)
    container = OmegaConf.to_container(cfg, resolve=True)
    slugs = {_run_slug(container), _run_slug(container, family=False)}
    found = []
    for candidate in sorted(p for slug in slugs for p in parent.glob(f"{slug}-*")):
        if (candidate != own and candidate.is_dir() and ".old-" not in candidate.name and has_attempt(candidate)
                and _saved_hash(candidate, ignore=BUDGET_KEYS) == digest):
            found.append(candidate)
    return found


def saved_config(run_dir: Path) -> DictConfig | None:
    """A run directory's config.yaml, or None when it has none or it cannot be read."""
    try:
        return OmegaConf.load(run_dir / "config.yaml")
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):
        return None


def _saved_hash(run_dir: Path, ignore: tuple[str, ...] = ()) -> str | None:
    saved = saved_config(run_dir)
    return None if saved is None else config_hash(saved, ignore=ignore)



def _run_slug(container: dict, family: bool = True) -> str:
    """``<task>-<scheme>[-k<k>][-rand<n>[eval]][-<architecture>]`` of a resolved config's container."""
    parts = [_select(container, "task.name")]
    scheme = _select(container, "model.positions.scheme")
    parts.append(scheme)
    if scheme == "shaw":
        k = _select(container, "model.positions.max_distance")
        parts.append(None if k is None else f"k{k}")
    randomized = _select(container, "model.positions.max_random_len")
    if randomized is not None:
        at_eval = _select(container, "model.positions.randomize_at_eval") or False
        parts.append(f"rand{randomized}" + ("eval" if at_eval else ""))
    architecture = _select(container, "model.architecture")
    if family and architecture not in (None, ADDED_KEYS["model.architecture"]):
        parts.append(architecture)
    slug = "-".join(slugify(str(p)) for p in parts if p is not None)
    return slug or "run"



def slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-.") or "x"



def save_resolved_config(cfg: DictConfig, run_dir: str | Path) -> Path:
    """Write ``run_dir/config.yaml`` with every interpolation resolved: what actually ran."""
    path = Path(run_dir) / "config.yaml"
    atomic_write(path, OmegaConf.to_yaml(cfg, resolve=True))
    return path



def writable_directory(directory: str | Path, elsewhere: str) -> Path:
    """`directory`, made if it is missing, or a one-line UserError if nothing can be written there
    (a read-only run directory or file system, permissions, a file in the way), naming the directory
    and `elsewhere`: the option that writes to another. For commands that write into a finished
    run (`eval`, `inspect`), before they compute anything."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # names the directory that could not be made (or the file in the way)
        raise UserError(f"cannot write {shown_path(err.filename or directory)}: {err.strerror or err}; "
                        f"{elsewhere}") from None
    try:
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as err:  # names a temporary file: name the directory
        raise UserError(f"cannot write {shown_path(directory)}: {err.strerror or err}; {elsewhere}") from None
    return directory


# What an attempt at training leaves in a run directory. config.yaml and slurm/ are not among them:
# `submit` writes those before the job has started.
ATTEMPT_FILES = ("results.json", "metrics.csv", "checkpoints", "wandb", "hpc_ckpt_*.ckpt")


def has_attempt(run_dir: str | Path) -> bool:
    """Whether training already ran in `run_dir` (finished or not)."""
    run_dir = Path(run_dir)
    return any(any(run_dir.glob(pattern)) for pattern in ATTEMPT_FILES)


def discard_untrained_attempt(run_dir: str | Path) -> bool:
    """Remove the W&B run of a fresh attempt that failed before it logged or saved a step (a plugin
    that breaks its contract at the first step), and say whether there was nothing else. It holds
    nothing to resume or compare, and left in place it made every retry move the directory aside
    to an ``.old-<time>`` directory. Only for an attempt that started the directory from scratch:
    its wandb/ is then its own."""
    run_dir = Path(run_dir)
    if any(any(run_dir.glob(pattern)) for pattern in ATTEMPT_FILES if pattern != "wandb"):
        return False
    shutil.rmtree(run_dir / "wandb", ignore_errors=True)
    return True


def move_aside(run_dir: str | Path) -> Path:
    """Rename `run_dir` to ``<run dir>.old-<time>`` (never deleting anything) and return the new path."""
    run_dir = Path(run_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = run_dir.with_name(f"{run_dir.name}.old-{stamp}"), 1
    while target.exists():
        n += 1
        target = run_dir.with_name(f"{run_dir.name}.old-{stamp}-{n}")
    os.rename(run_dir, target)
    return target
