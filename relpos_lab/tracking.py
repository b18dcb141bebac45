"""Where a run's record lives: the run directory, its files, and the loggers that fill it.

The run directory (DESIGN.md, contract 3) is a deterministic function of the resolved config:
``<logging.root>/<name>/<slug>-<hash8>``. A requeued SLURM job or a re-launched command therefore
finds its own checkpoint and metrics again — never a timestamp in the path. Everything a run leaves
behind goes there: ``config.yaml`` (resolved), ``metrics.csv``, ``results.json``, ``plots/*.png``,
the checkpoints, and the offline W&B run under ``wandb/`` (whose id is derived from the directory,
so a resumed run continues the same W&B run).

W&B is offline unless online mode is asked for (config, ``WANDB_MODE``) or an API key is
available; it is a second copy of what the directory holds, so its failures are warnings, never
fatal (see loggers.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import netrc
import os
import re
import subprocess
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, WandbLogger
from omegaconf import DictConfig, OmegaConf

from .loggers import RunCSVLogger, RunWandbLogger
from .plots import plot_curves

__all__ = [
    "VOLATILE_KEYS",
    "atomic_write",
    "LoggingConfig",
    "WandbConfig",
    "build_loggers",
    "close_loggers",
    "config_hash",
    "log_samples",
    "plot_by_length",
    "plot_curves",
    "resolve_wandb_mode",
    "run_directory",
    "save_resolved_config",
    "wandb_run_id",
    "write_results",
]

WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class WandbConfig:
    mode: str = "offline"
    """offline | online | disabled; see resolve_wandb_mode"""
    project: str = "relpos_lab"
    """W&B project"""
    entity: str | None = None
    """W&B entity (user or team); None: your default"""
    group: str | None = None
    """default: the experiment (or sweep) name, cfg.name"""
    tags: list[str] = field(default_factory=list)
    """W&B tags of the run"""


@dataclass
class LoggingConfig:
    root: str = "runs"
    """run directories go to <root>/<name>/<slug>-<hash8>"""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases tracking"""
    num_samples: int = 8
    """sample predictions shown per evaluation (W&B table)"""


# Keys that do not change what a run computes, left out of the run directory's hash so that
# changing them continues the same run instead of starting another: where files go and how they
# are reported (logging), whether to resume (resume), where and how SLURM runs the job (cluster:
# partition, time limit, ...; the world size it implies is in trainer.devices / num_nodes, which
# stay in), the trainer's display and reporting switches, and how often last.ckpt is refreshed.
# Anything that can change the numbers stays in — even num_sanity_val_steps, whose extra pass
# over the validation loader draws from the global RNG.
VOLATILE_KEYS: tuple[str, ...] = (
    "resume",
    "logging",
    "cluster",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "trainer.log_every_n_steps",
    "trainer.checkpoint_every_n_steps",
)


# --- run directory ------------------------------------------------------------------------------


def config_hash(cfg: DictConfig, length: int = 8, ignore: tuple[str, ...] = ()) -> str:
    """Hex digest of the resolved config minus VOLATILE_KEYS (and `ignore`): the identity of an experiment."""
    container = OmegaConf.to_container(cfg, resolve=True)
    for key in (*VOLATILE_KEYS, *ignore):
        _drop(container, key.split("."))
    canonical = json.dumps(container, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:length]


def _drop(tree: Any, parts: list[str]) -> None:
    if not isinstance(tree, dict) or parts[0] not in tree:
        return
    if len(parts) == 1:
        del tree[parts[0]]
    else:
        _drop(tree[parts[0]], parts[1:])


def run_directory(cfg: DictConfig) -> Path:
    """``<logging.root>/<name>/<slug>-<hash8>``: the same resolved config gives the same directory.

    The slug makes directories readable (``<task>-<position scheme>``, with Shaw's k); the hash
    makes them unique. Missing keys fall back to defaults, so small configs work too.
    """
    root = OmegaConf.select(cfg, "logging.root", default=None) or "runs"
    name = _slugify(str(OmegaConf.select(cfg, "name", default=None) or "default"))
    return Path(root) / name / f"{_run_slug(cfg)}-{config_hash(cfg)}"


def _run_slug(cfg: DictConfig) -> str:
    parts = [OmegaConf.select(cfg, "task.name", default=None)]
    scheme = OmegaConf.select(cfg, "model.positions.scheme", default=None)
    parts.append(scheme)
    if scheme == "shaw":
        k = OmegaConf.select(cfg, "model.positions.max_distance", default=None)
        parts.append(None if k is None else f"k{k}")
    slug = "-".join(_slugify(str(p)) for p in parts if p is not None)
    return slug or "run"


def _slugify(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "-", text).strip("-.") or "x"


# --- files of the run directory -----------------------------------------------------------------


def save_resolved_config(cfg: DictConfig, run_dir: str | Path) -> Path:
    """Write ``run_dir/config.yaml`` with every interpolation resolved: what actually ran."""
    path = Path(run_dir) / "config.yaml"
    atomic_write(path, OmegaConf.to_yaml(cfg, resolve=True))
    return path


