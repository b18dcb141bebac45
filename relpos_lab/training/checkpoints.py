"""Checkpoints: where a run keeps them, how they are written (atomically), which one a run resumes
from, how a checkpoint alone rebuilds its config and task (for `relpos-lab eval` and `translate`),
and whether its weights fit the model a config builds (checked before anything is loaded or written)."""
from __future__ import annotations

import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf
from torch import nn

from relpos_lab.api import registry
from relpos_lab.api.errors import PROG, UserError, shown_path
from relpos_lab.api.files import atomic_write_with
from relpos_lab.api.task import Task
from relpos_lab.config import config_from_container
from relpos_lab.training.module import TASK_STATE

CHECKPOINTS = "checkpoints"
LAST = "last.ckpt"


def checkpoint_config(checkpoint: Path) -> dict:
    """The experiment config saved in a checkpoint by RelposModule."""
    return _config_of(load_checkpoint(checkpoint), checkpoint)



def task_from_checkpoint(checkpoint: str | Path, overrides: list[str] = (),
                         state: dict | None = None) -> tuple[DictConfig, Task]:
    """The config (with `overrides` on top) and the task of a checkpoint, with the task's saved
    state (say, its subword model) restored: the checkpoint alone rebuilds them. `state`: the
    checkpoint's contents where the caller has read them already (a command reads it once)."""
    checkpoint = Path(checkpoint)
    state = state if state is not None else load_checkpoint(checkpoint)
    cfg = config_from_container(_config_of(state, checkpoint), f"config of {checkpoint}", list(overrides))
    task = registry.create_task(OmegaConf.to_object(cfg.task), seed=cfg.seed)
    task.load_state_dict(state.get(TASK_STATE) or {})
    return cfg, task



def check_weights_fit(checkpoint: Path, state: dict, module: nn.Module, cfg: DictConfig, fix: str) -> None:
    """Refuse in one line a checkpoint whose weights do not fit `module` (another width, vocabulary,
    scheme), naming the first weights that differ, the config keys behind them and `fix`.

    Lightning would find out only inside `fit` / `test`, with a size-mismatch traceback, after a
    resume had already cut metrics.csv back and logged W&B rows again: the check comes first.
    """
    saved, built = state.get("state_dict") or {}, module.state_dict()
    differences = [f"{key} is {_shape(saved[key])} in the checkpoint, {_shape(built[key])} in the model"
                   for key in built if key in saved and saved[key].shape != built[key].shape]
    differences += [f"{key} is only in the model" for key in built if key not in saved]
    differences += [f"{key} is only in the checkpoint" for key in saved if key not in built]
    if not differences:
        return
    shown = "; ".join(differences[:FIT_SHOWN]) + (f" (and {len(differences) - FIT_SHOWN} more)"
                                                 if len(differences) > FIT_SHOWN else "")
    changed = _changed_keys(_config_of(state, checkpoint), OmegaConf.to_container(cfg, resolve=True))
    keys = (" The config differs from the checkpoint's in " + ", ".join(changed[:FIT_SHOWN])
            + (f" (and {len(changed) - FIT_SHOWN} more)" if len(changed) > FIT_SHOWN else "") + ".") if changed else ""
    raise UserError(f"{shown_path(checkpoint)} does not fit the model this config builds: {shown}.{keys} {fix}")


FIT_SHOWN = 3  # weights (and config keys) a refused checkpoint names; the rest are counted
OVERRIDES_FIX = ("Drop the overrides that change the model's shape (overrides of a trained checkpoint may change "
                 "lengths, sizes and decoding, not the model)")
"""The fix for `eval`, `inspect`, `translate` and `generate`: they rebuild a checkpoint's own model."""


def _shape(tensor: torch.Tensor) -> str:
    return str(tuple(tensor.shape))