def write_results(
    run_dir: str | Path,
    metrics: Mapping[str, Any],
    by_length: Mapping[str, Mapping[Any, Mapping[str, Any]]] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``run_dir/results.json``: ``{"metrics": ..., "by_length": ..., **extra}``.

    The file is what sweeps and users' scripts read, so bad numbers are refused here rather than
    found later: every metric must be a finite real (0-d tensors from torchmetrics are accepted and
    converted). Lengths become JSON's string keys. Written atomically, so a reader never sees half a
    file and a kill mid-write leaves the previous results intact.
    """
    results: dict[str, Any] = {"metrics": _numbers(metrics, "metrics")}
    if by_length is not None:
        results["by_length"] = {
            str(split): {
                str(_as_length(length, f"by_length[{split!r}]")):
                    _numbers(row, f"by_length[{split!r}][{length!r}]")
                for length, row in lengths.items()
            }
            for split, lengths in by_length.items()
        }
    for key, value in (extra or {}).items():
        if key in results or key == "by_length":
            raise ValueError(f"write_results: extra key {key!r} would overwrite the {key!r} section")
        results[key] = value
    try:
        text = json.dumps(results, indent=2, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"write_results: extra is not strict JSON ({err})") from None
    path = Path(run_dir) / "results.json"
    atomic_write(path, text + "\n")
    return path


def _numbers(values: Mapping[str, Any], where: str) -> dict[str, float | int]:
    if not isinstance(values, Mapping):
        raise ValueError(f"write_results: {where} must be a mapping of metric name to number, got {values!r}")
    return {str(name): _number(value, f"{where}[{name!r}]") for name, value in values.items()}


def _number(value: Any, where: str) -> float | int:
    if hasattr(value, "item") and not isinstance(value, (bool, Real)):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # a tensor/array with more than one element
            pass
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"write_results: {where} = {value!r} is not a number")
    if isinstance(value, Integral):
        return int(value)
    if not math.isfinite(value):
        raise ValueError(f"write_results: {where} = {value!r} is not finite")
    return float(value)


def _as_length(length: Any, where: str) -> int:
    try:
        if isinstance(length, bool) or int(length) != float(length):
            raise ValueError
        return int(length)
    except (TypeError, ValueError):
        raise ValueError(f"write_results: {where} has length key {length!r}, not an integer") from None


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write a file so that readers (and a crash) see the old content or the new, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# --- loggers ------------------------------------------------------------------------------------


def resolve_wandb_mode(configured: str = "offline") -> str:
    """The W&B mode a run uses: offline unless the user asked for online.

    ``online`` or ``disabled`` in the config is an explicit choice and wins. The default
    ``offline`` yields to the ``WANDB_MODE`` environment variable (so ``WANDB_MODE=online`` on a
    cluster works without editing configs), then to an available API key (``WANDB_API_KEY`` or a
    ``wandb login`` entry in ~/.netrc) meaning online, and otherwise stays offline — never
    attempting the network on a machine that has none.
    """
    if configured not in WANDB_MODES:
        raise ValueError(f"logging.wandb.mode={configured!r} is not one of {', '.join(WANDB_MODES)}")
    if configured != "offline":
        return configured
    env = os.environ.get("WANDB_MODE")
    if env:
        return {"dryrun": "offline", "run": "online"}.get(env, env)
    return "online" if _has_api_key() else "offline"


def _has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_run_id(run_dir: str | Path) -> str:
    """W&B run id of a run directory: a hash of its absolute path, so a resume keeps the id.

    The directory name alone would not do: the same config run under two roots (say a copy on a
    laptop and on the cluster) is two runs, and must not append to one W&B run.
    """
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def build_loggers(cfg: DictConfig, run_dir: str | Path) -> list[Logger]:
    """The loggers of a run: CSV into ``run_dir/metrics.csv`` first, then W&B (unless disabled).

    CSV comes first because Lightning takes its default checkpoint and log directory from the
    first logger, which makes them ``run_dir/checkpoints`` and ``run_dir``. If W&B cannot even be
    set up (not installed, bad settings) the run goes on with CSV alone and a warning.
    """
    run_dir = Path(run_dir)
    loggers: list[Logger] = [RunCSVLogger(run_dir)]
    mode = resolve_wandb_mode(OmegaConf.select(cfg, "logging.wandb.mode", default="offline"))
    if mode == "disabled":
        return loggers
    name = OmegaConf.select(cfg, "name", default=None)
    try:
        loggers.append(
            RunWandbLogger(
                run_config={**OmegaConf.to_container(cfg, resolve=True), **_provenance(run_dir)},
                save_dir=str(run_dir),
                id=wandb_run_id(run_dir),
                name=run_dir.name,
                project=OmegaConf.select(cfg, "logging.wandb.project", default="relpos_lab"),
                entity=OmegaConf.select(cfg, "logging.wandb.entity", default=None),
                group=OmegaConf.select(cfg, "logging.wandb.group", default=None) or name,
                job_type=OmegaConf.select(cfg, "task.name", default=None),
                tags=list(OmegaConf.select(cfg, "logging.wandb.tags", default=None) or []),
                mode=mode,
            )
        )
    except Exception as err:  # e.g. ModuleNotFoundError when wandb is not installed
        warnings.warn(f"W&B logging is off ({type(err).__name__}: {err}); the run continues with CSV only")
    return loggers


def close_loggers(loggers: Iterable[Logger]) -> None:
    """Finish the W&B run(s) of `loggers` at the end of a command (fit, test and all).

    Interpreter exit would also finish them; closing explicitly lets one process run several
    experiments one after another (a local sweep, the tests) with each W&B run complete.
    """
    for logger in loggers:
        if isinstance(logger, RunWandbLogger):
            logger.close()


SLURM_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NAME", "SLURM_CLUSTER_NAME")


def _provenance(run_dir: Path) -> dict[str, Any]:
    """What ran, where: the run directory, git commit of the code, and SLURM ids, for W&B's config."""
    info: dict[str, Any] = {"run_dir": str(run_dir.resolve())}
    info.update(_git_state())
    slurm = {key.removeprefix("SLURM_").lower(): os.environ[key] for key in SLURM_VARS if key in os.environ}
    if slurm:
        info["slurm"] = slurm
    return {"provenance": info}


def _git_state() -> dict[str, Any]:
    """Commit (and whether the tree had uncommitted changes) of the checkout holding this code.

    Looks beside the installed package first (an editable install in the researcher's clone),
    then in the working directory. Empty when neither is a git checkout with a commit.
    """
    for where in (Path(__file__).resolve().parent, Path.cwd()):
        try:
            commit = subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
            )
            if commit.returncode != 0:
                continue
            status = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=where, capture_output=True, text=True, timeout=10,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        return {"git_commit": commit.stdout.strip(), "git_dirty": bool(status.stdout.strip())}
    return {}