def _changed_keys(saved: dict, current: dict, sections: tuple[str, ...] = ("model", "task")) -> list[str]:
    """`model.d_model 48 -> 16`: the keys of the sections that shape a model whose values differ."""
    def leaves(node, prefix: str) -> dict[str, Any]:
        if not isinstance(node, dict):
            return {prefix: node}
        return {k: v for key, child in node.items() for k, v in leaves(child, f"{prefix}.{key}").items()}

    changed = []
    for section in sections:
        before, after = leaves(saved.get(section, {}), section), leaves(current.get(section, {}), section)
        changed += [f"{key} {before.get(key)!r} -> {after.get(key)!r}" for key in dict.fromkeys([*before, *after])
                    if before.get(key) != after.get(key)]
    return changed


def load_checkpoint(checkpoint: Path) -> dict:
    """A checkpoint's contents (tensors memory-mapped), or a UserError saying why not.

    torch.save writes a zip archive, which can be memory-mapped; any other file is read without
    mmap (a file saved in torch's legacy format still loads), so a file that is no checkpoint at
    all is reported as such, not with torch's advice to re-save it for mmap.
    """
    if not checkpoint.is_file():
        raise UserError(f"checkpoint not found: {checkpoint}")
    try:
        return _read(checkpoint)
    except _Unreadable as err:
        raise UserError(f"{shown_path(checkpoint)} is not a checkpoint torch can read ({err}); give a .ckpt file "
                        f"written by `{PROG} train`, e.g. runs/<name>/<run>/checkpoints/last.ckpt") from None


class _Unreadable(Exception):
    """torch.load failed; the message is the reason, shortened."""


def _read(checkpoint: Path) -> dict:
    try:
        return torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=zipfile.is_zipfile(checkpoint))
    except Exception as err:
        first = str(err).strip().split("\n")[0].split(". ")[0].rstrip(".")  # torch's messages run on
        raise _Unreadable(f"torch.load: {type(err).__name__}" + (f": {first}" if first else "")) from None



def _config_of(state: dict, checkpoint: Path) -> dict:
    try:
        return state["hyper_parameters"]["config"]
    except (KeyError, TypeError):
        raise UserError(f"{checkpoint}: not a relpos-lab checkpoint (no config in its hyperparameters)") from None



def checkpoints_of(run_dir: Path) -> list[Path]:
    """A run's checkpoints, newest first: last.ckpt, a SLURM requeue's hpc_ckpt_*.ckpt, best-step=*.ckpt."""
    found = [run_dir / CHECKPOINTS / LAST, *run_dir.glob("hpc_ckpt_*.ckpt"),
             *(run_dir / CHECKPOINTS).glob("best-step=*.ckpt")]
    return sorted((p for p in found if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True)


def resume_checkpoint(run_dir: Path, warn: Callable[[str], None] | None = None) -> Path | None:
    """The newest checkpoint that can be read, to continue from; None if there is none.

    A newest checkpoint that cannot be read (cut short by a full disk or a copy, corrupted) is
    skipped with one line through `warn` (default: a warning), and the next newest is used.
    """
    for checkpoint in checkpoints_of(run_dir):
        try:
            state = _read(checkpoint)
            if not isinstance(state, dict) or not isinstance(state.get("global_step"), int) or "loops" not in state:
                raise _Unreadable("not a training checkpoint: no global step or loop state")
            return checkpoint
        except _Unreadable as err:
            (warn or _warn)(f"skipping unreadable checkpoint: {shown_path(checkpoint)} ({err}); "
                            "trying the one before it")
    return None


def _warn(message: str) -> None:
    warnings.warn(message, stacklevel=3)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch.save checkpoints, written atomically beside their destination.

    Lightning's own "atomic" save goes through an fsspec transaction whose temporary file is in
    the system's temp directory; moving it into a run directory on another file system is a copy,
    so an interrupt or a crash during that copy leaves a truncated checkpoint. Here the file is
    written next to its destination, flushed to disk and renamed over it: an interrupted write
    leaves the previous checkpoint intact (and at most a hidden ``.<name>.*.tmp`` file).
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        atomic_write_with(Path(path), lambda file: torch.save(checkpoint, file))



def global_step_of(checkpoint: Path) -> int | None:
    if not checkpoint.is_file():
        return None
    return load_checkpoint(checkpoint).get("global_step")