# --- what people look at: per-length curves and sample predictions ------------------------------


def plot_by_length(
    run_dir: str | Path,
    by_length: Mapping[str, Mapping[Any, Mapping[str, Any]]],
    train_range: tuple[int, int] | None,
    loggers: Iterable[Logger] = (),
    title: str | None = None,
) -> list[Path]:
    """Plot each per-length metric against length, one line per split, as PNG and W&B line plot.

    `by_length` is results.json's ``{split: {length: {metric: value}}}``. One figure per metric
    (accuracy and exact match side by side would share an axis, a loss would not), saved as
    ``run_dir/plots/by_length_<metric>.png``; the same data goes to each W&B logger as a line plot
    ``by_length/<metric>`` (with its table, so the chart can be edited in the W&B UI).
    """
    metrics = sorted({m for lengths in by_length.values() for row in lengths.values() for m in row})
    paths = []
    for metric in metrics:
        curves = {
            split: {length: row[metric] for length, row in lengths.items() if metric in row}
            for split, lengths in by_length.items()
        }
        curves = {split: points for split, points in curves.items() if points}
        heading = f"{title}: {metric}" if title else f"{metric} by length"
        path = Path(run_dir) / "plots" / f"by_length_{_slugify(metric)}.png"
        paths.append(plot_curves(curves, path, train_range=train_range, ylabel=metric, title=heading))
        _wandb_line(loggers, metric, curves, heading)
    return paths


def _wandb_line(loggers: Iterable[Logger], metric: str, curves: Mapping, title: str) -> None:
    for logger in _wandb_loggers(loggers):
        try:
            import wandb

            rows = [[split, int(length), float(v)] for split, pts in curves.items() for length, v in pts.items()]
            table = wandb.Table(columns=["split", "length", metric], data=rows)
            chart = wandb.plot.line(table, x="length", y=metric, stroke="split", title=title)
            logger.log_metrics({f"by_length/{metric}": chart})
        except Exception as err:
            warnings.warn(f"W&B: could not log the by-length plot of {metric!r} ({type(err).__name__}: {err})")


def log_samples(
    loggers: Iterable[Logger], key: str, columns: list[str], rows: list[list[Any]], step: int | None = None
) -> None:
    """Log sample predictions as a W&B table under `key`; nothing without W&B, and never raises.

    Looking at a handful of inputs, targets and predictions is how one catches a model that
    copies instead of reversing; it is a convenience, so a failure here is only a warning.
    """
    for logger in _wandb_loggers(loggers):
        try:
            logger.log_table(key, columns=list(columns), data=[list(row) for row in rows], step=step)
        except Exception as err:
            warnings.warn(f"W&B: could not log the sample table {key!r} ({type(err).__name__}: {err})")


def _wandb_loggers(loggers: Iterable[Logger]) -> list[WandbLogger]:
    return [lg for lg in loggers if isinstance(lg, WandbLogger) and not getattr(lg, "failed", False)]
